"""Runs a command as job code runs on a secure local stack: in a mount namespace of its
own, where the stack's private folders are empty and the platform's code is read-only,
and with no capabilities, so that it can neither undo that nor reach past it.

    unshare --mount --propagation private -- \\
        python confine.py [--hide P]... [--read-only P]... [--writable P]... -- ray start ...

The local stack runs as one OS user: a Ray node, and so every job on it, is that user.
Without capabilities that user still reads and writes its own files, except where this
namespace covers them:

- `--hide`: an empty folder no one may open, over the NATS credentials and store, the
  submitter's secrets and workspaces, the stack's logs and process records;
- `--read-only`: the project's code and the Python it runs with, which the stack's own
  processes import (a job that rewrote them would run as the stack next time);
- `--writable`: what a job must still write under those (its checkpoints).

Without CAP_SYS_ADMIN nothing here can be unmounted. Without CAP_SYS_PTRACE, the stack's
processes (which keep their capabilities) are out of reach through /proc: their
environment, open files and root folder, which would lead back to what is hidden.

Standard library only, and run as a plain script: it starts with every Ray node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, stdin=subprocess.DEVNULL)


def _parse(argv: list[str]) -> tuple[dict[str, list[Path]], list[str]]:
    if "--" not in argv:
        raise SystemExit("confine: usage: confine.py [--hide P]... -- COMMAND...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    paths: dict[str, list[Path]] = {"--hide": [], "--read-only": [], "--writable": []}
    if len(options) % 2 or not command:
        raise SystemExit("confine: each option takes one path, and a command follows --")
    for flag, value in zip(options[::2], options[1::2], strict=True):
        if flag not in paths:
            raise SystemExit(f"confine: unknown option {flag}")
        paths[flag].append(Path(value))
    return paths, command


def confine(hide: list[Path], read_only: list[Path], writable: list[Path]) -> None:
    """Cover the namespace's view: run in a mount namespace of this process's own."""
    for path in hide:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        _mount("-t", "tmpfs", "-o", "size=4k,nr_inodes=2,mode=000", "confined", str(path))
    for path in read_only:
        # Recursive: a hidden folder under it stays covered.
        _mount("--rbind", str(path), str(path))
        _mount("-o", "remount,bind,ro", str(path))
    for path in writable:
        if any(path.is_relative_to(parent) for parent in read_only):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            _mount("--bind", str(path), str(path))
            _mount("-o", "remount,bind,rw", str(path))


def main(argv: list[str]) -> int:
    paths, command = _parse(argv)
    confine(paths["--hide"], paths["--read-only"], paths["--writable"])
    # Every capability dropped for good: the bounding set empties what an exec may gain,
    # and no-new-privs what a set-user-id program may.
    os.execvp(  # noqa: S606
        "setpriv",
        [
            "setpriv",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--no-new-privs",
            "--",
            *command,
        ],
    )
    return 127  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
