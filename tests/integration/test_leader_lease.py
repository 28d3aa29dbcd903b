"""Leader leases on a real NATS bucket: two replicas keep one lease; the leader's loss
(its loop gone without a word, as a SIGKILL leaves it) hands over within the lease's
duration, and a clean stop at once."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from shared.leases import LeaseTimes
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.kv_store import JetStreamKeyValue
from shared.runtime.leadership import LeaderLease
from tests.async_helpers import eventually

pytestmark = pytest.mark.integration

TIMES = LeaseTimes(duration_s=2.0, renew_deadline_s=1.5, renew_every_s=0.25)


async def replicas(bus: JetStreamBus) -> tuple[LeaderLease, LeaderLease]:
    kv = await JetStreamKeyValue.declare(bus.client.jetstream(), f"t{uuid.uuid4().hex[:8]}")
    return (
        LeaderLease(kv, "scaler", "scaler-a", times=TIMES),
        LeaderLease(kv, "scaler", "scaler-b", times=TIMES),
    )


async def test_a_lost_leader_is_replaced_within_the_leases_duration(
    jetstream_bus: JetStreamBus,
) -> None:
    a, b = await replicas(jetstream_bus)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    keeping_a = asyncio.create_task(a.keep(stop_a))
    await eventually(lambda: a.leading, timeout_s=5, interval_s=0.05)
    keeping_b = asyncio.create_task(b.keep(stop_b))
    await asyncio.sleep(TIMES.duration_s)
    assert not b.leading, "the leader renews: the other follows"
    # The leader vanishes: no release, no more renewals.
    keeping_a.cancel()
    lost_at = time.monotonic()
    await eventually(lambda: b.leading, timeout_s=10, interval_s=0.05)
    failover_s = time.monotonic() - lost_at
    assert failover_s <= TIMES.duration_s + 2 * TIMES.renew_every_s + 0.5
    assert b.term == 2
    stop_b.set()
    await keeping_b


async def test_a_clean_stop_hands_over_at_once(jetstream_bus: JetStreamBus) -> None:
    a, b = await replicas(jetstream_bus)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    keeping_a = asyncio.create_task(a.keep(stop_a))
    await eventually(lambda: a.leading, timeout_s=5, interval_s=0.05)
    keeping_b = asyncio.create_task(b.keep(stop_b))
    stop_a.set()
    await keeping_a  # released
    stopped_at = time.monotonic()
    await eventually(lambda: b.leading, timeout_s=5, interval_s=0.02)
    assert time.monotonic() - stopped_at <= TIMES.renew_every_s + 0.5
    stop_b.set()
    await keeping_b
