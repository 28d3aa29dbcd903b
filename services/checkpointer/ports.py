"""What the checkpointer needs from the world, each with the semantics it relies on."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from services.checkpointer.model import JobRecord, LatestCheckpoint
from shared.checkpoints import CheckpointRequest
from shared.pools import PoolsStatus


class JobReader(Protocol):
    """The `jobs` bucket, read-only: the submitter is its only writer."""

    async def get(self, job_id: str) -> JobRecord | None: ...

    async def active(self) -> list[JobRecord]:
        """Every job that has not ended."""
        ...


class CheckpointStore(Protocol):
    """Jobs' checkpoints and their CHECKPOINT_NOW requests (a local folder or GCS)."""

    async def latest(self, checkpoint_uri: str) -> LatestCheckpoint | None:
        """The complete checkpoint with the highest step under the job's URI, if any."""
        ...

    async def request(self, checkpoint_uri: str, request: CheckpointRequest) -> None:
        """Ask the attempt the request names to checkpoint and stop."""
        ...


class RayNodes(Protocol):
    async def drain(self, node: str, deadline: datetime) -> bool:
        """Tell Ray the node goes away at `deadline`, so nothing new is placed on it.
        False when Ray does not know the node (already gone), refuses, or its head does
        not answer."""
        ...


class PoolsReader(Protocol):
    """The scaler's view of its pools (its `pools` bucket), read-only."""

    async def status(self) -> PoolsStatus | None:
        """The latest view; None before the scaler's first pass."""
        ...
