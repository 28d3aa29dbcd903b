"""Keeps one local pool node: records itself as the node's process, runs its
`ray start --block` as a child, stamps a file while it runs and records when it exited.
The local stand-in for what a cloud keeps of each VM (that it exists, when it stopped), so
that a node that died while no scaler watched is billed to its end.

    python node_keeper.py RECORD_FILE LOG_FILE ALIVE_FILE ENDED_FILE -- ray start ...

It writes the node's process record (RECORD_FILE, as `processes.ProcessRecord` reads it)
before the node starts: a scaler killed while it launched the node would otherwise leave
a node running in Ray that no record names, that nobody bills, stops or preempts (found
by the chaos test).

Standard library only, and run as a plain script: it starts with every node, so it must
start fast and import nothing of the project. A SIGKILL of the whole session (a vanished
VM, or every process of the stack killed at once) leaves no exit record: then the alive
file's time says when the node was last known to run, within `HEARTBEAT_S`.
"""

from __future__ import annotations

import json
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


def keep(record: Path, log: Path, alive: Path, ended: Path, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stay)
    write_record(record, log)
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


def write_record(record: Path, log: Path) -> None:
    """This process as the node's record: its pid, and its start time in clock ticks since
    boot (field 22 of /proc/self/stat), so that a reused pid is never taken for it."""
    stat = Path("/proc/self/stat").read_text()
    start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
    fields = {
        "name": record.stem,
        "pid": os.getpid(),
        "argv": [sys.executable, *sys.argv],
        "log": str(log),
        "start_ticks": start_ticks,
    }
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(fields))
    tmp.replace(record)


def main(argv: list[str]) -> int:
    if len(argv) < 7 or argv[5] != "--":  # the usage line above
        print(__doc__, file=sys.stderr)
        return 2
    record, log, alive, ended = (Path(arg) for arg in argv[1:5])
    return keep(record, log, alive, ended, argv[6:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
