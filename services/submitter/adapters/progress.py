"""`ProgressReader` on the checkpoint store (a local folder or a GCS bucket)."""

from __future__ import annotations

import asyncio

from shared.checkpoints import (
    ProgressReport,
    StopAsk,
    read_checkpoint_request,
    read_progress,
    stop_ask,
)


class StorageProgressReader:
    async def latest(self, checkpoint_uri: str) -> ProgressReport | None:
        return await asyncio.to_thread(read_progress, checkpoint_uri)

    async def stop_asked(self, checkpoint_uri: str, attempt: int) -> StopAsk:
        raw = await asyncio.to_thread(read_checkpoint_request, checkpoint_uri)
        return stop_ask(raw, attempt)
