"""The deadline policy: its rules as a table, and its promises over random spot markets."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scaler.simulation.deadline import (
    DeadlineJob,
    Greedy,
    OnDemand,
    Spotrain,
    TickView,
    UniformProgress,
    check,
    optimal,
    run,
    run_online,
)
from shared.policy.deadline import (
    DeadlineReason,
    DeadlineState,
    Run,
    SpotOutlook,
    WindowTally,
    decide,
    outlook,
    tally,
)
from shared.policy.pool_knowledge import PoolRecord
from tests.markets import markets, spot_trace

LONG_WINDOWS = SpotOutlook(seen_h=100, productive_share=0.6, mean_window_h=5.0)
SHORT_WINDOWS = SpotOutlook(seen_h=100, productive_share=0.05, mean_window_h=0.25)


def state(**changes: object) -> DeadlineState:
    base: dict[str, object] = {
        "hours_left": 48.0,
        "work_left_h": 24.0,
        "running": Run.WAIT,
        "overhead_left_h": 0.0,
        "restart_overhead_h": 0.2,
        "decision_interval_h": 0.1,
        "spot_available": False,
        "spot_price_ratio": 0.3,
        "outlook": LONG_WINDOWS,
    }
    return DeadlineState.model_validate(base | changes)


@pytest.mark.parametrize(
    ("changes", "run", "reason"),
    [
        pytest.param({"work_left_h": 0.0}, Run.WAIT, DeadlineReason.DONE, id="done"),
        pytest.param(
            {"hours_left": 10.0, "work_left_h": 10.0},
            Run.ON_DEMAND,
            DeadlineReason.CANNOT_MEET,
            id="late-even-on-demand",
        ),
        pytest.param(
            {"hours_left": 10.25, "work_left_h": 10.0, "spot_available": True},
            Run.ON_DEMAND,
            DeadlineReason.ON_DEMAND_NEEDED,
            id="no-room-for-a-spot-restart",
        ),
        pytest.param(
            {"running": Run.SPOT, "spot_available": True},
            Run.SPOT,
            DeadlineReason.STAY_ON_SPOT,
            id="stays-on-spot",
        ),
        pytest.param({"spot_available": True}, Run.SPOT, DeadlineReason.TAKE_SPOT, id="takes-spot"),
        pytest.param({}, Run.WAIT, DeadlineReason.WAIT_FOR_SPOT, id="waits-with-slack"),
        pytest.param(
            {"hours_left": 28.0}, Run.ON_DEMAND, DeadlineReason.BEHIND, id="slack-below-reserve"
        ),
        pytest.param(
            {"hours_left": 28.0, "running": Run.ON_DEMAND, "spot_available": True},
            Run.SPOT,
            DeadlineReason.BACK_TO_SPOT,
            id="back-to-spot-when-windows-are-long",
        ),
        pytest.param(
            {
                "hours_left": 28.0,
                "running": Run.ON_DEMAND,
                "spot_available": True,
                "outlook": SHORT_WINDOWS,
            },
            Run.ON_DEMAND,
            DeadlineReason.SPOT_TOO_SHORT,
            id="stays-on-demand-when-windows-are-short",
        ),
        pytest.param(
            {"hours_left": 28.0, "spot_available": True, "outlook": SHORT_WINDOWS},
            Run.ON_DEMAND,
            DeadlineReason.BEHIND,
            id="behind-skips-short-spot",
        ),
        pytest.param(
            {"running": Run.ON_DEMAND},
            Run.WAIT,
            DeadlineReason.AHEAD,
            id="leaves-on-demand-when-ahead",
        ),
        pytest.param(
            {"hours_left": 29.0, "running": Run.ON_DEMAND},
            Run.ON_DEMAND,
            DeadlineReason.BEHIND,
            id="keeps-on-demand-within-a-restart-of-the-reserve",
        ),
    ],
)
def test_decides(changes: dict[str, object], run: Run, reason: DeadlineReason) -> None:
    """Each rule of the policy, from the state that calls for it."""
    decision = decide(state(**changes))
    assert (decision.run, decision.reason) == (run, reason)


MOSTLY_SHORT = SpotOutlook(
    seen_h=112,
    productive_share=0.3,
    mean_window_h=1.0,
    windows_h=tuple(sorted((0.1,) * 18 + (6.0, 8.0))),
    windows_per_h=2.0,
)
"""Windows come twice an hour; of the last twenty, most went within minutes, two lasted
hours."""


@pytest.mark.parametrize(
    ("hours_left", "age_h", "run", "reason"),
    [
        pytest.param(
            11.4, 0.05, Run.ON_DEMAND, DeadlineReason.SPOT_TOO_SHORT,
            id="behind-a-young-window-is-likely-one-of-the-short-ones",
        ),
        pytest.param(
            11.4, 6.0, Run.SPOT, DeadlineReason.BACK_TO_SPOT,
            id="behind-a-window-as-old-as-the-long-ones-is-one",
        ),
        pytest.param(
            11.0, 6.0, Run.ON_DEMAND, DeadlineReason.SPOT_TOO_SHORT,
            id="slack-for-one-round-trip-only-a-window-older-than-all-but-one",
        ),
        pytest.param(
            40.0, 0.0, Run.SPOT, DeadlineReason.BACK_TO_SPOT,
            id="not-behind-the-gate-does-not-apply",
        ),
        pytest.param(
            11.4, None, Run.SPOT, DeadlineReason.BACK_TO_SPOT,
            id="an-age-not-known-is-not-judged",
        ),
    ],
)  # fmt: skip
def test_behind_its_reserve_a_job_leaves_on_demand_only_for_a_window_that_has_lasted(
    hours_left: float, age_h: float | None, run: Run, reason: DeadlineReason
) -> None:
    """Its slack pays for a few round trips; the windows to come before the deadline are
    many: it spends them on the windows that have already lasted as long as the few long
    ones seen did."""
    decided = decide(
        state(
            hours_left=hours_left,
            work_left_h=10.0,
            running=Run.ON_DEMAND,
            spot_available=True,
            outlook=MOSTLY_SHORT.model_copy(update={"window_age_h": age_h}),
        )
    )
    assert (decided.run, decided.reason) == (run, reason)


def test_the_outlook_keeps_the_latest_window_lengths_and_the_rate_they_came_at() -> None:
    seen = tally([0.5] * 150 + [3.0], restart_overhead_h=0.2)
    found = outlook(seen, 300.0, 0.2, open_window_h=0.4, window_age_h=0.3)
    assert len(found.windows_h) == 100
    assert found.windows_h == tuple(sorted(found.windows_h))
    assert found.windows_h[-1] == 3.0
    assert found.windows_per_h == pytest.approx(152 / 302)
    assert found.window_age_h == 0.3
    assert outlook(seen, 300.0, 0.2, open_window_h=0.4).window_age_h is None, "not known"
    counted = outlook(seen, 300.0, 0.2, windows_seen=1000)
    assert counted.windows_per_h == pytest.approx(1001 / 302), "the count, not the kept"


def test_outlook_blends_the_prior_with_what_was_seen() -> None:
    """A pool never watched reads as the prior; a week of watching outweighs it."""
    assert outlook(WindowTally(), 0.0, 0.2).productive_share == pytest.approx(0.4)
    week = tally([1.2] * 84, 0.2)  # a 1.2 h window every 2 h
    seen = outlook(week, 168.0, 0.2)
    assert seen.productive_share == pytest.approx((84 * 1.0 + 0.4 * 12) / 180)
    assert seen.mean_window_h == pytest.approx((84 * 1.2 + 2.0) / 85)
    assert outlook(week, 168.0, 0.2, open_window_h=3.0).mean_window_h > seen.mean_window_h


class _Script:
    """Plays a fixed list of choices (spot only where there is spot)."""

    name = "script"

    def __init__(self, choices: tuple[Run, ...]) -> None:
        self.choices = iter(choices)

    def observe(self, available: bool, tick_h: float) -> None:
        return None

    def decide(self, view: TickView) -> Run:
        choice = next(self.choices, Run.WAIT)
        return Run.WAIT if choice is Run.SPOT and not view.spot_available else choice


@pytest.mark.parametrize(
    ("gap_s", "overhead_h", "work_h", "deadline_h"),
    [
        pytest.param(600, 0.2, 0.5, 1.5, id="overhead-not-a-whole-tick"),
        pytest.param(600, 0.0, 0.6, 1.4, id="no-overhead"),
        pytest.param(900, 0.1, 0.9, 1.8, id="deadline-within-a-tick"),
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_optimal_is_the_cheapest_of_every_schedule(
    gap_s: int, overhead_h: float, work_h: float, deadline_h: float, seed: int
) -> None:
    """On small markets the dynamic programme finds exactly the least cost over every
    sequence of choices, played through the same model as the online policies."""
    job = DeadlineJob(work_h, deadline_h, overhead_h, 0.3)
    ticks = -(-round(deadline_h * 3600) // gap_s)
    pattern = [(i * (seed + 2) + seed) % 3 != 0 for i in range(ticks)]
    trace = spot_trace(pattern, gap_s)
    costs = [
        outcome.cost_od_hours
        for choices in itertools.product(list(Run), repeat=ticks)
        if (outcome := run_online(_Script(choices), trace, 0, job)).met_deadline
    ]
    assert optimal(trace, 0, job).cost_od_hours == pytest.approx(min(costs))


@settings(max_examples=100, deadline=None)
@given(
    market=markets,
    work_h=st.floats(0.5, 6.0),
    slack_h=st.floats(0.2, 6.0),
    overhead_h=st.sampled_from([0.0, 0.05, 0.2, 0.5]),
    history=st.integers(0, 40),
)
def test_spotrain_meets_every_deadline_on_demand_could(
    market: list[bool], work_h: float, slack_h: float, overhead_h: float, history: int
) -> None:
    """Whatever spot does, a deadline that on-demand alone meets (work + one restart) is
    met; the cost is never above on-demand's by more than the extra restarts paid; and
    the offline optimum is never above any online policy that met it."""
    job = DeadlineJob(work_h, work_h + overhead_h + slack_h, overhead_h, 0.3)
    gap_s = 300
    ticks = math.ceil(job.deadline_h * 3600 / gap_s)
    available = (market * (history + ticks))[: history + ticks]
    trace = spot_trace(available, gap_s)
    check(trace, history, job)
    outcome = run_online(Spotrain(job), trace, history, job)
    assert outcome.met_deadline
    assert outcome.cost_od_hours <= work_h + max(1, outcome.starts) * overhead_h + 1e-6
    best = optimal(trace, history, job).cost_od_hours
    for policy in (Spotrain(job), UniformProgress(job), Greedy(job), OnDemand()):
        other = run_online(policy, trace, history, job)
        if other.met_deadline:  # the paper's rules keep no margin for a tick without restarts
            assert best <= other.cost_od_hours + 1e-6


@pytest.mark.parametrize(
    ("available", "choices", "moves", "starts"),
    [
        pytest.param([1, 1, 1, 1], [Run.SPOT] * 4, 0, 1, id="spot-throughout"),
        pytest.param([1, 0, 0, 1], [Run.SPOT, Run.WAIT, Run.WAIT, Run.SPOT], 0, 2,
                     id="spot-again-after-a-wait"),
        pytest.param([1, 0, 1, 1], [Run.SPOT, Run.ON_DEMAND, Run.SPOT, Run.SPOT], 2, 3,
                     id="to-on-demand-and-back"),
        pytest.param([0, 0, 1, 1], [Run.ON_DEMAND, Run.WAIT, Run.SPOT, Run.SPOT], 1, 2,
                     id="a-wait-between-kinds-is-still-a-move"),
    ],
)  # fmt: skip
def test_moves_count_starts_on_another_kind_of_capacity(
    available: list[int], choices: list[Run], moves: int, starts: int
) -> None:
    """As the live platform counts a job's moves: a start on another kind than the run
    before, whatever came between; a restart on the same kind is no move."""
    job = DeadlineJob(work_h=10.0, deadline_h=20.0, overhead_h=0.0)
    trace = spot_trace([bool(a) for a in available] + [True] * 200)
    outcome = run_online(_Script(tuple(choices)), trace, 0, job)
    assert (outcome.moves, outcome.starts) == (moves, starts)


def _learnt(windows_h: tuple[float, ...], watched_h: float) -> PoolRecord:
    since = datetime(2026, 12, 1, tzinfo=UTC)
    return PoolRecord(
        pool="gpu-spot",
        watched_since=since,
        seen_until=since + timedelta(hours=watched_h),
        windows_h=windows_h,
    )


@pytest.mark.parametrize(
    ("windows_h", "takes_spot"),
    [
        pytest.param((5.0,) * 20, True, id="long-windows-pay-for-their-restart"),
        pytest.param((0.1,) * 100, False, id="short-windows-do-not"),
    ],
)
def test_the_platform_policy_starts_from_what_the_live_platform_learnt(
    windows_h: tuple[float, ...], takes_spot: bool
) -> None:
    """A job behind its line, with spot there now: whether it is worth taking depends on
    how long the pool's windows have lasted, as the live platform saw them, and not on the
    trace's past (none is shown)."""
    # Behind (0.3 h to spare, below a fifth of the work), yet with room for two restarts.
    job = DeadlineJob(work_h=2.0, deadline_h=2.4, overhead_h=0.1, spot_price_ratio=0.3)
    trace = spot_trace([True] * 40)
    learnt = _learnt(windows_h, watched_h=sum(windows_h) * 2)
    outcome = run("spotrain", trace, 10, job, learnt)
    assert outcome.met_deadline
    assert (outcome.spot_h > 0) is takes_spot
    assert (outcome.on_demand_h > 0) is not takes_spot
