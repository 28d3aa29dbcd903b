"""The client lists job records in one pass over the bucket, on a real NATS JetStream."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.client import SpotrainClient
from shared.events.data import JobRequested
from shared.events.types import Bundle
from shared.jobs import JobRecord, JobState, jobs_bucket
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


def record(job_id: str, minutes_ago: int, state: JobState = JobState.SUCCEEDED) -> JobRecord:
    request = JobRequested(
        job_id=job_id, owner="alice", entrypoint=("python", "t.py"), worker=Bundle(gpus=1)
    )
    accepted = NOW - timedelta(minutes=minutes_ago)
    return JobRecord(
        request=request,
        request_event_id=f"r-{job_id}",
        state=state,
        accepted_at=accepted,
        updated_at=accepted,
    )


async def test_every_latest_record_newest_first_and_none_deleted(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    async with await SpotrainClient.connect(bus_settings) as client:
        assert await client.jobs() == [], "no bucket yet"
        js = jetstream_bus.client.jetstream()
        bucket = await js.create_key_value(bucket=jobs_bucket(jetstream_bus.prefix))
        assert await client.jobs() == [], "an empty bucket"
        for job_id, minutes_ago in (("old", 30), ("new", 1), ("gone", 10), ("mid", 5)):
            await bucket.put(
                job_id, record(job_id, minutes_ago, JobState.QUEUED).model_dump_json().encode()
            )
        await bucket.put("mid", record("mid", 5).model_dump_json().encode())  # its latest
        await bucket.delete("gone")
        listed = await client.jobs()
    assert [r.job_id for r in listed] == ["new", "mid", "old"]
    assert listed[1].state is JobState.SUCCEEDED, "the latest revision, not the first"


async def test_a_bucket_whose_last_entry_is_a_deletion_still_ends(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    js = jetstream_bus.client.jetstream()
    bucket = await js.create_key_value(bucket=jobs_bucket(jetstream_bus.prefix))
    await bucket.put("kept", record("kept", 1).model_dump_json().encode())
    await bucket.put("gone", record("gone", 2).model_dump_json().encode())
    await bucket.delete("gone")
    async with await SpotrainClient.connect(bus_settings) as client:
        assert [r.job_id for r in await client.jobs()] == ["kept"]
