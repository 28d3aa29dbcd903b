"""A node is one life of a machine (issue 36, 1 and 3): a VM its group makes again under its
name ends one node and starts another, on the ledger, in what the pool has learnt, and for
the job that lost it. The rules (`policy.lives`), then the scaler's passes through fakes."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scaler.handlers import Deps, on_job_queued, reconcile
from services.scaler.model import Demand, PoolSpec, ScalerConfig
from services.scaler.policy.lives import avoided, gone_reason, ledger_name, new_life
from shared.events import decode, new_event
from shared.events.data import JobPlaced, JobQueued, NodeLaunched, NodeReleased, ReleaseReason
from shared.events.types import Bundle, CapacityClass
from shared.messaging.memory import InMemoryBus
from shared.policy.cost.ledger import fold
from tests.events import NOW
from tests.fakes.clock import FixedClock
from tests.fakes.scaler import FakeCluster, scaler_deps

SPOT = PoolSpec(
    name="gpu-spot", capacity=CapacityClass.SPOT, gpus=2, cpus=4, price_per_hour_usd=1.0
)
ON_DEMAND = SPOT.model_copy(
    update={"name": "gpu-od", "capacity": CapacityClass.ON_DEMAND, "price_per_hour_usd": 3.0}
)


@pytest.mark.parametrize(
    ("billed", "listed", "recreating", "expected"),
    [
        pytest.param("111", "111", False, False, id="same-vm"),
        pytest.param("111", "222", False, True, id="another-vm-under-the-name"),
        pytest.param("111", None, True, True, id="being-made-again"),
        pytest.param(None, None, True, False, id="the-new-life-still-starting"),
        pytest.param(None, "222", False, False, id="the-new-life-got-its-vm"),
        pytest.param("111", None, False, False, id="life-not-said"),
        pytest.param(None, None, False, False, id="a-provider-without-lives"),
    ],
)
def test_new_life(billed: str | None, listed: str | None, recreating: bool, expected: bool) -> None:
    assert new_life(billed, listed, recreating=recreating) is expected


@pytest.mark.parametrize(
    ("taken", "expected"),
    [
        pytest.param(set(), "vm-1", id="first-life-keeps-the-name"),
        pytest.param({"vm-1"}, f"vm-1@{int(NOW.timestamp())}", id="next-life-named-apart"),
        pytest.param(
            {"vm-1", f"vm-1@{int(NOW.timestamp())}"},
            f"vm-1@{int(NOW.timestamp())}-2",
            id="two-in-one-second",
        ),
    ],
)
def test_ledger_name(taken: set[str], expected: str) -> None:
    assert ledger_name("vm-1", NOW, taken) == expected


@pytest.mark.parametrize(
    ("maintenance", "unwatched", "reason"),
    [
        pytest.param(False, False, ReleaseReason.GONE, id="taken-back"),
        pytest.param(True, False, ReleaseReason.MAINTENANCE, id="upgrade-or-repair"),
        pytest.param(False, True, ReleaseReason.GONE_WHILE_UNWATCHED, id="unwatched"),
        pytest.param(True, True, ReleaseReason.GONE_WHILE_UNWATCHED, id="unwatched-first"),
    ],
)
def test_gone_reason(maintenance: bool, unwatched: bool, reason: ReleaseReason) -> None:
    assert gone_reason(maintenance=maintenance, unwatched=unwatched) is reason


@given(st.lists(st.integers(min_value=0, max_value=5), max_size=12))
def test_ledger_names_never_repeat(starts: list[int]) -> None:
    taken: set[str] = set()
    for second in starts:
        name = ledger_name("vm-1", NOW + timedelta(seconds=second), taken)
        assert name not in taken
        taken.add(name)


def _demand(avoid: tuple[str, ...]) -> Demand:
    return Demand(
        job_id="job-1",
        attempt=2,
        bundles=(Bundle(gpus=2),),
        capacity=CapacityClass.SPOT,
        queued_at=NOW,
        avoid_nodes=avoid,
    )


@pytest.mark.parametrize(
    ("launched_s", "still_avoided"),
    [
        pytest.param(-60, True, id="launched-before-the-loss-may-be-the-lost-machine"),
        pytest.param(0, True, id="launched-as-it-was-queued"),
        pytest.param(30, False, id="made-again-since-another-machine"),
        pytest.param(None, True, id="not-listed"),
    ],
)
def test_a_lost_name_is_avoided_until_a_new_machine_is_behind_it(
    launched_s: int | None, still_avoided: bool
) -> None:
    launched = {} if launched_s is None else {"vm-1": NOW + timedelta(seconds=launched_s)}
    demand = avoided(_demand(("vm-1", "vm-2")), launched)
    assert ("vm-1" in demand.avoid_nodes) is still_avoided
    assert "vm-2" in demand.avoid_nodes


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(NOW)


@pytest.fixture
def cluster(clock: FixedClock) -> FakeCluster:
    return FakeCluster(clock)


@pytest.fixture
def deps(clock: FixedClock, cluster: FakeCluster) -> Deps:
    config = ScalerConfig(budget_per_hour_usd=10, idle_timeout_s=600, settle_s=0)
    return scaler_deps(clock, cluster, (SPOT, ON_DEMAND), config)


def _queued(capacity: CapacityClass = CapacityClass.SPOT, **more: Any) -> Any:
    data = JobQueued(
        job_id="job-1",
        attempt=1,
        bundles=(Bundle(gpus=2),),
        capacity=capacity,
        priority=5,
        **more,
    )
    return new_event(data, source="submitter", time=NOW)


def _node_events(deps: Deps) -> list[Any]:
    assert isinstance(deps.bus, InMemoryBus)
    found = [decode(m.data) for m in deps.bus.messages]
    return [e for e in found if isinstance(e.data, NodeLaunched | NodeReleased)]


async def _resumed_avoiding(name: str, deps: Deps, clock: FixedClock) -> None:
    """The job's first attempt lost `name`: ten minutes on, its second is queued avoiding it."""
    await deps.demand.remove("job-1", 1)
    clock.advance(timedelta(minutes=10))
    resumed = _queued(avoid_nodes=(name,))
    resumed = resumed.model_copy(
        update={"data": resumed.data.model_copy(update={"attempt": 2}), "time": clock.now()}
    )
    await on_job_queued(resumed, deps)


