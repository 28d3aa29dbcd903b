"""`JobStore` on JetStream key-value buckets: one key per job, compare-and-set updates.

Admitted jobs live in the jobs bucket. Refused requests live in a bucket of their own whose
entries expire (`REFUSALS_MAX_AGE_S`): one person's flood of refused requests neither
stays for ever nor makes every read of the jobs bucket longer."""

from __future__ import annotations

from typing import Self

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from services.submitter.model import JobRecord
from services.submitter.ports import Revision, StaleRevisionError
from shared.jobs import JobState, refusals_bucket
from shared.messaging.kv import latest_entries

REFUSALS_MAX_AGE_S = 7 * 86_400.0
"""How long a refused request's record is kept: `spotrain show` finds it for a week."""


class KvJobStore:
    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str, refusals: KeyValue) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket
        self._refusals = refusals

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        bucket: str,
        *,
        replicas: int = 1,
        refusals_max_age_s: float = REFUSALS_MAX_AGE_S,
    ) -> Self:
        """Declare the buckets (idempotent) and keep a little history for `spotrain show`."""
        kv = await js.create_key_value(
            KeyValueConfig(bucket=bucket, history=16, storage=StorageType.FILE, replicas=replicas)
        )
        refusals = await js.create_key_value(
            KeyValueConfig(
                bucket=refusals_bucket(bucket),
                history=1,
                storage=StorageType.FILE,
                replicas=replicas,
                ttl=refusals_max_age_s,
            )
        )
        return cls(js, kv, bucket, refusals)

    def _bucket_of(self, record: JobRecord) -> KeyValue:
        return self._refusals if record.state is JobState.REJECTED else self._kv

    async def create(self, record: JobRecord) -> Revision | None:
        if record.state is JobState.REJECTED and await self._found(self._kv, record.job_id):
            return None  # admitted before: a refusal never hides it
        try:
            return await self._bucket_of(record).create(
                record.job_id, record.model_dump_json().encode()
            )
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def get(self, job_id: str) -> tuple[JobRecord, Revision] | None:
        for kv in (self._kv, self._refusals):
            found = await self._found(kv, job_id)
            if found is not None:
                return found
        return None

    @staticmethod
    async def _found(kv: KeyValue, job_id: str) -> tuple[JobRecord, Revision] | None:
        try:
            entry = await kv.get(job_id)
        except nats.js.errors.KeyNotFoundError:
            return None
        if entry.value is None or entry.revision is None:
            return None
        return JobRecord.model_validate_json(entry.value), entry.revision

    async def update(self, record: JobRecord, revision: Revision) -> Revision:
        try:
            return await self._bucket_of(record).update(
                record.job_id, record.model_dump_json().encode(), last=revision
            )
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise StaleRevisionError(record.job_id) from error

    async def all(self) -> list[tuple[JobRecord, Revision]]:
        """Every admitted job's record; refused requests are not among them."""
        return [
            (JobRecord.model_validate_json(entry.value or b""), entry.revision or 0)
            for entry in await latest_entries(self._js, self._bucket)
        ]
