"""The deadline policy, pure: for one job over its life, run on spot, on on-demand, or wait,
so that it ends by its deadline at the least expected cost. It decides from the job's pace
(work left, in hours at its measured step time), its restart overhead (what each start of
an instance costs in paid time without progress: boot, resume, warm-up) and what has been
seen of the spot pool (`SpotOutlook`). No I/O, no clock: the caller gives the hours left.
One policy for the whole platform: the scaler places queued jobs by it, the checkpointer
moves running ones by it, and the simulator replays markets through it.

The rule that keeps the deadline, whatever spot does: an action other than on-demand is
taken only if, were spot to vanish by the next decision, on-demand started then would still
finish in time. So a deadline that on-demand alone could meet from the start is never
missed. Within that rule, cost decides:

- on spot, stay while it lasts;
- while its slack (the hours it could still wait) is above a reserve, it waits for spot;
  below it, it runs without a break, on on-demand while spot is away, and stops paying
  for on-demand once ahead of the reserve by more than a restart;
- it leaves on-demand for spot when spot returns only if the windows seen last long enough
  to pay for the two restarts of a round trip (spot now, on-demand again when spot goes);
- it takes spot when idle unless the windows seen are too short to pay for their restart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from shared.events.types import Frozen

_EPSILON = 1e-9


class Run(StrEnum):
    """What a job runs on between two decisions."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    WAIT = "wait"
    """Nothing: no cost, no progress."""


class DeadlineReason(StrEnum):
    DONE = "done"
    ON_DEMAND_NEEDED = "deadline-needs-on-demand"
    """Anything but on-demand from now could miss the deadline."""
    CANNOT_MEET = "deadline-cannot-be-met"
    """Even on-demand from now ends after the deadline: it runs there, the sooner done."""
    STAY_ON_SPOT = "on-spot"
    TAKE_SPOT = "spot-available"
    BACK_TO_SPOT = "spot-returned"
    BEHIND = "behind"
    """Its slack is below the reserve: it cannot wait for spot any longer."""
    AHEAD = "ahead"
    """Its slack is back above the reserve: on-demand stops, it waits for spot."""
    SPOT_TOO_SHORT = "spot-windows-too-short"
    """The windows seen do not last long enough to pay for the restarts spot would cost."""
    WAIT_FOR_SPOT = "waiting-for-spot"


class SpotOutlook(Frozen):
    """What has been seen of one spot pool, summarised for deadline decisions."""

    seen_h: Annotated[float, Field(ge=0)] = 0.0
    """How long the pool has been watched (with a prior's pseudo-hours, see `outlook`)."""
    productive_share: Annotated[float, Field(ge=0, le=1)]
    """Of the time watched, the share a job holding the pool whenever it could would have
    progressed, net of one restart per window: the spot progress to expect per hour. Not
    what `decide` goes by (an estimate of future spot from the past committed jobs to
    on-demand too early, on every trace family of `bench/deadline.py`); it says how good a
    pool has been, for people and for choosing between pools."""
    mean_window_h: Annotated[float, Field(ge=0)]
    """How long the pool stayed available once it was, on average."""
    windows_h: tuple[float, ...] = ()
    """The lengths of the latest windows that closed (`WINDOWS_KEPT`), shortest first: how
    long the longest of them lasted, which a mean hides."""
    windows_per_h: Annotated[float, Field(ge=0)] = 1 / 2.0
    """How many windows opened per hour watched (one per `PRIOR_MEAN_WINDOW_H` before any)."""
    window_age_h: Annotated[float, Field(ge=0)] | None = None
    """How long the window open now has lasted (0 while the pool has none); None when not
    known (the live scaler knows it only while it holds a node of the pool): no window is
    then judged by its age."""


PRIOR_PRODUCTIVE_SHARE = 0.4
"""Until a pool has been watched, about what the shared AWS and GCP traces show for GPU spot
(available 30-90% of the time, in windows of an hour or so)."""
PRIOR_MEAN_WINDOW_H = 2.0
PRIOR_WEIGHT_H = 12.0
"""The prior counts as this many hours of watching: a day of a pool outweighs it."""


WINDOWS_KEPT = 100
"""The latest windows whose lengths are kept: a market's recent weeks, not its life."""


