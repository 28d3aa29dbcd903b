"""The local provider's node folder, which three parties share: the scaler's local provider
starts and releases nodes there, `spotrain preempt` (the local stand-in for the cloud) posts
notices there and kills nodes, and the preemption watcher's local source reads it all.

For a node `NAME`: `NAME.json` is its process record, `NAME.pool` its pool,
`NAME.capacity` its pool's capacity class (spot, on-demand), `NAME.notice`
a preemption notice with its deadline, `NAME.released` says that the provider stopped it
on purpose (its disappearance is not a loss). `NAME.started` records when the provider
started it, `NAME.alive` is stamped while it runs and `NAME.ended` records when it stopped
(its keeper, a release or a preemption writes it): the record a cloud keeps of when a VM
started and stopped, kept until the stack is stopped cleanly.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ValidationError

from shared.events.data import NodeEndSource
from shared.localstack.node_keeper import record_end
from shared.localstack.processes import (
    ProcessRecord,
    is_running,
    session_processes,
    stop_session,
)
from shared.policy.cost.node_ends import NodeEnd


class PreemptionNotice(BaseModel):
    node: str
    deadline: AwareDatetime
    posted_at: AwareDatetime


@dataclass(frozen=True)
class LocalNode:
    name: str
    pool: str
    capacity: str | None
    record: ProcessRecord


_NODE_FILES = (
    ".json",
    ".pool",
    ".capacity",
    ".notice",
    ".released",
    ".started",
    ".alive",
    ".ended",
)


class NodeFolder:
    def __init__(self, path: Path) -> None:
        self.path = path

    def nodes(self) -> list[LocalNode]:
        """Every node with a process record, running or not, by name."""
        found = []
        for record_path in sorted(self.path.glob("*.json")):
            record = ProcessRecord.load(record_path)
            if record is not None:
                name = record.name
                found.append(LocalNode(name, self.pool_of(name), self._capacity_of(name), record))
        return found

    def running(self) -> list[LocalNode]:
        return [node for node in self.nodes() if is_running(node.record)]

    def pool_of(self, name: str) -> str:
        try:
            return (self.path / f"{name}.pool").read_text().strip()
        except OSError:
            return name.rsplit("-", 1)[0]

    def new_name(self, pool: str) -> str:
        """A name never used before in this folder: `<pool>-<n>`. Like cloud VM names, a
        name is not reused, so a lost node is never mistaken for its successor."""
        counter = self.path / f".{pool}.count"
        try:
            used = int(counter.read_text())
        except (OSError, ValueError):
            used = 0
        taken = {p.stem for p in self.path.glob(f"{pool}-*.json")}
        while f"{pool}-{used + 1}" in taken:
            used += 1
        self._write(f".{pool}.count", str(used + 1))
        return f"{pool}-{used + 1}"

    def describe(self, name: str, pool: str, capacity: str) -> None:
        """Record a new node's pool and capacity, beside the record its provider saves."""
        self.forget(name)  # a notice or release mark of an earlier namesake
        self._write(f"{name}.pool", pool)
        self._write(f"{name}.capacity", capacity)

    def _capacity_of(self, name: str) -> str | None:
        try:
            return (self.path / f"{name}.capacity").read_text().strip()
        except OSError:
            return None

    def post_notice(self, name: str, deadline: datetime, now: datetime) -> PreemptionNotice:
        notice = PreemptionNotice(node=name, deadline=deadline, posted_at=now)
        self._write(f"{name}.notice", notice.model_dump_json())
        return notice

    def notices(self) -> list[PreemptionNotice]:
        found = []
        for path in sorted(self.path.glob("*.notice")):
            try:
                found.append(PreemptionNotice.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError):
                continue  # half-written or removed under us: the next look sees it whole
        return found

    def mark_released(self, name: str) -> None:
        self._write(f"{name}.released", "")

    def was_released(self, name: str) -> bool:
        return (self.path / f"{name}.released").exists()

    def alive_file(self, name: str) -> Path:
        return self.path / f"{name}.alive"

    def ended_file(self, name: str) -> Path:
        return self.path / f"{name}.ended"

    def record_start(self, name: str, at: datetime) -> None:
        self._write(f"{name}.started", at.isoformat())

    def started_at(self, name: str) -> datetime | None:
        try:
            return datetime.fromisoformat((self.path / f"{name}.started").read_text().strip())
        except (OSError, ValueError):
            return None

    def started(self) -> list[str]:
        """Every node with a start record, running or not, by name."""
        return sorted(path.stem for path in self.path.glob("*.started"))

    def record_end(self, name: str, at: datetime) -> None:
        """Record when the node stopped, unless something recorded it first."""
        self.path.mkdir(parents=True, exist_ok=True)
        record_end(self.ended_file(name), at)

    def has_ended(self, name: str) -> bool:
        return self.ended_file(name).exists()

    def recorded_end(self, name: str) -> NodeEnd | None:
        """When the node stopped, if recorded; else when it was last stamped alive; None
        for a node this folder knows nothing of."""
        try:
            return NodeEnd(
                datetime.fromisoformat(self.ended_file(name).read_text().strip()),
                NodeEndSource.RECORDED,
            )
        except (OSError, ValueError):
            pass
        try:
            stamped = self.alive_file(name).stat().st_mtime
        except OSError:
            return None
        return NodeEnd(datetime.fromtimestamp(stamped, UTC), NodeEndSource.LAST_SEEN)

    def stop(self, node: LocalNode, *, grace_s: float) -> None:
        """Stop a node on purpose: marked released first (its exit is no loss), drained
        within `grace_s`, then killed; its end recorded (by its keeper, else here)."""
        self.mark_released(node.name)
        stop_session(node.record.pid, grace_s=grace_s)
        self.record_end(node.name, datetime.now(UTC))

    def forget(self, name: str) -> None:
        """Remove every file of a node; called before a name is used again."""
        for suffix in _NODE_FILES:
            (self.path / f"{name}{suffix}").unlink(missing_ok=True)

    def clear(self) -> None:
        """Forget every node; the name counters stay, so no name is ever used twice."""
        for path in self.path.glob("*"):
            if not path.name.endswith(".count"):
                path.unlink(missing_ok=True)

    def clear_stopped(self) -> None:
        """Forget the process records, notices and release marks of stopped nodes, but keep
        their pools, starts and ends: a ledger not yet told of them still needs them."""
        for suffix in ("json", "notice", "released"):
            for path in self.path.glob(f"*.{suffix}"):
                path.unlink(missing_ok=True)

    def withdraw_notice(self, name: str) -> None:
        (self.path / f"{name}.notice").unlink(missing_ok=True)

    def _write(self, file_name: str, text: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{file_name}.tmp"
        tmp.write_text(text)
        tmp.replace(self.path / file_name)


KILL_WAIT_S = 2.0
"""How long a kill waits for the node to be gone before it records the end anyway."""


def kill_node(record: ProcessRecord) -> int:
    """SIGKILL every process of the node's session at once, as a vanished VM would: no
    SIGTERM first, so training gets no chance to checkpoint. Returns how many were killed."""
    members = session_processes(record.pid)
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    return len(members)


class NoSuchNodeError(LookupError):
    pass


@dataclass(frozen=True)
class Preemption:
    node: str
    pool: str
    notice: PreemptionNotice | None
    killed_at: datetime
    processes: int


def pick_node(folder: NodeFolder, name: str | None, *, capacity: str | None = None) -> LocalNode:
    """The running node called `name`, or a random running one (of `capacity`, if given)."""
    running = folder.running()
    if name is not None:
        for node in running:
            if node.name == name:
                return node
        names = ", ".join(n.name for n in running) or "none"
        msg = f"no running node {name!r}; running nodes: {names}"
        raise NoSuchNodeError(msg)
    candidates = [n for n in running if capacity is None or n.capacity == capacity]
    if not candidates:
        msg = "no running node to preempt" + (f" of {capacity} capacity" if capacity else "")
        raise NoSuchNodeError(msg)
    return random.choice(candidates)  # noqa: S311  # chaos, not cryptography


def preempt(
    folder: NodeFolder,
    node: LocalNode,
    *,
    notice_s: float,
    on_notice: Callable[[PreemptionNotice], None] = lambda _: None,
    sleep: Callable[[float], None] = time.sleep,
) -> Preemption:
    """What the cloud does to a spot VM: a notice with a deadline (if any), then the kill."""
    notice = None
    if notice_s > 0:
        now = datetime.now(UTC)
        notice = folder.post_notice(node.name, now + timedelta(seconds=notice_s), now)
        on_notice(notice)
        sleep(max(0.0, (notice.deadline - datetime.now(UTC)).total_seconds()))
    processes, killed_at = take_back(folder, node.name, node.record)
    return Preemption(
        node=node.name, pool=node.pool, notice=notice, killed_at=killed_at, processes=processes
    )


def take_back(folder: NodeFolder, name: str, record: ProcessRecord) -> tuple[int, datetime]:
    """The kill of a preemption, at its deadline: the node's every process at once, its
    end recorded (as the cloud records a preemption's time: the keeper died with it), its
    notice withdrawn (served: a notice outliving its node is noise). Returns how many
    processes were killed, and when: once the node is gone, not when the kill was sent.
    A SIGKILLed node takes a few ms to die, and a provider listing in between still sees it
    run: its end must not fall before a sighting of it alive (found in CI, 40 ms early)."""
    processes = kill_node(record)
    give_up = time.monotonic() + KILL_WAIT_S
    while is_running(record) and time.monotonic() < give_up:
        time.sleep(0.005)
    killed_at = datetime.now(UTC)
    folder.record_end(name, killed_at)
    folder.withdraw_notice(name)
    return processes, killed_at
