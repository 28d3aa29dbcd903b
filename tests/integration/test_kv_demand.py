"""The scaler's demand bucket on a real JetStream: one key per job, the latest attempt wins."""

from __future__ import annotations

import pytest

from services.scaler.adapters.kv_demand import KvDemandStore
from services.scaler.model import Demand
from shared.events.types import Bundle, CapacityClass
from shared.messaging.jetstream import JetStreamBus
from shared.pools import pools_bucket
from tests.events import NOW

pytestmark = pytest.mark.integration


def demand(job_id: str, attempt: int) -> Demand:
    return Demand(
        job_id=job_id,
        attempt=attempt,
        bundles=(Bundle(gpus=1),),
        capacity=CapacityClass.SPOT,
        queued_at=NOW,
    )


async def test_a_late_event_of_a_lost_attempt_keeps_the_demand_of_the_next(
    jetstream_bus: JetStreamBus,
) -> None:
    store = await KvDemandStore.open(jetstream_bus, pools_bucket(jetstream_bus.prefix))
    await store.put(demand("job-1", 2))
    await store.put(demand("job-1", 1))  # attempt 1's queued event, delivered late
    await store.remove("job-1", 1)  # attempt 1's interruption, delivered late
    assert [(d.job_id, d.attempt) for d in await store.all()] == [("job-1", 2)]
    await store.remove("job-1", 2)
    await store.remove("job-1", 2)  # a repeat is a no-op
    assert await store.all() == []


async def test_a_placement_holds_only_the_very_demand_it_was_decided_for(
    jetstream_bus: JetStreamBus,
) -> None:
    """Compare-and-set on the real bucket: a demand withdrawn (its job cancelled) or queued
    anew between the pass's read and its write is not brought back or overwritten."""
    store = await KvDemandStore.open(jetstream_bus, pools_bucket(jetstream_bus.prefix))
    await store.put(demand("job-1", 1))
    [read] = await store.all()
    assert await store.place(read, ("gpu-spot-1",))
    [held] = await store.all()
    assert held.placed_on == ("gpu-spot-1",)
    assert not await store.place(read, ("gpu-spot-2",)), "the stored one changed since"
    again = demand("job-1", 1).model_copy(update={"requeued": 1})
    await store.put(again)  # Ray could not start it: queued anew, placed on nothing
    await store.put(held)  # the older queueing, late: kept out
    [stored] = await store.all()
    assert (stored.requeued, stored.placed_on) == (1, ())
    await store.remove("job-1", 1)
    assert not await store.place(stored, ("gpu-spot-1",)), "withdrawn: nothing comes back"
    assert await store.all() == []
