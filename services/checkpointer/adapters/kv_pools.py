"""`PoolsReader` on the scaler's `pools` key-value bucket."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext

from shared.pools import STATUS_KEY, PoolsStatus


class KvPoolsReader:
    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        self._js = js
        self._bucket = bucket

    async def status(self) -> PoolsStatus | None:
        try:
            kv = await self._js.key_value(self._bucket)
            entry = await kv.get(STATUS_KEY)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
            return None
        return PoolsStatus.model_validate_json(entry.value) if entry.value else None
