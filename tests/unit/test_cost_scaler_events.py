"""The scaler says when each node starts and stops being billed: node.launched/released."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from services.scaler.handlers import Deps, on_job_queued, on_job_settled, reconcile
from services.scaler.model import PoolSpec, ScalerConfig
from shared.events import decode, new_event
from shared.events.data import (
    JobQueued,
    JobStarted,
    NodeEndSource,
    NodeLaunched,
    NodeReleased,
    ReleaseReason,
)
from shared.events.types import Bundle, CapacityClass
from shared.messaging.memory import InMemoryBus
from tests.events import NOW
from tests.fakes.clock import FixedClock
from tests.fakes.scaler import FakeCluster, scaler_deps

SPOT = PoolSpec(
    name="gpu-spot",
    capacity=CapacityClass.SPOT,
    gpus=2,
    cpus=4,
    gpu_type="nvidia-l4",
    price_per_hour_usd=0.68,
)
ON_DEMAND = SPOT.model_copy(
    update={"name": "gpu-on-demand", "capacity": CapacityClass.ON_DEMAND, "price_per_hour_usd": 1.7}
)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(NOW)


@pytest.fixture
def cluster(clock: FixedClock) -> FakeCluster:
    return FakeCluster(clock)


def make_deps(clock: FixedClock, cluster: FakeCluster, bus: InMemoryBus | None = None) -> Deps:
    config = ScalerConfig(budget_per_hour_usd=10, idle_timeout_s=60, settle_s=0)
    return scaler_deps(clock, cluster, (SPOT, ON_DEMAND), config, bus=bus)


@pytest.fixture
def deps(clock: FixedClock, cluster: FakeCluster) -> Deps:
    return make_deps(clock, cluster)


def node_events(deps: Deps) -> list[tuple[str, Any]]:
    """(event id, data) of the node lifetime events on the bus."""
    assert isinstance(deps.bus, InMemoryBus)
    events = [decode(m.data) for m in deps.bus.messages]
    return [(e.id, e.data) for e in events if isinstance(e.data, NodeLaunched | NodeReleased)]


async def queue_job(deps: Deps, job_id: str = "job-1") -> None:
    data = JobQueued(
        job_id=job_id,
        attempt=1,
        bundles=(Bundle(gpus=2),),
        capacity=CapacityClass.SPOT,
        priority=5,
    )
    await on_job_queued(new_event(data, source="submitter", time=NOW), deps)


async def test_a_launched_node_is_announced_once_with_its_shape_and_prices(deps: Deps) -> None:
    await queue_job(deps)
    await reconcile(deps)
    await reconcile(deps)
    [(event_id, launched)] = node_events(deps)
    assert event_id == "node-launched-gpu-spot-1"
    assert launched == NodeLaunched(
        node="gpu-spot-1",
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        gpus=2,
        gpu_type="nvidia-l4",
        cpus=4,
        price_per_hour_usd=0.68,
        on_demand_pool="gpu-on-demand",
        on_demand_price_per_hour_usd=1.7,
        launched_at=NOW,
    )


async def test_a_released_node_is_announced_as_scaled_down(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    await queue_job(deps)
    await reconcile(deps)
    started = JobStarted(job_id="job-1", attempt=1, submission_id="job-1-1")
    await on_job_settled(new_event(started, source="submitter", time=NOW), deps)
    cluster.idle_s["gpu-spot-1"] = 61
    clock.advance(timedelta(minutes=2))
    await reconcile(deps)
    await reconcile(deps)
    assert cluster.released == ["gpu-spot-1"]
    [_, (event_id, released)] = node_events(deps)
    assert event_id == "node-released-gpu-spot-1"
    assert released == NodeReleased(
        node="gpu-spot-1",
        pool="gpu-spot",
        reason=ReleaseReason.SCALED_DOWN,
        released_at=NOW + timedelta(minutes=2),
    )


async def test_a_node_that_vanishes_unasked_ends_where_the_provider_recorded_its_end(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """A preempted node drops out of the provider's list: its billing ends when the
    provider says it stopped, not when the scaler noticed."""
    await queue_job(deps)
    await reconcile(deps)
    clock.advance(timedelta(seconds=30))
    cluster.stop("gpu-spot-1")
    clock.advance(timedelta(seconds=7))
    await reconcile(deps)
    await reconcile(deps)
    ended = [data for _, data in node_events(deps) if isinstance(data, NodeReleased)]
    assert ended == [
        NodeReleased(
            node="gpu-spot-1",
            pool="gpu-spot",
            reason=ReleaseReason.GONE,
            released_at=NOW + timedelta(seconds=30),
            end_source=NodeEndSource.RECORDED,
        )
    ]


async def test_a_node_gone_without_a_record_ends_where_it_was_last_listed(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """No record of its end: the last pass that listed it is the last known alive."""
    await queue_job(deps)
    await reconcile(deps)
    clock.advance(timedelta(seconds=10))
    await reconcile(deps)  # lists it
    clock.advance(timedelta(seconds=20))
    cluster.stop("gpu-spot-1", recorded=False)
    clock.advance(timedelta(seconds=5))
    await reconcile(deps)
    ended = [data for _, data in node_events(deps) if isinstance(data, NodeReleased)]
    assert [(e.released_at, e.end_source) for e in ended] == [
        (NOW + timedelta(seconds=10), NodeEndSource.LAST_SEEN)
    ]


async def test_a_restarted_scaler_announces_the_nodes_it_finds_from_their_launch_time(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """The same event id: within the bus's window, the repeat is stored once; after it,
    cost accounting keeps a node's first launch."""
    await queue_job(deps)
    await reconcile(deps)
    clock.advance(timedelta(minutes=5))
    assert isinstance(deps.bus, InMemoryBus)
    restarted = make_deps(clock, cluster, bus=deps.bus)
    await reconcile(restarted)
    launches = [data for _, data in node_events(restarted) if isinstance(data, NodeLaunched)]
    assert [(n.node, n.launched_at) for n in launches] == [("gpu-spot-1", NOW)]
    fresh = make_deps(clock, cluster)
    await reconcile(fresh)
    [(event_id, launched)] = node_events(fresh)
    assert (event_id, launched.launched_at) == ("node-launched-gpu-spot-1", NOW)


