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
    store = await KvDemandStore.open(
        jetstream_bus.client.jetstream(), pools_bucket(jetstream_bus.prefix)
    )
    await store.put(demand("job-1", 2))
    await store.put(demand("job-1", 1))  # attempt 1's queued event, delivered late
    await store.remove("job-1", 1)  # attempt 1's interruption, delivered late
    assert [(d.job_id, d.attempt) for d in await store.all()] == [("job-1", 2)]
    await store.remove("job-1", 2)
    await store.remove("job-1", 2)  # a repeat is a no-op
    assert await store.all() == []
