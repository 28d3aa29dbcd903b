"""`ProgressReader` on the checkpoint store (a local folder or a GCS bucket): progress,
stop requests and the attempts' kept output read, and a stop request written when a job
must give way."""

from __future__ import annotations

import asyncio

from shared.checkpoints import (
    CheckpointRequest,
    ProgressReport,
    StopAsk,
    read_attempt_log,
    read_checkpoint_request,
    read_progress,
    request_checkpoint,
    stop_ask,
)


class StorageProgressReader:
    async def latest(self, checkpoint_uri: str) -> ProgressReport | None:
        return await asyncio.to_thread(read_progress, checkpoint_uri)

    async def stop_asked(self, checkpoint_uri: str, attempt: int) -> StopAsk:
        raw = await asyncio.to_thread(read_checkpoint_request, checkpoint_uri)
        return stop_ask(raw, attempt)

    async def kept_output(self, checkpoint_uri: str, attempt: int) -> str | None:
        return await asyncio.to_thread(read_attempt_log, checkpoint_uri, attempt)

    async def request_stop(self, checkpoint_uri: str, request: CheckpointRequest) -> None:
        await asyncio.to_thread(request_checkpoint, checkpoint_uri, request)