async def _one_spot_node(deps: Deps, cluster: FakeCluster) -> str:
    await on_job_queued(_queued(), deps)
    await reconcile(deps)
    [name] = cluster.launched
    cluster.lives[name] = "111"
    await reconcile(deps)
    return name


async def test_a_vm_made_again_under_its_name_ends_one_node_and_bills_the_next(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """Its first life closes at the provider's record of the preemption and counts as a
    take-back; the next is launched under its own ledger name from when it was seen being
    made, and adopts its VM once made. The ledger bills the two lives apart."""
    name = await _one_spot_node(deps, cluster)
    first_at = cluster.launched[name][1]
    clock.advance(timedelta(minutes=30))
    cluster.recreate(name)
    preempted_at = clock.now()
    clock.advance(timedelta(seconds=10))
    await reconcile(deps)
    events = _node_events(deps)
    released = [e.data for e in events if isinstance(e.data, NodeReleased)]
    assert [(r.node, r.reason.value, r.released_at) for r in released] == [
        (name, "gone", preempted_at)
    ]
    launched = [e.data for e in events if isinstance(e.data, NodeLaunched)]
    assert [(n.node, n.host, n.launched_at) for n in launched] == [
        (name, None, first_at),
        (f"{name}@{int(preempted_at.timestamp())}", name, preempted_at),
    ]
    assert deps.memory.knowledge["gpu-spot"].taken_back == 1
    cluster.boot_again(name, "222")
    await reconcile(deps)
    assert deps.billed_nodes[name].life == "222"
    assert len(_node_events(deps)) == 3, "the VM made for it is the same life"

    inputs = fold([*_node_events(deps)], prices={}, seen={})
    lives = sorted((n.node, n.start, n.end) for n in inputs.nodes)
    assert lives == [
        (name, first_at, preempted_at),
        (f"{name}@{int(preempted_at.timestamp())}", preempted_at, None),
    ]


async def test_a_vm_made_again_in_an_upgrade_is_maintenance_not_a_take_back(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    name = await _one_spot_node(deps, cluster)
    clock.advance(timedelta(minutes=5))
    cluster.recreate(name, maintenance=True)
    await reconcile(deps)
    released = [e.data for e in _node_events(deps) if isinstance(e.data, NodeReleased)]
    assert [r.reason.value for r in released] == ["maintenance"]
    assert deps.memory.knowledge["gpu-spot"].taken_back == 0


async def test_a_node_replaced_in_an_upgrade_is_maintenance(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """A surge upgrade deletes the node and makes another under a new name."""
    name = await _one_spot_node(deps, cluster)
    clock.advance(timedelta(minutes=5))
    cluster.stop(name)
    cluster.ends[name] = replace(cluster.ends[name], maintenance=True)
    await reconcile(deps)
    released = [e.data for e in _node_events(deps) if isinstance(e.data, NodeReleased)]
    assert [(r.node, r.reason.value) for r in released] == [(name, "maintenance")]
    assert deps.memory.knowledge["gpu-spot"].taken_back == 0


async def test_a_vm_made_again_into_a_stock_out_parks_the_pool(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """The recreation fails as a create would: the first life ends where it was taken
    back (billed to there), the name is removed, and an `any` job goes on-demand."""
    await on_job_queued(_queued(CapacityClass.ANY), deps)
    await reconcile(deps)
    [name] = cluster.launched
    assert cluster.launched[name][0].name == "gpu-spot"
    cluster.lives[name] = "111"
    await reconcile(deps)
    clock.advance(timedelta(minutes=20))
    cluster.recreate(name)
    taken_at = clock.now()
    cluster.unstarted[name] = "ZONE_RESOURCE_POOL_EXHAUSTED in europe-west4-a"
    await reconcile(deps)
    released = [e.data for e in _node_events(deps) if isinstance(e.data, NodeReleased)]
    assert [(r.node, r.reason.value, r.released_at) for r in released] == [(name, "gone", taken_at)]
    assert name in cluster.released
    assert deps.memory.knowledge["gpu-spot"].stock_outs == 1
    assert deps.memory.out_of_capacity_until.keys() == {"gpu-spot"}


async def test_a_job_that_lost_a_vm_may_run_on_the_vm_made_again_under_its_name(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """Its resumed attempt avoids the name it lost; the machine made again under it since
    is another, and takes the attempt rather than a node bought to avoid it."""
    name = await _one_spot_node(deps, cluster)
    await _resumed_avoiding(name, deps, clock)
    clock.advance(timedelta(seconds=20))
    cluster.recreate(name)
    cluster.boot_again(name, "222")
    await reconcile(deps)
    assert list(cluster.launched) == [name], "no node bought to avoid a machine gone"
    assert isinstance(deps.bus, InMemoryBus)
    placed = [
        event.data
        for event in (decode(m.data) for m in deps.bus.messages)
        if isinstance(event.data, JobPlaced)
    ]
    assert [(p.attempt, p.nodes) for p in placed][-1] == (2, (name,))


async def test_a_job_avoids_a_lost_vm_not_made_again(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    name = await _one_spot_node(deps, cluster)
    await _resumed_avoiding(name, deps, clock)
    await reconcile(deps)
    assert len(cluster.launched) == 2, "another node for it"


async def test_a_restarted_scaler_knows_the_life_it_bills(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """The ledger says which machine each open node is: a scaler started after a
    recreation it did not see closes the life before, and bills the next apart."""
    name = await _one_spot_node(deps, cluster)
    clock.advance(timedelta(minutes=5))
    # The next pass's sighting says the VM was seen with its machine known.
    await reconcile(deps)
    cluster.recreate(name)
    cluster.boot_again(name, "333")
    assert isinstance(deps.bus, InMemoryBus)
    restarted = scaler_deps(
        clock,
        cluster,
        deps.pools,
        deps.config,
        bus=deps.bus,
        demand=deps.demand,
        status=deps.status,
    )
    clock.advance(timedelta(seconds=30))
    await reconcile(restarted)
    events = _node_events(deps)
    released = [e.data for e in events if isinstance(e.data, NodeReleased)]
    launched = [e.data for e in events if isinstance(e.data, NodeLaunched)]
    assert [r.node for r in released] == [name]
    assert [n.node for n in launched][-1].startswith(f"{name}@")
    assert restarted.billed_nodes[name].life == "333"
