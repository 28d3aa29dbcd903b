"""The jobs bucket holds admitted jobs; refused requests go to a bucket of their own that
forgets them: one person's flood of refusals neither stays for ever nor slows every read
of the jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.submitter.adapters.kv_job_store import KvJobStore
from shared.events.data import JobRequested, RejectionReason
from shared.jobs import JobRecord, JobState, jobs_bucket, refusals_bucket
from shared.messaging.jetstream import JetStreamBus
from tests.async_helpers import eventually

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _record(job_id: str, state: JobState) -> JobRecord:
    return JobRecord(
        request=JobRequested(job_id=job_id, owner="alice", entrypoint=("python", "t.py")),
        request_event_id=f"ev-{job_id}",
        state=state,
        accepted_at=NOW,
        updated_at=NOW,
        rejection=RejectionReason.INVALID if state is JobState.REJECTED else None,
    )


async def test_refused_requests_are_kept_apart_and_expire(jetstream_bus: JetStreamBus) -> None:
    js = jetstream_bus.client.jetstream()
    bucket = jobs_bucket(jetstream_bus.prefix)
    store = await KvJobStore.open(jetstream_bus, bucket, refusals_max_age_s=2)
    assert await store.create(_record("ok-1", JobState.QUEUED)) is not None
    for n in range(20):
        assert await store.create(_record(f"no-{n}", JobState.REJECTED)) is not None
    # The jobs bucket reads the same whatever was refused.
    assert [r.job_id for r, _ in await store.all()] == ["ok-1"]
    assert (await js.stream_info(f"KV_{bucket}")).state.messages == 1
    found = await store.get("no-3")
    assert found is not None
    assert found[0].state is JobState.REJECTED
    # A repeated request finds its refusal: it is not decided twice.
    assert await store.create(_record("no-3", JobState.REJECTED)) is None
    # A refusal never stands in for an admitted job of the same id.
    assert await store.create(_record("ok-1", JobState.REJECTED)) is None

    async def forgotten() -> bool:
        return await store.get("no-3") is None

    await eventually(forgotten, timeout_s=10)
    refusals = await js.stream_info(f"KV_{refusals_bucket(bucket)}")
    assert refusals.state.messages == 0
    assert await store.get("ok-1") is not None, "an admitted job stays"
