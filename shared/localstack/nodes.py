"""The local provider's node folder, which three parties share: the scaler's local provider
starts and releases nodes there, `spotrain preempt` (the local stand-in for the cloud) posts
notices there and kills nodes, and the preemption watcher's local source reads it all.

For a node `NAME`: `NAME.json` is its process record, `NAME.pool` its pool, `NAME.notice`
a preemption notice with its deadline, `NAME.released` says that the provider stopped it
on purpose (its disappearance is not a loss).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ValidationError

from shared.localstack.processes import ProcessRecord, session_members


class PreemptionNotice(BaseModel):
    node: str
    deadline: AwareDatetime
    posted_at: AwareDatetime


@dataclass(frozen=True)
class LocalNode:
    name: str
    pool: str
    record: ProcessRecord


class NodeFolder:
    def __init__(self, path: Path) -> None:
        self.path = path

    def nodes(self) -> list[LocalNode]:
        """Every node with a process record, running or not, by name."""
        found = []
        for record_path in sorted(self.path.glob("*.json")):
            record = ProcessRecord.load(record_path)
            if record is not None:
                found.append(LocalNode(record.name, self.pool_of(record.name), record))
        return found

    def pool_of(self, name: str) -> str:
        try:
            return (self.path / f"{name}.pool").read_text().strip()
        except OSError:
            return name.rsplit("-", 1)[0]

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

    def forget(self, name: str) -> None:
        """Remove every file of a node; called before a name is used again."""
        for suffix in (".json", ".pool", ".notice", ".released"):
            (self.path / f"{name}{suffix}").unlink(missing_ok=True)

    def _write(self, file_name: str, text: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{file_name}.tmp"
        tmp.write_text(text)
        tmp.replace(self.path / file_name)


def kill_node(record: ProcessRecord) -> int:
    """SIGKILL every process of the node's session at once, as a vanished VM would: no
    SIGTERM first, so training gets no chance to checkpoint. Returns how many were killed."""
    members = session_members(record.pid)
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    return len(members)
