"""`PoolsReader` on the scaler's pools bucket: its status (prices) and owners' spend."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext

from shared.pools import SPEND_KEY, STATUS_KEY, OwnersSpend, PoolsStatus, pools_bucket


class KvPoolsReader:
    def __init__(self, js: JetStreamContext, prefix: str) -> None:
        self._js = js
        self._bucket = pools_bucket(prefix)

    async def _get(self, key: str) -> bytes | None:
        try:
            kv = await self._js.key_value(self._bucket)
            entry = await kv.get(key)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            return None
        value: bytes | None = entry.value
        return value

    async def status(self) -> PoolsStatus | None:
        value = await self._get(STATUS_KEY)
        return PoolsStatus.model_validate_json(value) if value else None

    async def spend(self) -> OwnersSpend | None:
        value = await self._get(SPEND_KEY)
        return OwnersSpend.model_validate_json(value) if value else None