class WindowTally(Frozen):
    """The windows of availability seen of a pool, added up for one restart overhead."""

    windows: Annotated[int, Field(ge=0)] = 0
    window_h: Annotated[float, Field(ge=0)] = 0.0
    """Their lengths added up."""
    productive_h: Annotated[float, Field(ge=0)] = 0.0
    """What a job holding each from its start would have progressed: each length less one
    restart, never below zero."""

    lengths_h: tuple[float, ...] = ()
    """The latest `WINDOWS_KEPT` of them, oldest first."""

    def add(self, window_h: float, restart_overhead_h: float) -> WindowTally:
        return WindowTally(
            windows=self.windows + 1,
            window_h=self.window_h + window_h,
            productive_h=self.productive_h + max(0.0, window_h - restart_overhead_h),
            lengths_h=(*self.lengths_h, window_h)[-WINDOWS_KEPT:],
        )


def tally(windows_h: Sequence[float], restart_overhead_h: float) -> WindowTally:
    """The tally of these windows' lengths."""
    total = WindowTally()
    for window_h in windows_h:
        total = total.add(window_h, restart_overhead_h)
    return total


def outlook(
    seen: WindowTally,
    watched_h: float,
    restart_overhead_h: float,
    *,
    open_window_h: float = 0.0,
    window_age_h: float | None = None,
    windows_seen: int | None = None,
) -> SpotOutlook:
    """The outlook from the windows of availability that ended while the pool was watched
    for `watched_h` hours, and the one still open (`open_window_h` so far, counted as far
    as it went), blended with a prior while little has been seen. `window_age_h`: how long
    the window open now has lasted, if known. `windows_seen`: how many windows closed in
    all, where `seen` holds only the latest."""
    windows = seen.windows + (open_window_h > 0)
    window_h = seen.window_h + open_window_h
    productive_h = seen.productive_h + max(0.0, open_window_h - restart_overhead_h)
    total_h = max(watched_h, 0.0) + PRIOR_WEIGHT_H
    share = (productive_h + PRIOR_PRODUCTIVE_SHARE * PRIOR_WEIGHT_H) / total_h
    # The prior's window counts as one window seen.
    mean = (window_h + PRIOR_MEAN_WINDOW_H) / (windows + 1)
    return SpotOutlook.model_construct(
        seen_h=total_h,
        productive_share=min(1.0, share),
        mean_window_h=mean,
        windows_h=tuple(sorted(seen.lengths_h)),
        windows_per_h=(max(seen.windows, windows_seen or 0) + 1)
        / (max(watched_h, 0.0) + PRIOR_MEAN_WINDOW_H),
        window_age_h=None if window_age_h is None else max(0.0, window_age_h),
    )


class SpotAdvice(Frozen):
    """What the cloud forecasts of a spot pool now (Compute Engine's capacity advice for
    Spot VMs, or the local stack's equivalent from its market trace)."""

    obtainability: Annotated[float, Field(ge=0, le=1)]
    """How likely a request for the pool's VMs is to be served now: 0.7 and up is likely,
    0.3 and below unlikely (Compute Engine's bands)."""
    uptime_h: Annotated[float, Field(ge=0)] | None = None
    """The least most of the pool's VMs are expected to run before they are taken back
    (Compute Engine says 10 min or 60 min); None when the cloud gives none."""


LONG_UPTIME_H = 1.0
"""An advised uptime this long or longer says the window is at least that long; shorter,
that it ends about then."""


def advised(outlook: SpotOutlook, advice: SpotAdvice | None) -> SpotOutlook:
    """The outlook with the cloud's forecast of the window now: an uptime of an hour or
    more is a floor under what was learnt (most VMs run at least that long), a shorter one
    a ceiling (most are taken back about then). The learnt rest (how good the pool has
    been) is kept. No advice, or no uptime in it: the outlook as learnt."""
    if advice is None or advice.uptime_h is None:
        return outlook
    if advice.uptime_h >= LONG_UPTIME_H:
        window_h = max(outlook.mean_window_h, advice.uptime_h)
    else:
        window_h = min(outlook.mean_window_h, advice.uptime_h)
    return outlook.model_copy(update={"mean_window_h": window_h})


