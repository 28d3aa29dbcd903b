"""`JobReader` on the `jobs` bucket, which the submitter declares and writes: read through
the key-value port, as the checkpointer's own view of a record."""

from __future__ import annotations

from services.checkpointer.model import JobRecord
from shared.messaging.ports import KeyValue


class KvJobReader:
    def __init__(self, kv: KeyValue) -> None:
        # `JetStreamKeyValue.of`: the checkpointer may start before the submitter declares it.
        self._kv = kv

    async def get(self, job_id: str) -> JobRecord | None:
        entry = await self._kv.get(job_id)
        return JobRecord.model_validate_json(entry.value) if entry else None

    async def active(self) -> list[JobRecord]:
        records = [JobRecord.model_validate_json(e.value) for e in await self._kv.entries()]
        return [record for record in records if record.is_active]
