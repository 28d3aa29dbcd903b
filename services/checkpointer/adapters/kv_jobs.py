"""`JobReader` on the `jobs` key-value bucket, which the submitter declares and writes."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from services.checkpointer.model import JobRecord
from shared.messaging.kv import latest_entries


class KvJobReader:
    def __init__(self, js: JetStreamContext, bucket: str) -> None:
        self._js = js
        self._bucket = bucket
        self._kv: KeyValue | None = None

    async def _open(self) -> KeyValue | None:
        # Opened on first use: the checkpointer may start before the submitter declares it.
        if self._kv is None:
            try:
                self._kv = await self._js.key_value(self._bucket)
            except nats.js.errors.BucketNotFoundError:
                return None
        return self._kv

    async def get(self, job_id: str) -> JobRecord | None:
        kv = await self._open()
        if kv is None:
            return None
        try:
            entry = await kv.get(job_id)
        except nats.js.errors.KeyNotFoundError:
            return None
        return JobRecord.model_validate_json(entry.value) if entry.value else None

    async def active(self) -> list[JobRecord]:
        if await self._open() is None:
            return []
        entries = await latest_entries(self._js, self._bucket)
        records = [JobRecord.model_validate_json(e.value or b"") for e in entries]
        return [record for record in records if record.is_active]
