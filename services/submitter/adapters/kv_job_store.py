"""`JobStore` on a JetStream key-value bucket: one key per job, compare-and-set updates."""

from __future__ import annotations

from typing import Self

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from services.submitter.model import JobRecord
from services.submitter.ports import Revision, StaleRevisionError
from shared.messaging.kv import latest_entries


class KvJobStore:
    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str, *, replicas: int = 1) -> Self:
        """Declare the bucket (idempotent) and keep a little history for `spotrain show`."""
        kv = await js.create_key_value(
            KeyValueConfig(bucket=bucket, history=16, storage=StorageType.FILE, replicas=replicas)
        )
        return cls(js, kv, bucket)

    async def create(self, record: JobRecord) -> Revision | None:
        try:
            return await self._kv.create(record.job_id, record.model_dump_json().encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def get(self, job_id: str) -> tuple[JobRecord, Revision] | None:
        try:
            entry = await self._kv.get(job_id)
        except nats.js.errors.KeyNotFoundError:
            return None
        if entry.value is None or entry.revision is None:
            return None
        return JobRecord.model_validate_json(entry.value), entry.revision

    async def update(self, record: JobRecord, revision: Revision) -> Revision:
        try:
            return await self._kv.update(
                record.job_id, record.model_dump_json().encode(), last=revision
            )
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise StaleRevisionError(record.job_id) from error

    async def all(self) -> list[tuple[JobRecord, Revision]]:
        return [
            (JobRecord.model_validate_json(entry.value or b""), entry.revision or 0)
            for entry in await latest_entries(self._js, self._bucket)
        ]
