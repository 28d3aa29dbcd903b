"""`Secrets` on a folder with one file per secret: `~/.spotrain/secrets` locally, a
Kubernetes Secret mounted as a folder on GKE (each key a file)."""

from __future__ import annotations

import asyncio
from pathlib import Path


class SecretFiles:
    def __init__(self, folder: Path) -> None:
        self._folder = folder

    async def value(self, name: str) -> str | None:
        # The name is the catalogue's SecretName (no slash, no leading dot): a file of the
        # folder itself, never one outside it.
        path = self._folder / name
        try:
            text = await asyncio.to_thread(path.read_text)
        except (FileNotFoundError, IsADirectoryError):
            return None
        # A file written with `echo` ends in a newline that is not part of the secret.
        return text.removesuffix("\n")
