"""`Secrets` on a folder with one file per secret: `~/.spotrain/secrets` locally, a
Kubernetes Secret mounted as a folder on GKE (each key a file). A team's secrets are in a
folder of its name (`~/.spotrain/secrets/vision/hf-token`; on GKE, a Secret per team
mounted there): a job reads its own team's, never another's. Without teams, the folder's
own files are everyone's."""

from __future__ import annotations

import asyncio
from pathlib import Path


class SecretFiles:
    def __init__(self, folder: Path) -> None:
        self._folder = folder

    async def value(self, name: str, team: str | None) -> str | None:
        # The name is the catalogue's SecretName and the team a Name (no slash, no leading
        # dot): a file of the team's folder, never one outside it.
        path = (self._folder / team if team is not None else self._folder) / name
        try:
            text = await asyncio.to_thread(path.read_text)
        except (FileNotFoundError, IsADirectoryError):
            return None
        # A file written with `echo` ends in a newline that is not part of the secret.
        return text.removesuffix("\n")
