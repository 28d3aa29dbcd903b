"""`JobStore` on key-value buckets: one key per job, compare-and-set updates.

Admitted jobs live in the jobs bucket. Refused requests live in a bucket of their own whose
entries expire (`REFUSALS_MAX_AGE_S`): one person's flood of refused requests neither
stays for ever nor makes every read of the jobs bucket longer."""

from __future__ import annotations

from typing import Self

from services.submitter.model import JobRecord
from services.submitter.ports import Revision, StaleRevisionError
from shared.jobs import JobState, refusals_bucket
from shared.messaging.ports import Buckets, KeyValue

REFUSALS_MAX_AGE_S = 7 * 86_400.0
"""How long a refused request's record is kept: `spotrain show` finds it for a week."""

JOB_HISTORY = 16
"""Values kept per job: a little history for `spotrain show`."""


class KvJobStore:
    def __init__(self, jobs: KeyValue, refusals: KeyValue) -> None:
        self._jobs = jobs
        self._refusals = refusals

    @classmethod
    async def open(
        cls,
        buckets: Buckets,
        bucket: str,
        *,
        refusals_max_age_s: float = REFUSALS_MAX_AGE_S,
    ) -> Self:
        """Declare the buckets (idempotent): the submitter, their writer, does at start."""
        return cls(
            await buckets.declare_bucket(bucket, history=JOB_HISTORY),
            await buckets.declare_bucket(refusals_bucket(bucket), ttl_s=refusals_max_age_s),
        )

    def _bucket_of(self, record: JobRecord) -> KeyValue:
        return self._refusals if record.state is JobState.REJECTED else self._jobs

    async def create(self, record: JobRecord) -> Revision | None:
        if record.state is JobState.REJECTED and await self._found(self._jobs, record.job_id):
            return None  # admitted before: a refusal never hides it
        return await self._bucket_of(record).create(
            record.job_id, record.model_dump_json().encode()
        )

    async def get(self, job_id: str) -> tuple[JobRecord, Revision] | None:
        for kv in (self._jobs, self._refusals):
            found = await self._found(kv, job_id)
            if found is not None:
                return found
        return None

    @staticmethod
    async def _found(kv: KeyValue, job_id: str) -> tuple[JobRecord, Revision] | None:
        entry = await kv.get(job_id)
        if entry is None:
            return None
        return JobRecord.model_validate_json(entry.value), entry.revision

    async def update(self, record: JobRecord, revision: Revision) -> Revision:
        written = await self._bucket_of(record).update(
            record.job_id, record.model_dump_json().encode(), revision=revision
        )
        if written is None:
            raise StaleRevisionError(record.job_id)
        return written

    async def all(self) -> list[tuple[JobRecord, Revision]]:
        """Every admitted job's record; refused requests are not among them."""
        return [
            (JobRecord.model_validate_json(entry.value), entry.revision)
            for entry in await self._jobs.entries()
        ]
