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

When the node's `ray start` exits by itself with a failure, the keeper does what Kubernetes
does with a pod's container: it kills whatever the node still runs (the container's
processes go with it) and starts it again, after a back-off. A worker's raylet exits so
when it lost its head for good (a head that came back without its state is another
cluster); the VM is still there and joins the new head. The keeper is the node's child
subreaper, so that a job's driver orphaned by its supervisor (Ray starts it in a session
of its own) is still the node's and goes too. A node killed, or stopped by a signal, or
exiting cleanly (drained) ends as before.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

HEARTBEAT_S = 0.05


RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 10.0)
"""Waits before each restart in a row (Kubernetes: 10 s doubling to 5 min; a local node is
cheap to retry); a run of `STEADY_S` starts the count again."""
STEADY_S = 60.0
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


class _Keeper:
    stopping = False


def _stay(_signum: int, _frame: FrameType | None) -> None:
    """A SIGTERM reaches every process of the node's session at once (`stop_session`):
    the node stops by itself, and the keeper stays to record when, without starting it
    again. A handler rather than SIG_IGN, because an ignored signal would stay ignored in
    the child it starts."""
    _Keeper.stopping = True


def keep(record: Path, log: Path, alive: Path, ended: Path, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stay)
    # Orphans of the node's processes become the keeper's, not init's: still the node's.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    write_record(record, log)
    alive.touch()
    restarts = 0
    while True:
        started = time.monotonic()
        code = _run(argv, alive)
        if _Keeper.stopping or code <= 0:
            break
        _kill_descendants()
        restarts = 0 if time.monotonic() - started >= STEADY_S else restarts + 1
        wait_s = RESTART_BACKOFF_S[min(restarts, len(RESTART_BACKOFF_S) - 1)]
        print(f"node_keeper: the node exited with {code}; starting it again in {wait_s:g} s")
        sys.stdout.flush()
        if not _wait(wait_s, alive):
            break
    if not _Keeper.stopping:
        _kill_descendants()  # what its last run left (a stop's own signal takes the rest)
    record_end(ended, datetime.now(UTC))
    return code if code >= 0 else 128 - code


def _run(argv: list[str], alive: Path) -> int:
    """Run the node's command until it exits; its exit code (negative: its signal). Reaps
    the orphans it leaves to the keeper meanwhile."""
    child = subprocess.Popen(argv)  # the node's own command line
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid, status = 0, 0
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)
        if pid == 0:
            time.sleep(HEARTBEAT_S)
            alive.touch()


def _wait(seconds: float, alive: Path) -> bool:
    """Stamp the node alive for `seconds`; False if it is asked to stop meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _Keeper.stopping:
            return False
        time.sleep(HEARTBEAT_S)
        alive.touch()
    return not _Keeper.stopping


def _kill_descendants() -> None:
    """SIGKILL every process below the keeper and reap them, as a container's restart
    does: nothing of the node's last run outlives it."""
    me = os.getpid()
    for _ in range(50):
        below = _descendants(me)
        if not below:
            return
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        time.sleep(0.02)
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            found.append(child)
            frontier.append(child)
    return found


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
