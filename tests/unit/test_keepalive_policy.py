"""The keep-alive policy: the idle timeout that would have cost least over the periods seen."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scaler.policy.keepalive import MIN_PERIODS, best_idle_timeout_s
from services.scaler.simulation.replay import load_pools, simulate
from services.scaler.simulation.traces import TraceJob

BOOT_S = 120.0
LONGEST_S = 300.0


@pytest.mark.parametrize(
    ("reused", "released", "timeout"),
    [
        pytest.param([5.0] * 30, 0, LONGEST_S, id="reused-at-once-keeps-the-longest"),
        pytest.param([], 30, 0.0, id="never-reused-goes-at-once"),
        pytest.param([200.0] * 30, 0, 0.0, id="reused-later-than-a-boot-costs-goes-at-once"),
        pytest.param([60.0] * 30, 5, 60.0, id="reused-sooner-than-a-boot-costs-waits-for-it"),
        pytest.param([30.0] * 15 + [250.0] * 15, 10, 30.0, id="a-burst-then-a-lull"),
        pytest.param([5.0] * 5, 0, LONGEST_S, id="too-little-seen-keeps-the-configured"),
    ],
)
def test_picks_the_cheapest_timeout_in_hindsight(
    reused: list[float], released: int, timeout: float
) -> None:
    assert best_idle_timeout_s(reused, released, BOOT_S, LONGEST_S) == timeout


def _cost(t: float, reused: list[float], released: int) -> float:
    return sum(x if x <= t else t + BOOT_S for x in reused) + released * t


@settings(max_examples=200, deadline=None)
@given(
    reused=st.lists(st.floats(0, 400), min_size=MIN_PERIODS, max_size=60),
    released=st.integers(0, 30),
    t=st.floats(0, LONGEST_S),
)
def test_no_fixed_timeout_would_have_cost_less(
    reused: list[float], released: int, t: float
) -> None:
    """Over the periods seen, the timeout chosen costs no more than any other in range,
    and no more than the ski-rental rule (a timeout equal to the boot)."""
    chosen = best_idle_timeout_s(reused, released, BOOT_S, LONGEST_S)
    assert 0.0 <= chosen <= LONGEST_S
    assert _cost(chosen, reused, released) <= _cost(t, reused, released) + 1e-6
    assert _cost(chosen, reused, released) <= _cost(BOOT_S, reused, released) + 1e-6


def test_the_replay_learns_to_release_nodes_that_are_not_reused() -> None:
    """Short jobs an hour apart: no node is ever reused within the 300 s timeout, so once
    enough periods are seen the scaler releases idle nodes at once, and pays less than
    with the fixed timeout (naive)."""
    trace = [TraceJob(str(i), i * 3600.0, 1, 600.0) for i in range(60)]
    pools, config = load_pools(None)
    ours = simulate(trace, "spotrain", pools, config)
    naive = simulate(trace, "naive", pools, config)
    assert ours.cost_usd < naive.cost_usd
    assert ours.utilisation > naive.utilisation
    assert ours.jobs_unfinished == 0


def test_the_replay_keeps_nodes_that_bursts_reuse() -> None:
    """Jobs back to back on one GPU (each arrives 30 s after the last one ends; the first
    waits for the boot, 130 s): a node is always reused, so the learnt timeout keeps it and
    no other job waits."""
    trace = [TraceJob(str(i), 130.0 + i * 630.0 if i else 0.0, 1, 600.0) for i in range(60)]
    pools, config = load_pools(None)
    ours = simulate(trace, "spotrain", pools, config)
    assert ours.nodes_launched == 1
    assert ours.wait_p95_s == 0.0
