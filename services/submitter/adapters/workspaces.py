"""`Workspaces` on the bus's object store, unpacked once per content hash."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from shared.events.types import ObjectRef
from shared.messaging.ports import Stores
from shared.workspace import download, unpack


class ObjectStoreWorkspaces:
    def __init__(self, stores: Stores, cache_dir: Path) -> None:
        self._stores = stores
        self._cache_dir = cache_dir

    async def unpack(self, ref: ObjectRef) -> Path:
        # By its owner's name and hash, not by hash alone: a job that names someone else's
        # hash gets nothing that was unpacked for them (the download would find no object).
        target = self._cache_dir / ref.name.removesuffix(".zip")
        if target.is_dir():
            return target
        data = await download(self._stores, ref)
        self._cache_dir.mkdir(parents=True, exist_ok=True)
        # Unpacked beside the target and renamed into place, so a crash leaves no half tree.
        staging = Path(tempfile.mkdtemp(dir=self._cache_dir, prefix=".unpacking-"))
        try:
            await asyncio.to_thread(unpack, data, staging)
            await asyncio.to_thread(staging.rename, target)
        except OSError:
            if not target.is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target
