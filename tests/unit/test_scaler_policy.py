"""The scaling policy: just enough nodes of the cheapest allowed pool, never past a limit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scaler.model import (
    BlockedReason,
    Demand,
    NodeView,
    ObservedNode,
    PoolSpec,
    ProvidedNode,
    Reason,
    ScalerConfig,
)
from services.scaler.policy import node_views, plan, preemption_risk
from shared.events.types import Bundle, CapacityClass
from shared.policy.deadline import SpotOutlook

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SPOT = PoolSpec(
    name="gpu-spot",
    capacity=CapacityClass.SPOT,
    gpus=2,
    cpus=8,
    price_per_hour_usd=1.0,
    max_nodes=4,
)
ON_DEMAND = PoolSpec(
    name="gpu-od",
    capacity=CapacityClass.ON_DEMAND,
    gpus=2,
    cpus=8,
    price_per_hour_usd=3.0,
    max_nodes=4,
)
CPU = PoolSpec(
    name="cpu",
    capacity=CapacityClass.ON_DEMAND,
    gpus=0,
    cpus=4,
    price_per_hour_usd=0.2,
    max_nodes=4,
)
POOLS = (SPOT, ON_DEMAND, CPU)
CONFIG = ScalerConfig(budget_per_hour_usd=100, idle_timeout_s=60, any_fallback_after_s=300)


def demand(
    job: str = "job-1",
    *,
    gpus: int = 2,
    workers: int = 1,
    capacity: CapacityClass = CapacityClass.SPOT,
    waited_s: float = 0,
    cpus: float = 1,
) -> Demand:
    return Demand(
        job_id=job,
        attempt=1,
        bundles=(Bundle(gpus=gpus, cpus=cpus),) * workers,
        capacity=capacity,
        queued_at=NOW - timedelta(seconds=waited_s),
    )


def node(name: str, pool: PoolSpec, *, free_gpus: int | None = None, idle_s: float = 0) -> NodeView:
    free = pool.shape if free_gpus is None else pool.shape.model_copy(update={"gpus": free_gpus})
    return NodeView(name=name, pool=pool.name, ready=True, free=free, idle_s=idle_s)


def targets(
    nodes: list[NodeView], demands: list[Demand], config: ScalerConfig = CONFIG
) -> dict[str, int]:
    decided = plan(POOLS, nodes, demands, config, NOW)
    return {p.pool: p.target for p in decided.pools}


def sizes(spot: int, on_demand: int = 0, cpu: int = 0) -> dict[str, int]:
    return {"gpu-spot": spot, "gpu-od": on_demand, "cpu": cpu}


OD, ANY = CapacityClass.ON_DEMAND, CapacityClass.ANY
IDLE = node("s1", SPOT, idle_s=120)


@pytest.mark.parametrize(
    ("nodes", "demands", "expected"),
    [
        pytest.param([], [demand(gpus=2)], sizes(1), id="two-gpus-one-node"),
        pytest.param([], [demand(gpus=2, workers=3)], sizes(3), id="gang-of-three"),
        pytest.param([], [demand(gpus=1), demand("j2", gpus=1)], sizes(1), id="jobs-share-node"),
        pytest.param([node("s1", SPOT)], [demand(gpus=2)], sizes(1), id="free-room-first"),
        pytest.param([], [demand(capacity=OD)], sizes(0, 1), id="on-demand-job"),
        pytest.param([], [demand(capacity=ANY)], sizes(1), id="any-prefers-spot"),
        pytest.param([], [demand(gpus=0, cpus=2, capacity=OD)], sizes(0, 0, 1), id="cpu-job"),
        pytest.param([IDLE], [], sizes(0), id="idle-node-released"),
        pytest.param([node("s1", SPOT, idle_s=30)], [], sizes(1), id="settling-idle-holds"),
        pytest.param([IDLE], [demand(gpus=2)], sizes(1), id="idle-node-kept-for-demand"),
        pytest.param([node("s1", SPOT, free_gpus=0)], [], sizes(1), id="busy-node-kept"),
    ],
)
def test_just_enough_nodes(
    nodes: list[NodeView], demands: list[Demand], expected: dict[str, int]
) -> None:
    assert targets(nodes, demands) == expected


def test_a_spot_job_never_lands_on_on_demand_room() -> None:
    assert targets([node("o1", ON_DEMAND)], [demand(gpus=2)])["gpu-spot"] == 1


def test_an_any_job_falls_back_to_on_demand_when_spot_is_full() -> None:
    full = [node(f"s{i}", SPOT, free_gpus=0) for i in range(4)]
    waiting = demand(capacity=CapacityClass.ANY, waited_s=600)
    assert targets(full, [waiting]) == {"gpu-spot": 4, "gpu-od": 1, "cpu": 0}
    fresh = demand(capacity=CapacityClass.ANY, waited_s=10)
    decided = plan(POOLS, full, [fresh], CONFIG, NOW)
    assert [b.reason for b in decided.blocked] == [BlockedReason.POOL_AT_MAX]


def with_deadline(waited_s: float, hours_left: float, work_h: float) -> Demand:
    return demand(capacity=CapacityClass.ANY, waited_s=waited_s).model_copy(
        update={"deadline": NOW + timedelta(hours=hours_left), "work_left_s": work_h * 3600}
    )


@pytest.mark.parametrize(
    ("spot_full", "waited_s", "hours_left", "work_h", "on_demand"),
    [
        pytest.param(True, 600, 12, 4, False, id="slack-waits-for-spot-past-the-fixed-wait"),
        pytest.param(True, 10, 4.1, 4, True, id="no-slack-takes-on-demand-at-once"),
        pytest.param(True, 10, 4.5, 4, True, id="below-the-reserve-takes-on-demand"),
        pytest.param(False, 10, 4.1, 4, False, id="spot-to-be-had-is-taken-even-when-tight"),
        pytest.param(True, 10, 2, 4, True, id="late-anyway-runs-on-on-demand"),
    ],
)
def test_an_any_job_with_a_deadline_falls_back_by_the_deadline_policy(
    spot_full: bool, waited_s: float, hours_left: float, work_h: float, on_demand: bool
) -> None:
    """The same `shared.policy.deadline` the simulator runs: not a fixed wait."""
    full = [node(f"s{i}", SPOT, free_gpus=0) for i in range(4)] if spot_full else []
    waiting = with_deadline(waited_s, hours_left, work_h)
    grown = targets(full, [waiting])
    assert (grown["gpu-od"] == 1) is on_demand
    if not spot_full:
        assert grown["gpu-spot"] == 1


def test_a_deadline_job_waits_out_a_stock_out_while_its_slack_lasts() -> None:
    """Every spot pool out of capacity sends a plain `any` job to on-demand; one with slack
    to spare waits for spot instead, and takes on-demand once the slack runs low."""
    unavailable = frozenset({"gpu-spot"})
    relaxed = plan(POOLS, [], [with_deadline(10, 12, 4)], CONFIG, NOW, unavailable=unavailable)
    assert relaxed.target("gpu-od") == 0
    tight = plan(POOLS, [], [with_deadline(10, 4.5, 4)], CONFIG, NOW, unavailable=unavailable)
    assert tight.target("gpu-od") == 1
    plain = demand(capacity=CapacityClass.ANY, waited_s=10)
    assert plan(POOLS, [], [plain], CONFIG, NOW, unavailable=unavailable).target("gpu-od") == 1


def test_a_job_whose_pools_are_all_stocked_out_says_so() -> None:
    """Not "no spot pool is configured": there is one, out of capacity for now."""
    decided = plan(POOLS, [], [demand(gpus=2)], CONFIG, NOW, unavailable=frozenset({"gpu-spot"}))
    [blocked] = decided.blocked
    assert blocked.reason is BlockedReason.OUT_OF_CAPACITY
    assert blocked.pool == "gpu-spot"
    assert blocked.detail == (
        "every pool it may use is out of capacity (gpu-spot): growth is tried again 300 s "
        "after it failed"
    )
    unconfigured = plan((ON_DEMAND, CPU), [], [demand(gpus=2)], CONFIG, NOW)
    assert [b.reason for b in unconfigured.blocked] == [BlockedReason.NO_POOL_FITS]


def test_a_job_over_the_budget_is_blocked_and_takes_nothing() -> None:
    config = CONFIG.model_copy(update={"budget_per_hour_usd": 2.5})
    decided = plan(POOLS, [], [demand(gpus=2, workers=3)], config, NOW)
    assert decided.target("gpu-spot") == 0
    [blocked] = decided.blocked
    assert blocked.reason is BlockedReason.OVER_BUDGET
    assert blocked.detail == (
        "3 more gpu-spot node(s) would cost $3.00/h in all, over the budget of $2.50/h"
    )


def test_a_bundle_bigger_than_every_node_is_blocked() -> None:
    decided = plan(POOLS, [], [demand(gpus=4)], CONFIG, NOW)
    assert decided.blocked[0].reason is BlockedReason.NO_POOL_FITS


def test_pools_are_kept_at_their_minimum() -> None:
    warm = SPOT.model_copy(update={"min_nodes": 1})
    decided = plan((warm,), [], [], CONFIG, NOW)
    assert decided.pools[0].target == 1
    assert decided.pools[0].reason is Reason.BELOW_MIN


bundles = st.builds(Bundle, gpus=st.integers(0, 2), cpus=st.sampled_from([0.5, 1.0, 2.0]))
demands = st.lists(
    st.builds(
        Demand,
        job_id=st.uuids().map(str),
        attempt=st.just(1),
        bundles=st.lists(bundles, min_size=1, max_size=4).map(tuple),
        capacity=st.sampled_from(CapacityClass),
        priority=st.integers(0, 9),
        queued_at=st.just(NOW) | st.just(NOW - timedelta(hours=1)),
    ),
    max_size=12,
)
budgets = st.floats(0, 20)


@settings(max_examples=200, deadline=None)
@given(demands=demands, budget=budgets, busy=st.integers(0, 4))
def test_never_above_max_or_budget_and_every_new_node_hosts_demand(
    demands: list[Demand], budget: float, busy: int
) -> None:
    config = CONFIG.model_copy(update={"budget_per_hour_usd": budget})
    nodes = [node(f"s{i}", SPOT, free_gpus=0) for i in range(busy)]
    decided = plan(POOLS, nodes, demands, config, NOW)
    by_name = {p.name: p for p in POOLS}
    existing_cost = busy * SPOT.price_per_hour_usd
    total_cost = sum(by_name[p.pool].price_per_hour_usd * p.target for p in decided.pools)
    for pool_plan in decided.pools:
        assert pool_plan.target <= by_name[pool_plan.pool].max_nodes
    # Never over the budget, unless the nodes already running were over it on their own.
    assert total_cost <= max(budget, existing_cost) + 1e-6
    # Every launched node hosts at least one bundle: fewer bundles, fewer nodes.
    launched = sum(p.target - p.current for p in decided.pools if p.target > p.current)
    placed = sum(
        len(d.bundles) for d in demands if d.job_id not in {b.job_id for b in decided.blocked}
    )
    assert launched <= placed


@settings(max_examples=100, deadline=None)
@given(demands=demands)
def test_with_room_to_grow_nothing_is_starved(demands: list[Demand]) -> None:
    """Under a generous budget and limits, every job that fits a node shape gets placed."""
    roomy = tuple(p.model_copy(update={"max_nodes": 100}) for p in POOLS)
    config = CONFIG.model_copy(update={"budget_per_hour_usd": 10_000, "max_launch_per_pool": 100})
    decided = plan(roomy, [], demands, config, NOW)
    assert decided.blocked == ()


@pytest.mark.parametrize(
    ("waited_s", "held"),
    [
        pytest.param(10, True, id="queued-before-the-launch-may-be-what-it-was-bought-for"),
        pytest.param(5, True, id="queued-as-it-launched"),
        pytest.param(2, False, id="queued-after-the-launch-grows-at-once"),
    ],
)
def test_a_pool_that_just_launched_holds_the_demand_queued_before(
    waited_s: float, held: bool
) -> None:
    """Work already placed on a fresh node is still pending until its job reports started:
    a demand queued before the launch may be it; one queued after cannot."""
    fresh = node("s1", SPOT, free_gpus=0).model_copy(update={"age_s": 5})
    decided = plan(POOLS, [fresh], [demand(gpus=2, waited_s=waited_s)], CONFIG, NOW)
    assert decided.target("gpu-spot") == (1 if held else 2)
    assert [b.reason for b in decided.blocked] == ([BlockedReason.SETTLING] if held else [])
    settled = fresh.model_copy(update={"age_s": 60})
    later = plan(POOLS, [settled], [demand(gpus=2, waited_s=waited_s)], CONFIG, NOW)
    assert later.target("gpu-spot") == 2


def test_a_cpu_only_job_takes_the_cpus_left_on_a_full_gpu_node() -> None:
    """Room without a free GPU is still room for a bundle that asks for none."""
    full = node("o1", ON_DEMAND, free_gpus=0)
    cpu_job = demand(gpus=0, cpus=2, capacity=OD)
    assert targets([full], [cpu_job]) == sizes(0, 1, 0)
    assert targets([full], [cpu_job, demand("j2", gpus=2)]) == sizes(1, 1, 0)


def test_a_booting_node_offers_all_its_room_and_a_draining_node_none() -> None:
    provided = [
        ProvidedNode(name="s1", pool="gpu-spot", launched_at=NOW - timedelta(seconds=90)),
        ProvidedNode(name="s2", pool="gpu-spot", launched_at=NOW - timedelta(seconds=5)),
        ProvidedNode(name="gone", pool="retired-pool", launched_at=NOW),
        ProvidedNode(name="s3", pool="gpu-spot", launched_at=NOW - timedelta(seconds=90)),
    ]
    busy = SPOT.shape.model_copy(update={"gpus": 0})
    observed = {
        "s1": ObservedNode(name="s1", free=busy, idle_s=0),
        "s3": ObservedNode(name="s3", free=SPOT.shape, idle_s=9, draining=True),
    }
    views = node_views(POOLS, provided, observed, NOW)
    assert [(v.name, v.ready, v.free.gpus, v.age_s) for v in views] == [
        ("s1", True, 0, 90.0),
        ("s2", False, 2, 5.0),
        ("s3", True, 0, 90.0),
    ], "a draining node offers no room, however free it is"
    assert [v.draining for v in views] == [False, False, True]


def test_a_fresh_node_under_notice_does_not_make_its_pool_wait() -> None:
    noticed = node("s1", SPOT, free_gpus=0).model_copy(update={"age_s": 5, "draining": True})
    decided = plan(POOLS, [noticed], [demand(gpus=2)], CONFIG, NOW)
    assert decided.target("gpu-spot") == 2, "the resumed attempt gets a new node at once"


def test_an_any_job_takes_on_demand_at_once_when_spot_capacity_fails() -> None:
    stocked_out = frozenset({"gpu-spot"})
    anyone = demand(gpus=2, capacity=CapacityClass.ANY)
    decided = plan(POOLS, [], [anyone], CONFIG, NOW, unavailable=stocked_out)
    assert decided.target("gpu-spot") == 0
    assert decided.target("gpu-od") == 1
    spot_only = demand(gpus=2, capacity=CapacityClass.SPOT)
    held = plan(POOLS, [], [spot_only], CONFIG, NOW, unavailable=stocked_out)
    assert (held.target("gpu-spot"), held.target("gpu-od")) == (0, 0)
    assert len(held.blocked) == 1, "a spot job waits for spot, and says so"


ZONE_A = SPOT.model_copy(update={"name": "spot-a", "zone": "a"})
ZONE_B = SPOT.model_copy(update={"name": "spot-b", "zone": "b"})


@pytest.mark.parametrize(
    ("risk", "grows"),
    [
        pytest.param({}, "spot-a", id="same-price-first-by-name"),
        pytest.param({"spot-a": 0.2}, "spot-b", id="the-riskier-zone-goes-second"),
        pytest.param({"spot-a": 0.2, "spot-b": 0.5}, "spot-a", id="the-least-risky-first"),
    ],
)
def test_of_one_shape_in_two_zones_the_pool_seen_to_preempt_less_grows(
    risk: dict[str, float], grows: str
) -> None:
    decided = plan((ZONE_A, ZONE_B), [], [demand()], CONFIG, NOW, risk=risk)
    assert {p.pool: p.target for p in decided.pools if p.target} == {grows: 1}


def test_a_gang_stays_in_one_zone_even_with_room_across_two() -> None:
    """Two free GPUs in zone a and two in zone b would hold a 2-worker gang, but not in one
    zone: it gets a new node rather than a split across zones."""
    nodes = [node("a-1", ZONE_A, free_gpus=1), node("b-1", ZONE_B, free_gpus=1)]
    decided = plan((ZONE_A, ZONE_B), nodes, [demand(gpus=1, workers=2)], CONFIG, NOW)
    assert sum(p.target - p.current for p in decided.pools) == 1
    # A single-bundle job may use either zone's room.
    decided = plan((ZONE_A, ZONE_B), nodes, [demand(gpus=1)], CONFIG, NOW)
    assert all(p.target == p.current for p in decided.pools)


def test_preemption_risk_grows_with_losses_and_restart_cost() -> None:
    assert preemption_risk(0, 100.0, 0.5) == 0.0
    assert preemption_risk(5, 90.0, 0.5) == pytest.approx(5 / 100 * 0.5)
    assert preemption_risk(5, 90.0, 1.0) > preemption_risk(5, 90.0, 0.5)
    assert preemption_risk(5, 0.0, 1.0) == pytest.approx(0.5)  # the prior keeps it finite


@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(2, 4),
    free_a=st.integers(0, 2),
    free_b=st.integers(0, 2),
    risk_a=st.floats(0, 1),
)
def test_a_gang_never_straddles_zones(
    workers: int, free_a: int, free_b: int, risk_a: float
) -> None:
    """Whatever the free room and risks, a gang is placed in room and new nodes of one zone
    only: if the room it fits in spans both zones, a zone grows instead."""
    nodes = [node("a-1", ZONE_A, free_gpus=free_a), node("b-1", ZONE_B, free_gpus=free_b)]
    decided = plan((ZONE_A, ZONE_B), nodes, [demand(gpus=1, workers=workers)], CONFIG, NOW,
                   risk={"spot-a": risk_a})  # fmt: skip
    grown = {p.pool: p.target - p.current for p in decided.pools if p.target > p.current}
    assert len(grown) <= 1
    if not decided.blocked:
        zone_room = {"spot-a": free_a, "spot-b": free_b}
        fits_in_a_zone = max(zone_room.values()) >= workers
        if fits_in_a_zone:
            assert not grown
        else:
            pool, count = next(iter(grown.items()))
            # New nodes (2 GPUs each) and that zone's room hold every worker.
            assert zone_room[pool] + 2 * count >= workers


def test_a_tight_deadline_job_takes_on_demand_when_the_pools_windows_are_seen_too_short() -> None:
    """What the platform learnt of the pool, not the prior: windows of about a minute do
    not pay for a restart on spot, so a job behind its reserve goes to on-demand at once."""
    waiting = with_deadline(10, 4.1, 4)
    assert plan(POOLS, [], [waiting], CONFIG, NOW).target("gpu-od") == 0, "the prior: spot"
    short = SpotOutlook(seen_h=200, productive_share=0.05, mean_window_h=0.02)
    decided = plan(POOLS, [], [waiting], CONFIG, NOW, outlooks={"gpu-spot": short})
    assert (decided.target("gpu-od"), decided.target("gpu-spot")) == (1, 0)


@pytest.mark.parametrize(
    ("nodes", "demands", "in_room"),
    [
        pytest.param([node("s1", SPOT)], [demand(gpus=2)], ("job-1",), id="room-now"),
        pytest.param([], [demand(gpus=1), demand("j2", gpus=1)], (), id="room-bought-now"),
        pytest.param(
            [node("s1", SPOT, free_gpus=1)],
            [demand(gpus=1, waited_s=9), demand("j2", gpus=2)],
            ("job-1",),
            id="before-a-purchase-only",
        ),
    ],
)
def test_a_decision_says_which_demand_the_nodes_have_room_for_now(
    nodes: list[NodeView], demands: list[Demand], in_room: tuple[str, ...]
) -> None:
    """Growth demand is done with once the nodes have room for it (`policy.elastic`): room
    on a node this decision buys is not room yet, and does not count."""
    assert plan(POOLS, nodes, demands, CONFIG, NOW).in_room == in_room
