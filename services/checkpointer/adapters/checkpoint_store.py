"""`CheckpointStore` on `shared.checkpoints` (a local folder or a GCS bucket, by URI): the
training helper's checkpoints, else those of the job's Ray Train run."""

from __future__ import annotations

import asyncio

from services.checkpointer.model import LatestCheckpoint
from shared.checkpoints import (
    CheckpointRequest,
    latest_checkpoint,
    request_checkpoint,
    storage_for,
)
from shared.usercode.ray_train_defaults import DEFAULT_RUN_NAME
from shared.usercode.ray_train_runs import latest_checkpoint_step


def _latest(checkpoint_uri: str) -> LatestCheckpoint | None:
    found = latest_checkpoint(checkpoint_uri)
    if found is not None:
        return LatestCheckpoint(uri=found.uri, step=found.step)
    storage, root = storage_for(checkpoint_uri)
    step = latest_checkpoint_step(storage, f"{root.rstrip('/')}/{DEFAULT_RUN_NAME}")
    return LatestCheckpoint(uri=None, step=step) if step is not None else None


class StorageCheckpoints:
    async def latest(self, checkpoint_uri: str) -> LatestCheckpoint | None:
        return await asyncio.to_thread(_latest, checkpoint_uri)

    async def request(self, checkpoint_uri: str, request: CheckpointRequest) -> None:
        await asyncio.to_thread(request_checkpoint, checkpoint_uri, request)
