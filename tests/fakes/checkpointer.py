"""Fakes of the checkpointer's ports, with the same semantics as the real adapters."""

from __future__ import annotations

from datetime import datetime

from services.checkpointer.model import JobRecord, LatestCheckpoint
from shared.checkpoints import CheckpointRequest
from shared.pools import PoolsStatus


class FakeJobs:
    def __init__(self, *records: JobRecord) -> None:
        self.records = {record.job_id: record for record in records}

    async def get(self, job_id: str) -> JobRecord | None:
        return self.records.get(job_id)

    async def active(self) -> list[JobRecord]:
        return [record for record in self.records.values() if record.is_active]


class FakeCheckpoints:
    def __init__(self) -> None:
        self.latest_by_uri: dict[str, LatestCheckpoint] = {}
        self.requests: list[tuple[str, CheckpointRequest]] = []

    async def latest(self, checkpoint_uri: str) -> LatestCheckpoint | None:
        return self.latest_by_uri.get(checkpoint_uri)

    async def request(self, checkpoint_uri: str, request: CheckpointRequest) -> None:
        self.requests.append((checkpoint_uri, request))


class FakeRayNodes:
    def __init__(self, known: set[str]) -> None:
        self.known = known
        self.drained: list[tuple[str, datetime]] = []

    async def drain(self, node: str, deadline: datetime) -> bool:
        if node not in self.known:
            return False
        self.drained.append((node, deadline))
        return True


class FakePools:
    """The scaler's view of its pools, as its bucket holds it (None before its first pass)."""

    def __init__(self, status: PoolsStatus | None = None) -> None:
        self.latest = status

    async def status(self) -> PoolsStatus | None:
        return self.latest
