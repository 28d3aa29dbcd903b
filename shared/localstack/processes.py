"""Processes the local stack owns: start each in its own session, remember it, stop it all.

Each component starts as the leader of a new session, so everything it spawns (Ray's GCS,
raylet, dashboard, workers) shares that session id; stopping a component signals exactly
that session, never anything else on the machine (no `ray stop`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO


@dataclass(frozen=True)
class ProcessRecord:
    """What the PID file of one component holds."""

    name: str
    pid: int
    argv: list[str]
    log: str
    start_ticks: int
    """The kernel's start time of the process: a PID reused by another process differs."""

    @classmethod
    def load(cls, path: Path) -> ProcessRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)


# Children started by this process, kept so that they are reaped (no zombies) when a
# long-lived parent, such as the scaler's local provider, stops them.
_children: dict[int, subprocess.Popen[bytes]] = {}

STACK_UMASK = 0o077
"""What the stack's processes create is their user's alone: Ray's logs (its runtime-env
agent's hold jobs' environments, secrets included), the NATS store, checkpoints."""


def spawn(  # what a process is started with
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str],
    cwd: Path,
    detached: bool = False,
) -> ProcessRecord:
    """Start `argv` as the leader of a new session, its output appended to `log_path`.

    `detached`: not even a child of this process (a launcher starts it and exits), so that
    stopping this process, with everything it spawned, leaves it running: a pool node
    outlives the scaler that launched it, as a VM outlives a restarted autoscaler.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        if detached:
            pid = _launch_detached(argv, log=log, env=env, cwd=cwd)
        else:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                umask=STACK_UMASK,
            )
            _children[process.pid] = process
            pid = process.pid
    stat = _read_stat(pid)
    return ProcessRecord(
        name=name,
        pid=pid,
        argv=list(argv),
        log=str(log_path),
        start_ticks=stat.start_ticks if stat else -1,
    )


_LAUNCHER = (
    "import subprocess, sys; "
    "p = subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=subprocess.DEVNULL, "
    "stdout=2, stderr=2); print(p.pid)"
)
"""Starts its arguments in a session of their own and exits at once, handing them to init."""


def _launch_detached(
    argv: Sequence[str], *, log: IO[bytes], env: Mapping[str, str], cwd: Path
) -> int:
    launcher = subprocess.run(  # our own interpreter and command line
        [sys.executable, "-c", _LAUNCHER, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        env=dict(env),
        cwd=cwd,
        check=True,
        timeout=30,
        umask=STACK_UMASK,  # the node it starts inherits it
    )
    return int(launcher.stdout)


def is_running(record: ProcessRecord) -> bool:
    """True if the recorded process is alive and is still the one we started (no PID reuse)."""
    stat = _read_stat(record.pid)
    return (
        stat is not None and stat.state not in ("Z", "X") and stat.start_ticks == record.start_ticks
    )


def session_processes(session_id: int) -> list[int]:
    """Live processes of a session and their descendants in other sessions, zombies excluded.

    Ray starts each job's driver in a session of its own (so that it can stop it as a
    group); it is still part of the node that started it, and goes when the node goes.
    """
    stats = _live_stats()
    members = {pid for pid, stat in stats.items() if stat.session == session_id}
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        children.setdefault(stat.parent, []).append(pid)
    frontier = list(members)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in members:
                members.add(child)
                frontier.append(child)
    return sorted(members)


def _live_stats() -> dict[int, _Stat]:
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _read_stat(int(entry.name))
            if stat is not None and stat.state not in ("Z", "X"):
                stats[int(entry.name)] = stat
    return stats


def stop_session(session_id: int, *, grace_s: float) -> None:
    """SIGTERM every process of the session, then SIGKILL what is left after `grace_s`."""
    try:
        _signal_all(session_processes(session_id), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            _reap(session_id)
            if not session_processes(session_id):
                return
            time.sleep(0.1)
        for _ in range(50):
            members = session_processes(session_id)
            if not members:
                return
            _signal_all(members, signal.SIGKILL)
            time.sleep(0.1)
            _reap(session_id)
    finally:
        _reap(session_id)


def _reap(leader: int) -> None:
    child = _children.get(leader)
    if child is not None and child.poll() is not None:
        _children.pop(leader, None)  # `down` reaps sessions from several threads


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        if probe.connect_ex((host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers themselves bind: connections of a stopped process lingering in
        # TIME_WAIT do not make a port taken.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class _Stat:
    state: str
    parent: int
    session: int
    start_ticks: int


def _read_stat(pid: int) -> _Stat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after its last ')' do not.
    fields = raw[raw.rindex(")") + 2 :].split()
    return _Stat(
        state=fields[0], parent=int(fields[1]), session=int(fields[3]), start_ticks=int(fields[19])
    )


def _signal_all(pids: Sequence[int], signum: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue


REPO_TOOLS = Path(__file__).resolve().parents[2] / ".tools" / "bin"
"""Where `make test` (tools/install-*) puts the tools the stack runs, in a checkout."""


def find_tool(configured: Path | None, name: str, tools: Path = REPO_TOOLS) -> str | None:
    """A tool the stack runs: the path its setting names, else the checkout's `tools/name`,
    else one on PATH; None if there is none."""
    if configured is not None:
        return str(configured)
    in_repo = tools / name
    if in_repo.exists():
        return str(in_repo)
    return shutil.which(name)
