"""The renewal yardstick of `bench/deadline.py`: a deadline job's least expected cost on a
market whose windows and gaps are drawn from known lengths (`simulation.renewal`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scaler.simulation import renewal
from services.scaler.simulation.deadline import (
    RENEWAL,
    DeadlineJob,
    RenewalOptimal,
    _window,
    check,
    optimal,
    run,
    run_online,
)
from tests.markets import markets, spot_trace


@pytest.mark.parametrize(
    ("lengths", "chances"),
    [
        # Of four spells, three lasted past their first step, one of those past its second.
        pytest.param([1, 2, 2, 3], [3 / 4, 1 / 3, renewal.SURE, 0.5], id="short-spells"),
        # Past the last age told apart: a mean of 12 more steps, one chance in 12 to end.
        pytest.param([10, 20], [1 - renewal.SURE] * 3 + [1 - 1 / 12], id="long-spells"),
        pytest.param([4, 4, 4, 4], [1 - renewal.SURE] * 3 + [renewal.SURE], id="all-alike"),
    ],
)
def test_stay_chances_by_age(lengths: list[int], chances: list[float]) -> None:
    assert renewal.stay_chances(lengths, ages=4) == pytest.approx(chances)


def test_spells_split_a_run_of_sightings_into_windows_and_gaps() -> None:
    available = [True, True, False, True, False, False]
    assert renewal.spells(available, 0.5) == ([1.0, 0.5], [0.5, 1.0])
    assert renewal.spells([], 0.5) == ([], [])


@pytest.mark.parametrize(("work_h", "deadline_h"), [(6.0, 10.0), (12.0, 14.0), (8.0, 20.0)])
@pytest.mark.parametrize("start", [0, 5, 13])
def test_on_a_regular_market_knowing_the_lengths_comes_near_the_optimum(
    work_h: float, deadline_h: float, start: int
) -> None:
    """Windows of 2 h and gaps of 1 h: the lengths and a spell's age say when it ends, so
    the plan comes near what knowing the whole trace gives, with the deadline met."""
    trace = spot_trace(([True] * 12 + [False] * 6) * 40)
    job = DeadlineJob(work_h, deadline_h, 0.2, 0.3)
    outcome = run(RENEWAL, trace, start, job)
    assert outcome.met_deadline
    assert outcome.cost_od_hours <= 1.25 * optimal(trace, start, job).cost_od_hours


def test_with_no_spot_in_its_span_it_runs_on_on_demand_once() -> None:
    trace = spot_trace([False] * 40)
    job = DeadlineJob(3.0, 5.0, 0.2, 0.3)
    outcome = run(RENEWAL, trace, 0, job)
    assert outcome.met_deadline
    assert (outcome.starts, outcome.spot_h) == (1, 0.0)
    assert outcome.cost_od_hours == pytest.approx(3.2)


@settings(max_examples=60, deadline=None)
@given(
    market=markets,
    work_h=st.floats(0.5, 6.0),
    slack_h=st.floats(0.2, 6.0),
    overhead_h=st.sampled_from([0.0, 0.05, 0.2, 0.5]),
)
def test_it_meets_every_deadline_on_demand_could(
    market: list[bool], work_h: float, slack_h: float, overhead_h: float
) -> None:
    """Whatever order the spells come in, a deadline on-demand alone meets is met, and the
    offline optimum is never above it."""
    job = DeadlineJob(work_h, work_h + overhead_h + slack_h, overhead_h, 0.3)
    gap_s = 300
    ticks = math.ceil(job.deadline_h * 3600 / gap_s)
    trace = spot_trace((market * ticks)[:ticks], gap_s)
    check(trace, 0, job)
    windows, gaps = renewal.spells(_window(trace, 0, job), gap_s / 3600)
    outcome = run_online(RenewalOptimal(job, windows, gaps), trace, 0, job)
    assert outcome.met_deadline
    assert optimal(trace, 0, job).cost_od_hours <= outcome.cost_od_hours + 1e-6
