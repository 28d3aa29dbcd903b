"""A bucket read whole in one watch, on a real JetStream: latest values only, deleted keys
left out, a key pattern kept to, the revisions good for compare-and-set."""

from __future__ import annotations

import secrets

import pytest
from nats.js.api import KeyValueConfig

from shared.messaging.jetstream import JetStreamBus
from shared.messaging.kv import latest_entries

pytestmark = pytest.mark.integration


async def test_each_key_once_with_its_latest_value_and_revision(
    jetstream_bus: JetStreamBus,
) -> None:
    js = jetstream_bus.client.jetstream()
    kv = await js.create_key_value(KeyValueConfig(bucket=f"t{secrets.token_hex(4)}", history=5))
    assert await latest_entries(kv) == []
    await kv.put("job-1", b"first")
    await kv.put("job-2", b"only")
    await kv.put("job-1", b"second")
    await kv.put("gone", b"soon")
    await kv.delete("gone")
    await kv.put("demand.job-1", b"wanted")

    entries = {entry.key: entry for entry in await latest_entries(kv)}
    assert {key: entry.value for key, entry in entries.items()} == {
        "job-1": b"second",
        "job-2": b"only",
        "demand.job-1": b"wanted",
    }
    # The revision read is the one a compare-and-set update must name.
    await kv.update("job-1", b"third", last=entries["job-1"].revision)
    assert [(e.key, e.value) for e in await latest_entries(kv, "demand.>")] == [
        ("demand.job-1", b"wanted")
    ]
