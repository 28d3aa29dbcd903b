"""Keeps one local pool node: runs its `ray start --block` as a child, stamps a file while
it runs and records when it exited. The local stand-in for what a cloud keeps of each VM
(when it stopped), so that a node that died while no scaler watched is billed to its end.

    python node_keeper.py ALIVE_FILE ENDED_FILE -- ray start ...

Standard library only, and run as a plain script: it starts with every node, so it must
start fast and import nothing of the project. A SIGKILL of the whole session (a vanished
VM, or every process of the stack killed at once) leaves no exit record: then the alive
file's time says when the node was last known to run, within `HEARTBEAT_S`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

HEARTBEAT_S = 0.05


def _stay(_signum: int, _frame: FrameType | None) -> None:
    """A SIGTERM reaches every process of the node's session at once (`stop_session`):
    the node stops by itself, and the keeper stays to record when. A handler rather than
    SIG_IGN, because an ignored signal would stay ignored in the child it starts."""


def keep(alive: Path, ended: Path, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stay)
    alive.touch()
    child = subprocess.Popen(argv)  # the node's own command line
    while True:
        try:
            code = child.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            alive.touch()
    record_end(ended, datetime.now(UTC))
    return code if code >= 0 else 128 - code


def record_end(ended: Path, at: datetime) -> None:
    """Write the end once: the first to know (the keeper, a release, a preemption) wins,
    atomically (a hard link fails if the record exists), and never half-written."""
    if ended.exists():
        return
    tmp = ended.with_name(f".{ended.name}.{os.getpid()}.tmp")
    tmp.write_text(at.isoformat())
    try:
        os.link(tmp, ended)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":  # the usage line above
        print(__doc__, file=sys.stderr)
        return 2
    return keep(Path(argv[1]), Path(argv[2]), argv[4:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
