"""Each person's share of requests, kept in a bucket that the submitter's replicas share:
a person gets one share in all, not one from each replica, however their requests are
spread and however many land at once."""

from __future__ import annotations

import asyncio
import random

import pytest

from services.submitter.adapters.desk_allowances import (
    CONTENDED_RETRY_S,
    KvAllowances,
)
from shared.desk import ALLOWANCE_WHOLE_AFTER_S, REQUESTS_BURST, REQUESTS_PER_S, allowances_bucket
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.kv_store import InMemoryKeyValue

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def replicas(bus: JetStreamBus, clock: Clock, count: int = 2) -> list[KvAllowances]:
    opened = [await KvAllowances.open(bus, bus.prefix) for _ in range(count)]
    return [KvAllowances(replica._kv, clock) for replica in opened]  # one bucket, one clock


async def test_two_replicas_share_one_persons_burst(jetstream_bus: JetStreamBus) -> None:
    clock = Clock()
    one, two = await replicas(jetstream_bus, clock)
    for n in range(REQUESTS_BURST):
        assert await (one if n % 2 else two).take("alice") is None
    wait_s = await one.take("alice")
    assert wait_s == pytest.approx(1 / REQUESTS_PER_S)
    assert await two.take("alice") is not None
    assert await two.take("bob") is None, "bob's share is his own"
    clock.now += 1 / REQUESTS_PER_S
    assert await two.take("alice") is None, "one more, once its time came"
    # Kept in one replica's memory instead, each replica would give the whole burst again.
    assert await KvAllowances(InMemoryKeyValue(), clock).take("alice") is None


async def test_requests_at_once_on_several_replicas_are_each_counted(
    jetstream_bus: JetStreamBus,
) -> None:
    """Compare-and-set: replicas answering alice at the same moment neither lose a count
    nor give more than her share. A request that lost every try is told to come again at
    once, as the client does."""
    clock = Clock()
    spread = await replicas(jetstream_bus, clock, count=4)

    async def ask(replica: KvAllowances) -> float | None:
        for _ in range(1000):
            if (wait_s := await replica.take("alice")) != CONTENDED_RETRY_S:
                return wait_s
            await asyncio.sleep(random.uniform(0, CONTENDED_RETRY_S))  # noqa: S311
        raise AssertionError("contended for ever")

    asked = REQUESTS_BURST + 40
    waits = await asyncio.gather(*(ask(spread[n % 4]) for n in range(asked)))
    assert sum(wait is None for wait in waits) == REQUESTS_BURST
    assert all(wait == pytest.approx(1 / REQUESTS_PER_S) for wait in waits if wait is not None)


async def test_the_bucket_forgets_a_person_once_their_share_is_whole(
    jetstream_bus: JetStreamBus,
) -> None:
    js = jetstream_bus.client.jetstream()
    await KvAllowances.open(jetstream_bus, jetstream_bus.prefix)
    info = await js.stream_info(f"KV_{allowances_bucket(jetstream_bus.prefix)}")
    assert info.config.max_age is not None
    assert info.config.max_age >= ALLOWANCE_WHOLE_AFTER_S
    assert info.config.max_msgs_per_subject == 1