class DeadlineState(Frozen):
    """One job at a decision: how far it is from done and from its deadline, what it runs on,
    and what spot looks like."""

    hours_left: float
    """Until the deadline; negative once past it."""
    work_left_h: Annotated[float, Field(ge=0)]
    """Running time still needed at the job's measured pace, restarts not included."""
    running: Run
    overhead_left_h: Annotated[float, Field(ge=0)] = 0.0
    """Of the current start's restart overhead, what is still to pay (0 when waiting)."""
    restart_overhead_h: Annotated[float, Field(ge=0)]
    decision_interval_h: Annotated[float, Field(gt=0)]
    """Until the next decision: how long a wait, or a spot run that is then lost, lasts."""
    spot_available: bool
    """Spot can be had now (a pool in stock-out, or no spot pool, cannot)."""
    spot_price_ratio: Annotated[float, Field(gt=0, le=1)]
    """Spot's price as a share of on-demand's."""
    outlook: SpotOutlook


class DeadlineDecision(Frozen):
    run: Run
    reason: DeadlineReason
    slack_h: float
    """Hours to spare if it ran without a break from now on (its current start's overhead
    paid): negative means late even on on-demand."""


def decide(state: DeadlineState) -> DeadlineDecision:
    """Spot, on-demand or wait until the next decision. Pure: same state, same decision."""
    if state.work_left_h <= _EPSILON:
        return _decision(state, Run.WAIT, DeadlineReason.DONE)
    restart = state.restart_overhead_h
    if state.hours_left + _EPSILON < on_demand_time(state):
        return _decision(state, Run.ON_DEMAND, DeadlineReason.CANNOT_MEET)
    spot_ok = state.spot_available and keeps_deadline(state, Run.SPOT)
    wait_ok = keeps_deadline(state, Run.WAIT)
    if not spot_ok and not wait_ok:
        return _decision(state, Run.ON_DEMAND, DeadlineReason.ON_DEMAND_NEEDED)
    if state.running is Run.SPOT and spot_ok:
        return _decision(state, Run.SPOT, DeadlineReason.STAY_ON_SPOT)

    ratio = state.spot_price_ratio
    window_h = state.outlook.mean_window_h
    behind = _behind(state)
    if spot_ok and _slack_h(state, Run.SPOT) >= 2 * restart - _EPSILON:
        if state.running is Run.ON_DEMAND:
            # A round trip costs two restarts (spot now, on-demand again when spot goes,
            # unless the work ends first); the window saves (1 - ratio) per hour.
            gain = (1 - ratio) * min(window_h, state.work_left_h)
            trips = 2 if window_h < state.work_left_h and behind else 1
            age_h = state.outlook.window_age_h
            lasted = not behind or age_h is None or age_h + _EPSILON >= _spot_gate_h(state)
            if gain > trips * restart and lasted:
                return _decision(state, Run.SPOT, DeadlineReason.BACK_TO_SPOT)
            return _decision(state, Run.ON_DEMAND, DeadlineReason.SPOT_TOO_SHORT)
        # From idle, a window pays for its own restart if it outlasts restart / (1 - ratio);
        # while the job can still wait, it is taken whatever its windows.
        if not behind or (1 - ratio) * window_h > restart:
            return _decision(state, Run.SPOT, DeadlineReason.TAKE_SPOT)
    if state.running is Run.ON_DEMAND:
        # Leaving on-demand costs a restart when it is needed again: leave only when ahead
        # by more than that.
        if _behind(state, margin_h=restart) or not wait_ok:
            return _decision(state, Run.ON_DEMAND, DeadlineReason.BEHIND)
        return _decision(state, Run.WAIT, DeadlineReason.AHEAD)
    if behind or not wait_ok:
        return _decision(state, Run.ON_DEMAND, DeadlineReason.BEHIND)
    return _decision(state, Run.WAIT, DeadlineReason.WAIT_FOR_SPOT)


RESERVE_SHARE = 0.2
"""Slack kept for the last stretch, as a share of the work left. Waiting for spot spends
slack; below this reserve the job runs without a break (spot while it lasts, on-demand in
between), and the reserve pays for the restarts of riding spot to the end. A fixed reserve
of 4-6 h did as well on the shared traces' 24-72 h jobs (`bench/deadline.py`); a share
fits short jobs too."""


