"""Cost attribution: every node-second charged once, to the attempts that held it or to idle."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events.types import CapacityClass
from shared.policy.cost.attribution import (
    Attribution,
    Hold,
    NodeLife,
    SettledMemo,
    attribute,
    exact,
)
from tests.events import NOW

T0 = NOW
HOUR = timedelta(hours=1)


def at(minutes: float) -> timedelta:
    return timedelta(minutes=minutes)


def node(
    name: str = "n1",
    *,
    gpus: int = 2,
    cpus: float = 8,
    price: float = 3.6,
    on_demand: float = 9.0,
    start: float = 0,
    end: float | None = 60,
) -> NodeLife:
    return NodeLife(
        node=name,
        pool="gpu-spot" if gpus else "cpu",
        capacity=CapacityClass.SPOT,
        gpus=gpus,
        cpus=cpus,
        price_per_hour_usd=price,
        on_demand_price_per_hour_usd=on_demand,
        start=T0 + at(start),
        end=None if end is None else T0 + at(end),
    )


def hold(
    job: str = "job-a",
    *,
    node: str = "n1",
    gpus: int = 2,
    cpus: float = 1,
    start: float = 0,
    end: float | None = 60,
    attempt: int = 1,
    waste: Fraction = Fraction(0),
) -> Hold:
    return Hold(
        job_id=job,
        attempt=attempt,
        node=node,
        gpus=gpus,
        cpus=cpus,
        start=T0 + at(start),
        end=None if end is None else T0 + at(end),
        waste_fraction=waste,
    )


def costs(result: Attribution) -> dict[str | None, Fraction]:
    """Cost per job (None: idle)."""
    totals: dict[str | None, Fraction] = defaultdict(Fraction)
    for charge in result.charges:
        totals[charge.job_id] += charge.cost_usd
    return dict(totals)


HOUR_END = T0 + HOUR


@pytest.mark.parametrize(
    ("nodes", "holds", "expected"),
    [
        pytest.param(
            [node()],
            [],
            {None: Fraction("3.6")},
            id="no-holds-all-idle",
        ),
        pytest.param(
            [node()],
            [hold(end=30)],
            {"job-a": Fraction("1.8"), None: Fraction("1.8")},
            id="whole-node-half-the-hour",
        ),
        pytest.param(
            [node()],
            [hold("job-a", gpus=1), hold("job-b", gpus=1, start=30)],
            {"job-a": Fraction("1.8"), "job-b": Fraction("0.9"), None: Fraction("0.9")},
            id="gpu-share",
        ),
        pytest.param(
            [node()],
            [hold("job-a", gpus=2), hold("job-b", gpus=2)],
            {"job-a": Fraction("1.8"), "job-b": Fraction("1.8")},
            id="overcommitted-holds-split-the-node",
        ),
        pytest.param(
            [node(gpus=0, cpus=4, price=0.4)],
            [hold("job-a", gpus=0, cpus=1), hold("job-b", gpus=0, cpus=2)],
            {"job-a": Fraction("0.1"), "job-b": Fraction("0.2"), None: Fraction("0.1")},
            id="cpu-only-node-by-cpu-share",
        ),
        pytest.param(
            [node()],
            [hold("job-cpu", gpus=0, cpus=4)],
            {"job-cpu": Fraction("1.8"), None: Fraction("1.8")},
            id="cpu-work-alone-on-a-gpu-node-by-cpu-share",
        ),
        pytest.param(
            [node()],
            [hold("job-cpu", gpus=0, cpus=4), hold("job-a", gpus=1, start=30)],
            {"job-cpu": Fraction("0.9"), "job-a": Fraction("0.9"), None: Fraction("1.8")},
            id="cpu-work-pays-nothing-while-gpus-are-held",
        ),
        pytest.param(
            [node(start=10, end=40)],
            [hold(start=0, end=60)],
            {"job-a": Fraction("1.8")},
            id="charged-only-while-the-node-existed",
        ),
        pytest.param(
            [node(end=None)],
            [hold(end=None)],
            {"job-a": Fraction("3.6")},
            id="running-node-and-attempt-billed-to-now",
        ),
    ],
)
def test_attribution_by_share(
    nodes: list[NodeLife], holds: list[Hold], expected: dict[str | None, Fraction]
) -> None:
    """Each table row: one node for at most an hour at $3.60/h (or a CPU node at $0.40/h)."""
    assert costs(attribute(nodes, holds, T0, HOUR_END)) == expected


def test_the_window_clips_nodes_and_holds() -> None:
    """`--since 30m` an hour in: only the last half hour is billed."""
    result = attribute([node()], [hold(end=45)], T0 + at(30), HOUR_END)
    assert costs(result) == {"job-a": Fraction("0.9"), None: Fraction("0.9")}
    assert result.cost_usd == Fraction("1.8")


def test_waste_is_the_lost_fraction_of_a_preempted_attempts_charge() -> None:
    result = attribute([node()], [hold(end=30, waste=Fraction(1, 3))], T0, HOUR_END)
    [charge] = [c for c in result.charges if c.job_id == "job-a"]
    assert (charge.cost_usd, charge.waste_usd) == (Fraction("1.8"), Fraction("0.6"))


def test_saving_is_the_on_demand_price_of_the_same_share() -> None:
    result = attribute([node()], [hold(end=30)], T0, HOUR_END)
    [charge] = [c for c in result.charges if c.job_id == "job-a"]
    assert charge.saving_usd == Fraction("4.5") - Fraction("1.8")


def test_gpu_seconds_follow_the_share() -> None:
    result = attribute([node()], [hold(gpus=1)], T0, HOUR_END)
    gpu_hours = {c.job_id: c.gpu_seconds / 3600 for c in result.charges}
    assert gpu_hours == {"job-a": 1, None: 1}


def test_a_hold_on_a_node_with_no_launch_costs_nothing_and_is_reported() -> None:
    result = attribute([node()], [hold(node="ghost")], T0, HOUR_END)
    assert [h.node for h in result.unbilled] == ["ghost"]
    assert costs(result) == {None: Fraction("3.6")}


# --- properties ---------------------------------------------------------------------------

NODE_NAMES = ("n1", "n2", "n3")
CENTS = st.integers(0, 30_000).map(lambda cents: cents / 100)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[NodeLife], list[Hold], int, int]:
    nodes = []
    for name in draw(st.lists(st.sampled_from(NODE_NAMES), unique=True, max_size=3)):
        start = draw(st.integers(0, 600))
        end = draw(st.none() | st.integers(0, 1200))
        nodes.append(
            NodeLife(
                node=name,
                pool=draw(st.sampled_from(["gpu-spot", "cpu"])),
                capacity=CapacityClass.SPOT,
                gpus=draw(st.integers(0, 8)),
                cpus=draw(st.sampled_from([1, 2, 4.5, 96])),
                price_per_hour_usd=draw(CENTS),
                on_demand_price_per_hour_usd=draw(CENTS),
                start=T0 + timedelta(seconds=start),
                end=None if end is None else T0 + timedelta(seconds=max(end, start)),
            )
        )
    holds = []
    for i in range(draw(st.integers(0, 8))):
        start = draw(st.integers(0, 1200))
        end = draw(st.none() | st.integers(start, 1500))
        holds.append(
            Hold(
                job_id=f"job-{i % 4}",
                attempt=1 + i // 4,
                node=draw(st.sampled_from([*NODE_NAMES, "ghost"])),
                gpus=draw(st.integers(0, 8)),
                cpus=draw(st.sampled_from([0.5, 1, 3])),
                start=T0 + timedelta(seconds=start),
                end=None if end is None else T0 + timedelta(seconds=end),
                waste_fraction=Fraction(draw(st.integers(0, 4)), 4),
            )
        )
    window_start = draw(st.integers(0, 900))
    window_end = draw(st.integers(window_start, 1500))
    return nodes, holds, window_start, window_end


def window(start: int, end: int) -> tuple[datetime, datetime]:
    return T0 + timedelta(seconds=start), T0 + timedelta(seconds=end)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_every_node_second_is_attributed_exactly_once(
    scenario: tuple[list[NodeLife], list[Hold], int, int],
) -> None:
    """Per node: the charges' node-seconds, GPU-seconds and cost add up to its bill."""
    nodes, holds, lo, hi = scenario
    result = attribute(nodes, holds, *window(lo, hi))
    for bill in result.bills:
        mine = [c for c in result.charges if c.node == bill.node]
        assert sum(c.node_seconds for c in mine) == bill.node_seconds
        assert sum(c.gpu_seconds for c in mine) == bill.gpu_seconds
        assert sum(c.cost_usd for c in mine) == bill.cost_usd
        assert sum(c.on_demand_usd for c in mine) == bill.on_demand_usd
    assert sum(c.cost_usd for c in result.charges) == result.cost_usd
    assert {c.node for c in result.charges} <= {b.node for b in result.bills}


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_the_bill_is_each_nodes_life_inside_the_window_at_its_price(
    scenario: tuple[list[NodeLife], list[Hold], int, int],
) -> None:
    nodes, holds, lo, hi = scenario
    start, end = window(lo, hi)
    result = attribute(nodes, holds, start, end)
    expected = Fraction(0)
    for n in nodes:
        life = min(n.end or end, end) - max(n.start, start)
        if life > timedelta(0):
            expected += Fraction(life.total_seconds()) * exact(n.price_per_hour_usd) / 3600
    assert result.cost_usd == expected


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_nothing_is_negative_and_waste_never_exceeds_cost(
    scenario: tuple[list[NodeLife], list[Hold], int, int],
) -> None:
    nodes, holds, lo, hi = scenario
    for charge in attribute(nodes, holds, *window(lo, hi)).charges:
        assert charge.node_seconds >= 0
        assert charge.gpu_seconds >= 0
        assert charge.cost_usd >= 0
        assert charge.on_demand_usd >= 0
        assert 0 <= charge.waste_usd <= charge.cost_usd
        assert not (charge.idle and charge.waste_usd), "idle capacity wastes no job's work"


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_an_attempt_is_charged_only_for_time_its_node_existed(
    scenario: tuple[list[NodeLife], list[Hold], int, int],
) -> None:
    """An attempt's node-seconds on a node never exceed the overlap of its hold, the node's
    life and the window; on a node with no launch on record it is not charged at all."""
    nodes, holds, lo, hi = scenario
    start, end = window(lo, hi)
    result = attribute(nodes, holds, start, end)
    lives = {n.node: n for n in nodes}
    for charge in result.charges:
        if charge.idle:
            continue
        n = lives[charge.node]
        overlap = Fraction(0)
        for h in holds:
            if (h.job_id, h.attempt, h.node) != (charge.job_id, charge.attempt, charge.node):
                continue
            a = max(h.start, n.start, start)
            b = min(h.end or end, n.end or end, end)
            overlap += max(Fraction((b - a).total_seconds()), Fraction(0))
        assert charge.node_seconds <= overlap
    assert {h.node for h in result.unbilled} == {h.node for h in holds} - lives.keys()
    assert {c.node for c in result.charges} <= lives.keys()


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.lists(st.integers(0, 600), min_size=1, max_size=4))
def test_remembering_settled_nodes_changes_no_figure(
    scenario: tuple[list[NodeLife], list[Hold], int, int], steps: list[int]
) -> None:
    """Attributed again and again as now moves on (the scaler's metrics), with what it
    remembers of ended nodes: the same result as attributing from scratch each time."""
    nodes, holds, lo, hi = scenario
    settled: SettledMemo = {}
    now = hi
    for step in steps:
        now += step
        start, end = window(lo, now)
        remembered = attribute(nodes, holds, start, end, settled=settled)
        assert remembered == attribute(nodes, holds, start, end)
    ended = {n.node for n in nodes if n.end is not None and n.end <= window(lo, now)[1]}
    assert settled.keys() <= ended
