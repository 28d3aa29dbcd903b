"""`ProgressReader` on the checkpoint store (a local folder or a GCS bucket)."""

from __future__ import annotations

import asyncio

from shared.checkpoints import (
    ProgressReport,
    checkpoint_request_applies,
    read_checkpoint_request,
    read_progress,
)


class StorageProgressReader:
    async def latest(self, checkpoint_uri: str) -> ProgressReport | None:
        return await asyncio.to_thread(read_progress, checkpoint_uri)

    async def checkpoint_requested(self, checkpoint_uri: str, attempt: int) -> bool:
        raw = await asyncio.to_thread(read_checkpoint_request, checkpoint_uri)
        return checkpoint_request_applies(raw, attempt)