def _behind(state: DeadlineState, margin_h: float = 0.0) -> bool:
    """Whether the job's slack (waiting from now, then one restart) is below its reserve:
    it must make progress now, on on-demand if spot is away."""
    slack = state.hours_left - state.work_left_h - state.restart_overhead_h
    return slack < RESERVE_SHARE * state.work_left_h + margin_h


GATE_FLOOR_RESTARTS = 2.0
"""Slack a job behind its reserve keeps for the end, in restarts, before it counts what is
left for round trips to spot."""


def _spot_gate_h(state: DeadlineState) -> float:
    """How long spot's open window must have lasted before a job behind its reserve leaves
    on-demand for it. Its slack pays for so many more round trips (two restarts each, past
    a floor of `GATE_FLOOR_RESTARTS`); of the windows still to come before the deadline
    (at the rate seen), it can afford only that share, so it takes only windows that last
    as long as the longest such share of those seen did. A window's age says how long it
    will last (one that has lasted an hour lasts hours more, on every shared trace), which
    a mean does not: without the gate, every short window that came back was taken, and
    round trips burnt the slack that the long windows then needed (the worst cases of
    `bench/deadline.py`, 2.6x the optimum)."""
    restart = state.restart_overhead_h
    lengths = state.outlook.windows_h
    if restart <= _EPSILON or not lengths:
        return 0.0
    slack = state.hours_left - state.work_left_h - restart
    affordable = (slack - GATE_FLOOR_RESTARTS * restart) / (2 * restart)
    if affordable <= 0:
        return math.inf
    coming = state.outlook.windows_per_h * max(state.hours_left, 0.0)
    share = affordable / coming if coming > _EPSILON else 1.0
    if share >= 1:
        return 0.0
    index = min(max(int(len(lengths) * (1 - share)), 0), len(lengths) - 1)
    return lengths[index]


def on_demand_time(state: DeadlineState) -> float:
    """Hours to finish on on-demand from now: a restart unless already there."""
    overhead = state.overhead_left_h if state.running is Run.ON_DEMAND else state.restart_overhead_h
    return overhead + state.work_left_h


def _slack_h(state: DeadlineState, run: Run) -> float:
    """Hours to spare, running `run` from now without a break (a restart if it is a change)."""
    overhead = state.overhead_left_h if run is state.running else state.restart_overhead_h
    return state.hours_left - state.work_left_h - overhead


def keeps_deadline(state: DeadlineState, run: Run) -> bool:
    """Whether after one interval of `run` (spot or wait), on-demand started then would still
    end by the deadline, even if spot is gone by then."""
    interval = state.decision_interval_h
    progress = 0.0
    if run is Run.SPOT:
        overhead = state.overhead_left_h if state.running is Run.SPOT else state.restart_overhead_h
        progress = max(0.0, interval - overhead)
    hours_left = state.hours_left - interval
    work_left = max(0.0, state.work_left_h - progress)
    if work_left <= _EPSILON:
        return hours_left >= 0.0
    # On the edge counts as late: rounding must never be what makes a deadline.
    return hours_left - _EPSILON >= work_left + state.restart_overhead_h


def _decision(state: DeadlineState, run: Run, reason: DeadlineReason) -> DeadlineDecision:
    return DeadlineDecision.model_construct(
        run=run, reason=reason, slack_h=state.hours_left - state.work_left_h - state.overhead_left_h
    )


def queued_decision(  # the facts a queued job's decision rests on
    *,
    hours_left: float,
    work_left_h: float,
    restart_overhead_h: float,
    decision_interval_h: float,
    spot_available: bool,
    spot_price_ratio: float,
    seen: SpotOutlook | None = None,
) -> DeadlineDecision:
    """`decide` for a job that waits for capacity, on what has been seen of the spot pool
    (`seen`, from what the platform learnt of it; the prior without)."""
    return decide(
        DeadlineState(
            hours_left=hours_left,
            work_left_h=max(0.0, work_left_h),
            running=Run.WAIT,
            restart_overhead_h=max(0.0, restart_overhead_h),
            decision_interval_h=decision_interval_h,
            spot_available=spot_available,
            spot_price_ratio=min(1.0, max(spot_price_ratio, 1e-6)),
            outlook=seen or outlook(WindowTally(), 0.0, restart_overhead_h),
        )
    )
