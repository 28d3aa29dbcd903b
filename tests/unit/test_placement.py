"""Which queued attempt takes which room (`services.scaler.policy.plan`'s placements): the
platform's order, named ready nodes, avoided nodes, held room, and no gang starved."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scaler.model import BlockedReason, Demand, NodeView, PoolSpec, ScalerConfig
from services.scaler.policy import placement_order, plan
from services.scaler.policy.packing import queue_positions
from shared.events.types import Bundle, CapacityClass

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPOT = PoolSpec(
    name="gpu-spot",
    capacity=CapacityClass.SPOT,
    gpus=2,
    cpus=8,
    price_per_hour_usd=1.0,
    max_nodes=2,
)
CONFIG = ScalerConfig(budget_per_hour_usd=100, idle_timeout_s=60, settle_s=0)


def demand(
    job: str,
    *,
    gpus: int = 1,
    workers: int = 1,
    priority: int = 5,
    waited_s: float = 0,
    avoid: tuple[str, ...] = (),
    placed_on: tuple[str, ...] = (),
    deadline_in_s: float | None = None,
    work_left_s: float | None = None,
) -> Demand:
    return Demand(
        job_id=job,
        attempt=1,
        bundles=(Bundle(gpus=gpus, cpus=1),) * workers,
        capacity=CapacityClass.SPOT,
        priority=priority,
        queued_at=NOW - timedelta(seconds=waited_s),
        avoid_nodes=avoid,
        placed_on=placed_on,
        deadline=NOW + timedelta(seconds=deadline_in_s) if deadline_in_s is not None else None,
        work_left_s=work_left_s,
    )


def node(name: str, *, free_gpus: int = 2, ready: bool = True, draining: bool = False) -> NodeView:
    free = SPOT.shape.model_copy(update={"gpus": free_gpus})
    return NodeView(name=name, pool=SPOT.name, ready=ready, free=free, draining=draining)


def placed(nodes: list[NodeView], demands: list[Demand]) -> dict[str, tuple[str, ...]]:
    return {p.job_id: p.nodes for p in plan((SPOT,), nodes, demands, CONFIG, NOW).placements}


@pytest.mark.parametrize(
    ("nodes", "demands", "expected"),
    [
        pytest.param([node("n1")], [demand("a")], {"a": ("n1",)}, id="room-on-a-ready-node"),
        pytest.param([node("n1", ready=False)], [demand("a")], {}, id="booting-node-waits"),
        pytest.param([node("n1", draining=True)], [demand("a")], {}, id="draining-node-none"),
        pytest.param(
            [node("n1"), node("n2")],
            [demand("a", avoid=("n1",))],
            {"a": ("n2",)},
            id="avoided-node-skipped",
        ),
        pytest.param(
            [node("n1")], [demand("a", avoid=("n1",))], {}, id="only-an-avoided-node-none"
        ),
        pytest.param(
            [node("n1"), node("n2")],
            [demand("gang", workers=2, gpus=2)],
            {"gang": ("n1", "n2")},
            id="a-gang-all-at-once",
        ),
        pytest.param(
            [node("n1"), node("n2", ready=False)],
            [demand("gang", workers=2, gpus=2)],
            {},
            id="a-gang-half-booting-waits-whole",
        ),
        pytest.param(
            [node("n1", free_gpus=1)],
            [demand("high", priority=9), demand("low", priority=1, waited_s=60)],
            {"high": ("n1",)},
            id="higher-priority-first",
        ),
        pytest.param(
            [node("n1", free_gpus=1)],
            [demand("young"), demand("old", waited_s=60)],
            {"old": ("n1",)},
            id="then-the-oldest",
        ),
        pytest.param(
            [node("n1", free_gpus=1)],
            [demand("b-held", placed_on=("n1",)), demand("a-new", waited_s=60)],
            {},
            id="held-room-is-not-given-again",
        ),
        pytest.param(
            [node("n2")],
            [demand("a", placed_on=("n1",))],
            {"a": ("n2",)},
            id="placed-on-a-node-that-went-placed-again",
        ),
    ],
)
def test_placements(
    nodes: list[NodeView], demands: list[Demand], expected: dict[str, tuple[str, ...]]
) -> None:
    assert placed(nodes, demands) == expected


def test_a_deadline_job_behind_its_reserve_goes_before_higher_priority() -> None:
    urgent = demand("urgent", priority=1, deadline_in_s=3600, work_left_s=3300)
    relaxed = demand("relaxed", priority=1, deadline_in_s=36000, work_left_s=3300)
    high = demand("high", priority=9)
    order = [d.job_id for d in placement_order([high, relaxed, urgent], NOW)]
    assert order == ["urgent", "high", "relaxed"]


def test_a_gang_at_the_pools_limit_is_not_starved_by_later_small_jobs() -> None:
    """The pool is at its maximum (two nodes) with one GPU free on each: the older gang
    of two 2-GPU workers cannot go, and the room it finds is held for it, so the small
    job queued after it takes none (reservation, no backfill into held room)."""
    nodes = [node("n1", free_gpus=1), node("n2", free_gpus=1)]
    gang = demand("gang", gpus=2, workers=2, waited_s=600)
    small = demand("small", gpus=1)
    decided = plan((SPOT,), nodes, [gang, small], CONFIG, NOW)
    assert decided.placements == ()
    [blocked] = [b for b in decided.blocked if b.job_id == "gang"]
    assert blocked.reason is BlockedReason.POOL_AT_MAX
    # Once room frees on both nodes, the gang goes first.
    free = [node("n1"), node("n2")]
    assert placed(free, [gang, small]) == {"gang": ("n1", "n2")}


def test_a_two_gpu_job_at_the_limit_holds_half_a_node_against_one_gpu_jobs() -> None:
    nodes = [node("n1", free_gpus=1), node("n2", free_gpus=1)]
    big = demand("big", gpus=2, waited_s=600)
    small = demand("small", gpus=1)
    assert placed(nodes, [big, small]) == {"small": ("n2",)}


def test_a_small_job_backfills_room_no_waiting_gang_can_use() -> None:
    """A higher-ranked gang that is bought nodes of its own leaves today's room to others."""
    roomy = PoolSpec.model_validate({**SPOT.model_dump(), "max_nodes": 10})
    nodes = [node("n1", free_gpus=1)]
    gang = demand("gang", gpus=2, workers=2, waited_s=600)
    small = demand("small", gpus=1)
    decided = plan((roomy,), nodes, [gang, small], CONFIG, NOW)
    assert {p.job_id: p.nodes for p in decided.placements} == {"small": ("n1",)}
    assert decided.target("gpu-spot") == 3


