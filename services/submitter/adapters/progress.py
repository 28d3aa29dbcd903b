"""`ProgressReader` on the checkpoint store (a local folder or a GCS bucket)."""

from __future__ import annotations

import asyncio

from shared.checkpoints import ProgressReport, read_progress


class StorageProgressReader:
    async def latest(self, checkpoint_uri: str) -> ProgressReport | None:
        return await asyncio.to_thread(read_progress, checkpoint_uri)
