"""What job code may not see on a secure local stack, and the command that runs a Ray node
so (see `confine.py`, the script that does it).

Every job runs in a Ray node's process tree, and the local stack runs as one OS user, so
by default a job reads what the stack reads. A secure stack started by root runs its Ray
nodes confined: the stack's private folders are empty to them, the platform's code is
read-only, and no capability is left to undo either. Elsewhere (not root, or no
`unshare`) the stack says that its jobs are not confined.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import shared
from shared.localstack import confine
from shared.localstack.settings import LocalStackSettings

PRIVATE_FOLDERS = ("nats-auth", "nats", "workspaces", "logs", "run")
"""The stack home's folders that job code may not read: every role's NATS credentials and
the people file, the NATS store (events carry `--env` values), the submitter's unpacked
workspaces (everyone's code), the stack's logs, its process records."""

TOOLS = ("unshare", "mount", "setpriv")


@dataclass(frozen=True)
class Confinement:
    hidden: tuple[Path, ...]
    read_only: tuple[Path, ...]
    writable: tuple[Path, ...]

    def argv(self, command: Sequence[str]) -> list[str]:
        options = [
            *(item for path in self.hidden for item in ("--hide", str(path))),
            *(item for path in self.read_only for item in ("--read-only", str(path))),
            *(item for path in self.writable for item in ("--writable", str(path))),
        ]
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            sys.executable,
            str(Path(confine.__file__)),
            *options,
            "--",
            *command,
        ]


def _outermost(paths: Iterable[Path]) -> tuple[Path, ...]:
    """Each path once, none inside another of them (the outer one covers it)."""
    unique = sorted(set(paths), key=lambda path: len(path.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return tuple(kept)


def jobs_confinement(
    settings: LocalStackSettings,
    *,
    secrets_dir: Path,
    user_home: Path,
    code: Sequence[Path],
) -> Confinement:
    """The view of job code: the stack home's private folders, the submitter's secrets and
    the user's own `~/.spotrain` hidden (unless the stack lives in it); `code` read-only;
    the checkpoint root writable wherever it lies."""
    home = settings.home.resolve()
    hidden = [home / name for name in PRIVATE_FOLDERS]
    hidden += [server.store_dir.resolve() for server in settings.nats]  # a cluster's, each
    hidden.append(secrets_dir.resolve())
    users_own = (user_home / ".spotrain").resolve()
    if not home.is_relative_to(users_own):
        hidden.append(users_own)
    checkpoints = settings.checkpoint_dir.resolve()
    needed = (checkpoints, settings.ray_token_file.resolve())
    hidden = [
        path
        for path in hidden
        if not any(keep.is_relative_to(path) for keep in needed)  # never hide what Ray needs
    ]
    return Confinement(
        hidden=_outermost(hidden),
        read_only=_outermost(path.resolve() for path in code),
        writable=(checkpoints,),
    )


def can_confine() -> bool:
    """Root, with the tools: a mount namespace needs CAP_SYS_ADMIN."""
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in TOOLS)


def confinement_for(settings: LocalStackSettings, env: Mapping[str, str]) -> Confinement | None:
    """How this stack's Ray nodes run: confined on a secure stack that can be, else None."""
    if not settings.is_secure or not can_confine():
        return None
    secrets_dir = env.get("SPOTRAIN_SUBMITTER_SECRETS_DIR")
    user_home = Path.home()
    project = Path(shared.__file__).resolve().parent.parent
    return jobs_confinement(
        settings,
        secrets_dir=Path(secrets_dir) if secrets_dir else user_home / ".spotrain" / "secrets",
        user_home=user_home,
        code=(project, Path(sys.prefix), Path(sys.base_prefix)),
    )