async def test_an_on_demand_node_is_its_own_baseline(deps: Deps) -> None:
    data = JobQueued(
        job_id="job-od",
        attempt=1,
        bundles=(Bundle(gpus=2),),
        capacity=CapacityClass.ON_DEMAND,
        priority=5,
    )
    await on_job_queued(new_event(data, source="submitter", time=NOW), deps)
    await reconcile(deps)
    [(_, launched)] = node_events(deps)
    assert (launched.on_demand_pool, launched.on_demand_price_per_hour_usd) == (
        "gpu-on-demand",
        1.7,
    )


async def test_a_node_whose_end_record_cannot_be_read_waits_for_it(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """Closed at a guess, a node could never be closed right: the pass leaves it open
    (billed up to its last sighting) and the next one closes it at its record."""
    await queue_job(deps)
    await reconcile(deps)
    clock.advance(timedelta(seconds=30))
    cluster.stop("gpu-spot-1")
    unreadable = cluster.ended

    async def failing(nodes: Any) -> Any:
        raise OSError("compute API: 503")

    cluster.ended = failing  # type: ignore[method-assign]
    clock.advance(timedelta(seconds=5))
    await reconcile(deps)
    assert [d for _, d in node_events(deps) if isinstance(d, NodeReleased)] == []
    cluster.ended = unreadable  # type: ignore[method-assign]
    await reconcile(deps)
    [released] = [d for _, d in node_events(deps) if isinstance(d, NodeReleased)]
    assert released.released_at == NOW + timedelta(seconds=30)
