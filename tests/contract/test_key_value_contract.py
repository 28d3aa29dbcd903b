"""The key-value port (`shared.messaging.ports.KeyValue`): NATS JetStream's bucket and the
in-memory twin keep the same contract, compare-and-set on the revision above all."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest

from shared.events.data import JobRequested
from shared.jobs import JobRecord, JobsBucket, JobState
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.kv_store import InMemoryKeyValue, JetStreamKeyValue
from shared.messaging.ports import BucketMissingError, KeyValue
from shared.pools import SPEND_KEY, OwnersSpend, PoolsBucket


@pytest.fixture
async def jetstream_kv(jetstream_bus: JetStreamBus) -> KeyValue:
    return await JetStreamKeyValue.declare(
        jetstream_bus.client.jetstream(), f"t{uuid.uuid4().hex[:8]}"
    )


@pytest.fixture(params=["memory", "jetstream"])
def kv(request: pytest.FixtureRequest) -> KeyValue:
    if request.param == "memory":
        return InMemoryKeyValue()
    found: KeyValue = request.getfixturevalue("jetstream_kv")
    return found


async def test_create_sets_a_key_once(kv: KeyValue) -> None:
    revision = await kv.create("lease.scaler", b"a")
    assert revision is not None
    assert await kv.create("lease.scaler", b"b") is None
    entry = await kv.get("lease.scaler")
    assert entry is not None
    assert (entry.value, entry.revision) == (b"a", revision)
    assert await kv.get("nothing") is None


async def test_update_needs_the_latest_revision(kv: KeyValue) -> None:
    first = await kv.create("k", b"1")
    assert first is not None
    second = await kv.update("k", b"2", revision=first)
    assert second is not None
    assert second > first
    assert await kv.update("k", b"stale", revision=first) is None
    entry = await kv.get("k")
    assert entry is not None
    assert entry.value == b"2"
    assert await kv.update("absent", b"x", revision=first) is None


async def test_delete_with_a_revision_is_compare_and_set_too(kv: KeyValue) -> None:
    first = await kv.create("k", b"1")
    assert first is not None
    second = await kv.update("k", b"2", revision=first)
    assert second is not None
    assert not await kv.delete("k", revision=first)
    assert await kv.get("k") is not None
    assert await kv.delete("k", revision=second)
    assert await kv.get("k") is None
    # Deleted, the key can be created again, at a later revision.
    again = await kv.create("k", b"3")
    assert again is not None
    assert again > second


async def test_entries_are_each_keys_latest_the_deleted_left_out(kv: KeyValue) -> None:
    for key in ("a", "b", "c"):
        assert await kv.create(key, key.encode()) is not None
    b = await kv.get("b")
    assert b is not None
    assert await kv.update("b", b"b2", revision=b.revision) is not None
    assert await kv.delete("c")
    assert sorted((e.key, e.value) for e in await kv.entries()) == [("a", b"a"), ("b", b"b2")]


async def test_writers_at_once_lose_no_write(kv: KeyValue) -> None:
    """Twenty writers each add one to a counter, reading again whenever they lose a race:
    the counter ends at twenty."""
    assert await kv.create("counter", b"0") is not None

    async def add_one() -> None:
        while True:
            entry = await kv.get("counter")
            assert entry is not None
            value = str(int(entry.value) + 1).encode()
            if await kv.update("counter", value, revision=entry.revision) is not None:
                return

    await asyncio.gather(*(add_one() for _ in range(20)))
    entry = await kv.get("counter")
    assert entry is not None
    assert entry.value == b"20"


async def test_a_bucket_not_declared_yet_reads_empty_and_refuses_writes(
    jetstream_bus: JetStreamBus,
) -> None:
    """A reader started before the bucket's writer: nothing yet, and no bucket made by the
    reader on first use; once declared, the same reader sees it."""
    js = jetstream_bus.client.jetstream()
    bucket = f"t{uuid.uuid4().hex[:8]}"
    reader = JetStreamKeyValue.of(js, bucket)
    assert await reader.get("status") is None
    assert await reader.entries() == []
    with pytest.raises(BucketMissingError):
        await reader.create("status", b"x")
    writer = await JetStreamKeyValue.declare(js, bucket)
    assert await writer.create("status", b"up") is not None
    entry = await reader.get("status")
    assert entry is not None
    assert entry.value == b"up"


async def test_the_pools_bucket_is_read_through_the_port() -> None:
    kv = InMemoryKeyValue()
    pools = PoolsBucket(kv)
    assert await pools.status() is None
    assert await pools.spend() is None
    now = datetime.now(UTC)
    spend = OwnersSpend(since=now.replace(day=1), at=now, by_owner={"ann": 12.5})
    assert await kv.create(SPEND_KEY, spend.model_dump_json().encode()) is not None
    assert await pools.spend() == spend


def _job(job_id: str, state: JobState) -> JobRecord:
    now = datetime.now(UTC)
    request = JobRequested(job_id=job_id, owner="ann", entrypoint=("python", "t.py"))
    return JobRecord(
        request=request, request_event_id=f"ev-{job_id}", state=state, accepted_at=now,
        updated_at=now,
    )  # fmt: skip


async def test_the_jobs_bucket_is_read_through_the_port(kv: KeyValue) -> None:
    """What the checkpointer and the client read: admitted jobs, the active among them,
    and a refused request's record from the bucket refusals are kept in."""
    refusals = InMemoryKeyValue()
    jobs = JobsBucket(kv, refusals)
    assert await jobs.get("running") is None
    assert await jobs.all() == []
    for record in (_job("running", JobState.RUNNING), _job("done", JobState.SUCCEEDED)):
        await kv.create(record.job_id, record.model_dump_json().encode())
    refused = _job("refused", JobState.REJECTED)
    await refusals.create(refused.job_id, refused.model_dump_json().encode())
    found = await jobs.get("running")
    assert found is not None
    assert found.state is JobState.RUNNING
    assert await jobs.get("refused") == refused
    assert await JobsBucket(kv).get("refused") is None, "without the refusals' bucket"
    assert sorted(r.job_id for r in await jobs.all()) == ["done", "running"]
    assert [r.job_id for r in await jobs.active()] == ["running"]
