"""`CheckpointStore` on `shared.checkpoints` (a local folder or a GCS bucket, by URI)."""

from __future__ import annotations

import asyncio

from services.checkpointer.model import LatestCheckpoint
from shared.checkpoints import CheckpointRequest, latest_checkpoint, request_checkpoint


class StorageCheckpoints:
    async def latest(self, checkpoint_uri: str) -> LatestCheckpoint | None:
        found = await asyncio.to_thread(latest_checkpoint, checkpoint_uri)
        return LatestCheckpoint(uri=found.uri, step=found.step) if found is not None else None

    async def request(self, checkpoint_uri: str, request: CheckpointRequest) -> None:
        await asyncio.to_thread(request_checkpoint, checkpoint_uri, request)
