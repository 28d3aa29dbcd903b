"""A bucket read whole, on a real JetStream: latest values only, deleted keys left out, a
key pattern kept to, the revisions good for compare-and-set, every value in every read,
and no consumer left behind on the server."""

from __future__ import annotations

import asyncio
import secrets

import nats.js.errors
import pytest
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from shared.messaging.jetstream import JetStreamBus
from shared.messaging.kv import latest_entries

pytestmark = pytest.mark.integration


async def _bucket(jetstream_bus: JetStreamBus, history: int = 5) -> tuple[str, KeyValue]:
    js = jetstream_bus.client.jetstream()
    bucket = f"t{secrets.token_hex(4)}"
    return bucket, await js.create_key_value(KeyValueConfig(bucket=bucket, history=history))


async def test_each_key_once_with_its_latest_value_and_revision(
    jetstream_bus: JetStreamBus,
) -> None:
    js = jetstream_bus.client.jetstream()
    bucket, kv = await _bucket(jetstream_bus)
    assert await latest_entries(js, bucket) == []
    await kv.put("job-1", b"first")
    await kv.put("job-2", b"only")
    await kv.put("job-1", b"second")
    await kv.put("gone", b"soon")
    await kv.delete("gone")
    await kv.put("purged", b"soon")
    await kv.purge("purged")
    await kv.put("demand.job-1", b"wanted")

    entries = {entry.key: entry for entry in await latest_entries(js, bucket)}
    assert {key: entry.value for key, entry in entries.items()} == {
        "job-1": b"second",
        "job-2": b"only",
        "demand.job-1": b"wanted",
    }
    # The revision read is the one a compare-and-set update must name.
    await kv.update("job-1", b"third", last=entries["job-1"].revision)
    assert [(e.key, e.value) for e in await latest_entries(js, bucket, "demand.>")] == [
        ("demand.job-1", b"wanted")
    ]


async def test_every_read_sees_every_value_and_leaves_no_consumer(
    jetstream_bus: JetStreamBus,
) -> None:
    # nats-py's watch came back empty about once in 300 reads on an idle machine (its "all
    # delivered" marker raced the values) and left a consumer per read on the server.
    js = jetstream_bus.client.jetstream()
    bucket, kv = await _bucket(jetstream_bus, history=1)
    await kv.put("status", b"not asked for")
    for n in range(3):
        await kv.put(f"demand.job-{n}", b"wanted")
    await kv.put("demand.gone", b"wanted")
    await kv.delete("demand.gone")

    counts = [len(await latest_entries(js, bucket, "demand.>")) for _ in range(300)]
    at_once = await asyncio.gather(*(latest_entries(js, bucket) for _ in range(20)))
    counts += [len(entries) for entries in at_once]

    assert set(counts[:300]) == {3}
    assert set(counts[300:]) == {4}
    assert (await js.stream_info(f"KV_{bucket}")).state.consumer_count == 0


async def test_a_bucket_larger_than_one_fetch(jetstream_bus: JetStreamBus) -> None:
    js = jetstream_bus.client.jetstream()
    bucket, kv = await _bucket(jetstream_bus, history=1)
    await asyncio.gather(*(kv.put(f"job-{n}", str(n).encode()) for n in range(1_100)))

    entries = await latest_entries(js, bucket)

    assert sorted(int(e.value or b"") for e in entries) == list(range(1_100))


async def test_a_bucket_that_does_not_exist_is_an_error_to_the_caller(
    jetstream_bus: JetStreamBus,
) -> None:
    with pytest.raises(nats.js.errors.NotFoundError):
        await latest_entries(jetstream_bus.client.jetstream(), f"none{secrets.token_hex(4)}")