nodes_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.booleans(), st.booleans()),  # free GPUs, ready, draining
    min_size=0,
    max_size=6,
)
demands_strategy = st.lists(
    st.tuples(
        st.integers(1, 2),  # GPUs per worker
        st.integers(1, 3),  # workers
        st.integers(0, 9),  # priority
        st.sets(st.integers(0, 5), max_size=2),  # avoided node indexes
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(shape=nodes_strategy, wanted=demands_strategy)
def test_placements_use_only_free_room_on_ready_nodes_never_an_avoided_one(
    shape: list[tuple[int, bool, bool]], wanted: list[tuple[int, int, int, set[int]]]
) -> None:
    nodes = [
        node(f"n{i}", free_gpus=gpus, ready=ready, draining=draining)
        for i, (gpus, ready, draining) in enumerate(shape)
    ]
    demands = [
        demand(
            f"j{k}",
            gpus=g,
            workers=w,
            priority=p,
            avoid=tuple(f"n{i}" for i in avoid),
        )
        for k, (g, w, p, avoid) in enumerate(wanted)
    ]
    decided = plan((SPOT,), nodes, demands, CONFIG, NOW)
    by_name = {n.name: n for n in nodes}
    by_job = {d.job_id: d for d in demands}
    taken: dict[str, int] = {}
    for placement in decided.placements:
        wanted_demand = by_job[placement.job_id]
        assert len(placement.nodes) == len(wanted_demand.bundles), "all of a gang or none"
        for name, bundle in zip(placement.nodes, wanted_demand.bundles, strict=True):
            view = by_name[name]
            assert view.ready
            assert not view.draining
            assert name not in wanted_demand.avoid_nodes
            taken[name] = taken.get(name, 0) + bundle.gpus
    for name, gpus in taken.items():
        assert gpus <= by_name[name].free.gpus, f"{name} given more than it has free"


def test_a_deadline_job_keeps_waiting_for_the_spot_node_that_boots_for_it() -> None:
    """Its slack was enough for spot and a boot when the node was bought; while that node
    boots, the wait costs only the rest of its boot, so the decision holds (no second,
    on-demand node bought for the same job two seconds later)."""
    on_demand = PoolSpec(
        name="gpu-od", capacity=CapacityClass.ON_DEMAND, gpus=2, cpus=8,
        price_per_hour_usd=3.0, boot_time_s=15, max_nodes=2,
    )  # fmt: skip
    spot = SPOT.model_copy(update={"boot_time_s": 15})
    wanted = Demand(
        job_id="dl",
        attempt=1,
        bundles=(Bundle(gpus=2, cpus=1),),
        capacity=CapacityClass.ANY,
        queued_at=NOW,
        deadline=NOW + timedelta(seconds=237),
        work_left_s=190,
    )
    first = plan((spot, on_demand), [], [wanted], CONFIG, NOW)
    assert first.target("gpu-spot") == 1
    booting = NodeView(name="gpu-spot-1", pool="gpu-spot", ready=False, free=spot.shape, age_s=6)
    later = plan((spot, on_demand), [booting], [wanted], CONFIG, NOW + timedelta(seconds=6))
    assert (later.target("gpu-spot"), later.target("gpu-od")) == (1, 0)
    assert later.in_room == ("dl",)
    # Up 10 s after it was bought: the job is placed there, not sent to on-demand.
    up = booting.model_copy(update={"ready": True, "age_s": 10})
    placed_on = plan((spot, on_demand), [up], [wanted], CONFIG, NOW + timedelta(seconds=10))
    assert [(p.job_id, p.nodes) for p in placed_on.placements] == [("dl", ("gpu-spot-1",))]
    assert placed_on.target("gpu-od") == 0


def test_the_queue_says_each_attempts_place_and_why_it_waits() -> None:
    nodes = [node("n1", free_gpus=1)]
    held = demand("held", placed_on=("n1",), waited_s=90)
    gang = demand("gang", gpus=2, workers=3, waited_s=60, priority=7)
    small = demand("small", waited_s=30)
    decided = plan((SPOT,), nodes, [held, gang, small], CONFIG, NOW)
    queue = queue_positions([held, gang, small], decided, NOW)
    assert [(q.job_id, q.position) for q in queue] == [("gang", 1), ("held", 2), ("small", 3)]
    whys = {q.job_id: q.why for q in queue}
    assert whys["held"] == "placed on n1: Ray is starting it"
    assert whys["gang"].startswith("pool-at-max: gpu-spot would need")
    assert whys["small"] == "a node is being bought for it"


def test_growth_and_moves_take_room_but_hand_nothing_to_ray() -> None:
    """A running attempt's missing worker and room wanted for a move are placed in room
    (so nothing else takes it), yet they are no attempt waiting to be handed to Ray."""
    growth = demand("job-9.grow-0", waited_s=60)
    move = demand("job-8.move", waited_s=30)
    queued = demand("job-7")
    decided = plan(
        (SPOT,), [node("n1"), node("n2", free_gpus=1)], [growth, move, queued], CONFIG, NOW
    )
    assert [p.job_id for p in decided.placements] == ["job-7"]
    assert set(decided.in_room) == {"job-9.grow-0", "job-8.move", "job-7"}
    assert [q.job_id for q in queue_positions([growth, move, queued], decided, NOW)] == ["job-7"]
