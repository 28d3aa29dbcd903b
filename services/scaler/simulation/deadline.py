"""One job with a deadline on a real spot market trace, under each policy, head to head (the
model of "Can't Be Late", Wu et al., NSDI 2024). One instance; at each tick of the trace the
job runs on spot (only while the trace's count is above 0), on on-demand, or on nothing.
Each start of an instance (the first, after a preemption, or a change of kind) pays the
restart overhead without progress; spot costs a share of on-demand. Cost is counted in
on-demand instance-hours. `optimal` knows the whole trace (exact, by dynamic programming
over ticks); every other policy sees only the past, the pool's history before the start
included (what the platform would have seen of the pool).

    spotrain simulate deadline --spot-trace FILE --hours 48 --deadline 52 \\
        [--overhead 0.2] [--spot-price-ratio 0.3] [--start-tick N] [--policy ...] [--json]
        [--learnt POOL [--knowledge FILE]]

With `--learnt POOL`, the platform's policy starts from what the live platform has learnt
of a pool (`spotrain pools --learnt`: its windows of availability and how long it watched)
rather than from the trace's past: what would this job do here, with what we know now.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

import numpy as np
from pydantic import ValidationError

from services.scaler.simulation import renewal
from services.scaler.simulation.traces import SpotTrace, read_spot_trace
from shared.client import PlatformError, SpotrainClient
from shared.policy import deadline
from shared.policy.deadline import DeadlineState, Run, SpotAdvice, WindowTally
from shared.policy.pool_knowledge import PoolRecord, PoolsKnowledge

POLICIES = ("spotrain", "uniform-progress", "greedy", "on-demand", "optimal")
FORECAST = "spotrain-forecast"
"""The platform's policy also told a capacity advice at each tick, modelled from the trace's
own next hour (`forecast`): asked for by name, not among the defaults."""
FORECAST_ACCURACY = 0.8
"""How often the modelled advice is right."""

RENEWAL = "renewal-optimal"
"""The least expected cost knowing the lengths of the windows and gaps of the run's own span
but not their order (`simulation.renewal`): a yardstick asked for by name."""

HISTORY_H = 7 * 24.0
"""How much of the pool's past before the start an online policy may have seen."""

_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class DeadlineJob:
    work_h: float
    deadline_h: float
    overhead_h: float = 0.2
    spot_price_ratio: float = 0.3


@dataclass(frozen=True, slots=True)
class Outcome:
    policy: str
    cost_od_hours: float
    met_deadline: bool
    finished_h: float | None
    """When the work was done, from the start; None if not by the deadline."""
    spot_h: float
    on_demand_h: float
    starts: int
    preemptions: int
    moves: int = 0
    """Starts on another kind of capacity than the run before (spot to on-demand or back),
    as `spotrain demo --market` counts them on a live job's attempts."""

    def as_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "cost_od_hours": round(self.cost_od_hours, 6),
            "met_deadline": self.met_deadline,
        }


@dataclass(frozen=True, slots=True)
class TickView:
    """What an online policy sees at a tick."""

    elapsed_h: float
    hours_left: float
    work_left_h: float
    running: Run
    overhead_left_h: float
    spot_available: bool
    tick_h: float
    advice: SpotAdvice | None = None
    """The cloud's forecast of the pool now, for a policy told one."""


class OnlinePolicy(Protocol):
    name: str

    def decide(self, view: TickView) -> Run: ...

    def observe(self, available: bool, tick_h: float) -> None:
        """The pool's state at a tick, before the decision at that tick."""


class _Watcher:
    """What a policy has seen of the pool: windows of availability, as they end."""

    def __init__(self, overhead_h: float) -> None:
        self.overhead_h = overhead_h
        self.seen = WindowTally()
        self.watched_h = 0.0
        self.open_h = 0.0

    def observe(self, available: bool, tick_h: float) -> None:
        self.watched_h += tick_h
        if available:
            self.open_h += tick_h
        elif self.open_h > 0:
            self.seen = self.seen.add(self.open_h, self.overhead_h)
            self.open_h = 0.0


class Spotrain(_Watcher):
    """The platform's deadline policy (`shared.policy.deadline`), as the live
    platform calls it."""

    name = "spotrain"

    def __init__(self, job: DeadlineJob, learnt: PoolRecord | None = None) -> None:
        super().__init__(job.overhead_h)
        self.job = job
        if learnt is not None:
            # What the live platform knew of the pool: its windows, how long it watched,
            # and the window still open when it last looked.
            self.seen = deadline.tally(learnt.windows_h, job.overhead_h)
            self.watched_h = learnt.watched_h
            if learnt.available_since is not None:
                self.open_h = (learnt.seen_until - learnt.available_since).total_seconds() / 3600

    def decide(self, view: TickView) -> Run:
        state = DeadlineState.model_construct(
            hours_left=view.hours_left,
            work_left_h=view.work_left_h,
            running=view.running,
            overhead_left_h=view.overhead_left_h,
            restart_overhead_h=self.job.overhead_h,
            decision_interval_h=view.tick_h,
            spot_available=view.spot_available,
            spot_price_ratio=self.job.spot_price_ratio,
            outlook=deadline.advised(
                deadline.outlook(
                    self.seen,
                    self.watched_h,
                    self.job.overhead_h,
                    open_window_h=self.open_h,
                    # As of the last decision: this tick's sighting is in `open_h` already.
                    window_age_h=max(0.0, self.open_h - view.tick_h)
                    if view.spot_available
                    else 0.0,
                ),
                view.advice,
            ),
        )
        return deadline.decide(state).run


class RenewalOptimal:
    """`renewal.RenewalPlan` for the job, told the lengths of the windows and gaps of its
    span; it follows the age of the spell it is in. The rule that keeps the deadline
    (`deadline.keeps_deadline`) has the last word, as for the platform's policy: the plan
    rounds time down and work up to its step, which a trace's ticks do not."""

    name = RENEWAL

    def __init__(self, job: DeadlineJob, windows: Sequence[float], gaps: Sequence[float]) -> None:
        self.job = job
        self.plan = renewal.RenewalPlan.solve(
            windows=windows,
            gaps=gaps,
            work_h=job.work_h,
            deadline_h=job.deadline_h,
            overhead_h=job.overhead_h,
            spot_price_ratio=job.spot_price_ratio,
        )
        self.available: bool | None = None
        self.spell_h = 0.0
        """How long the spell now has lasted, this tick's sighting included."""

    def observe(self, available: bool, tick_h: float) -> None:
        self.spell_h = self.spell_h + tick_h if available == self.available else tick_h
        self.available = available

    def decide(self, view: TickView) -> Run:
        job = self.job
        state = DeadlineState.model_construct(
            hours_left=view.hours_left,
            work_left_h=view.work_left_h,
            running=view.running,
            overhead_left_h=view.overhead_left_h,
            restart_overhead_h=job.overhead_h,
            decision_interval_h=view.tick_h,
            spot_available=view.spot_available,
            spot_price_ratio=job.spot_price_ratio,
            outlook=deadline.outlook(WindowTally(), 0.0, job.overhead_h),
        )
        if view.work_left_h <= _EPSILON:
            return Run.WAIT
        if view.hours_left + _EPSILON < deadline.on_demand_time(state):
            return Run.ON_DEMAND
        spot_ok = view.spot_available and deadline.keeps_deadline(state, Run.SPOT)
        wait_ok = deadline.keeps_deadline(state, Run.WAIT)
        paying = view.overhead_left_h if view.running is not Run.WAIT else 0.0
        run = self.plan.action(
            hours_left=view.hours_left,
            work_left_h=view.work_left_h + paying,
            running=view.running,
            spot_available=view.spot_available,
            # As of the last decision: this tick's sighting is in `spell_h` already.
            age_h=max(0.0, self.spell_h - view.tick_h),
        )
        if run is Run.SPOT and not spot_ok:
            run = Run.WAIT
        if run is Run.WAIT and not wait_ok:
            run = Run.ON_DEMAND
        return run


class _Blind:
    """A policy that keeps no history."""

    def observe(self, available: bool, tick_h: float) -> None:
        return None


class UniformProgress(_Blind):
    """The paper's Uniform Progress: follow the line work x t / deadline; spot whenever it is
    available (staying until preempted); idle and behind the line, on-demand, staying until
    ahead of the line by two restart overheads; when the time left is less than the work
    left plus two restart overheads, on-demand to the end."""

    name = "uniform-progress"

    def __init__(self, job: DeadlineJob) -> None:
        self.job = job
        self.forced = False

    def decide(self, view: TickView) -> Run:
        job = self.job
        if self.forced or view.hours_left < view.work_left_h + 2 * job.overhead_h:
            self.forced = True
            return Run.ON_DEMAND
        done_h = job.work_h - view.work_left_h
        line_h = job.work_h * view.elapsed_h / job.deadline_h
        if view.running is Run.SPOT and view.spot_available:
            return Run.SPOT
        if view.running is Run.ON_DEMAND and done_h < line_h + 2 * job.overhead_h:
            return Run.ON_DEMAND
        if view.spot_available:
            return Run.SPOT
        return Run.ON_DEMAND if done_h < line_h else Run.WAIT


class Greedy(_Blind):
    """Spot whenever it is available; on-demand only when the deadline forces it (the time
    left is less than the work left plus two restart overheads), then to the end."""

    name = "greedy"

    def __init__(self, job: DeadlineJob) -> None:
        self.job = job
        self.forced = False

    def decide(self, view: TickView) -> Run:
        if self.forced or view.hours_left < view.work_left_h + 2 * self.job.overhead_h:
            self.forced = True
            return Run.ON_DEMAND
        return Run.SPOT if view.spot_available else Run.WAIT


class OnDemand(_Blind):
    name = "on-demand"

    def decide(self, view: TickView) -> Run:
        return Run.ON_DEMAND


def _window(trace: SpotTrace, start_tick: int, job: DeadlineJob) -> list[bool]:
    """Whether spot can be had at each tick from the start until the deadline."""
    ticks = math.ceil(job.deadline_h * 3600 / trace.gap_s - _EPSILON)
    return [count > 0 for count in trace.counts[start_tick : start_tick + ticks]]


def check(trace: SpotTrace, start_tick: int, job: DeadlineJob) -> None:
    """A ValueError saying what is wrong with this run, if anything."""
    if job.work_h <= 0:
        raise ValueError(f"--hours must be above 0, not {job.work_h:g}")
    if not 0 < job.spot_price_ratio <= 1:
        raise ValueError(f"--spot-price-ratio must be in (0, 1], not {job.spot_price_ratio:g}")
    if job.overhead_h < 0:
        raise ValueError(f"--overhead must be 0 or more, not {job.overhead_h:g}")
    if job.deadline_h < job.work_h + job.overhead_h - _EPSILON:
        raise ValueError(
            f"a deadline of {job.deadline_h:g} h is shorter than the work ({job.work_h:g} h) "
            f"plus one start ({job.overhead_h:g} h): not even on-demand can meet it"
        )
    if not 0 <= start_tick < len(trace.counts):
        raise ValueError(
            f"--start-tick {start_tick} is past the end of {trace.name} ({len(trace.counts)} ticks)"
        )
    left_h = (len(trace.counts) - start_tick) * trace.gap_s / 3600
    if left_h + _EPSILON < job.deadline_h:
        raise ValueError(
            f"{trace.name} from tick {start_tick} covers {left_h:.1f} h, "
            f"less than the deadline of {job.deadline_h:g} h"
        )


def forecast(
    trace: SpotTrace, tick: int, rng: random.Random, accuracy: float = FORECAST_ACCURACY
) -> SpotAdvice:
    """Compute Engine's capacity advice at `tick`, modelled from the trace's next hour and
    right `accuracy` of the time: an uptime of 60 min if spot stays the whole hour, else
    10 min (the two values Compute Engine gives), the other one when wrong; obtainable
    when the pool has spot now."""
    hour = max(1, round(3600 / trace.gap_s))
    ahead = trace.counts[tick : tick + hour]
    stays = len(ahead) == hour and all(count > 0 for count in ahead)
    if rng.random() >= accuracy:
        stays = not stays
    return SpotAdvice(
        obtainability=1.0 if trace.counts[tick] > 0 else 0.0,
        uptime_h=1.0 if stays else 10 / 60,
    )


def run_online(
    policy: OnlinePolicy,
    trace: SpotTrace,
    start_tick: int,
    job: DeadlineJob,
    *,
    history_h: float = HISTORY_H,
    advice: Callable[[int], SpotAdvice] | None = None,
) -> Outcome:
    """One job under an online policy: at each tick the policy sees the pool then, the past
    (up to `history_h` of the trace before the start), and the job; a spot instance is lost
    at the first tick the pool has none. With `advice`, it is also told the cloud's
    forecast at each tick (by the trace's tick)."""
    tick_h = trace.gap_s / 3600
    first = max(0, start_tick - int(history_h / tick_h))
    for count in trace.counts[first:start_tick]:
        policy.observe(count > 0, tick_h)
    running = Run.WAIT
    overhead_left = 0.0
    done = spot_h = od_h = cost = 0.0
    starts = preemptions = moves = 0
    last_started: Run | None = None
    for i, available in enumerate(_window(trace, start_tick, job)):
        elapsed = i * tick_h
        policy.observe(available, tick_h)
        if running is Run.SPOT and not available:
            running, overhead_left = Run.WAIT, 0.0
            preemptions += 1
        view = TickView(
            elapsed_h=elapsed,
            hours_left=job.deadline_h - elapsed,
            work_left_h=job.work_h - done,
            running=running,
            overhead_left_h=overhead_left,
            spot_available=available,
            tick_h=tick_h,
            advice=None if advice is None else advice(start_tick + i),
        )
        choice = policy.decide(view)
        if choice is Run.SPOT and not available:
            raise AssertionError(f"{policy.name} took spot at tick {i}, when there was none")
        if choice is not running and choice is not Run.WAIT:
            overhead_left = job.overhead_h
            starts += 1
            moves += last_started is not None and choice is not last_started
            last_started = choice
        running = choice
        if running is Run.WAIT:
            overhead_left = 0.0
            continue
        span = min(tick_h, job.deadline_h - elapsed)
        paid_overhead = min(overhead_left, span)
        overhead_left -= paid_overhead
        productive = span - paid_overhead
        price = job.spot_price_ratio if running is Run.SPOT else 1.0
        used = span
        finished = productive >= job.work_h - done - _EPSILON
        if finished:
            used = paid_overhead + (job.work_h - done)
        cost += price * used
        if running is Run.SPOT:
            spot_h += used
        else:
            od_h += used
        if finished:
            return Outcome(policy.name, cost, True, elapsed + used, spot_h, od_h, starts,
                           preemptions, moves)  # fmt: skip
        done += productive
    return Outcome(policy.name, cost, False, None, spot_h, od_h, starts, preemptions, moves)


def optimal(trace: SpotTrace, start_tick: int, job: DeadlineJob) -> Outcome:
    """The least cost that meets the deadline, knowing the whole trace: dynamic programming
    over ticks, on the least cost of each (kind running, progress) pair.

    Exact on a grid of progress fine enough for every value the model can reach: progress
    is whole ticks run less whole restarts, so multiples of gcd(tick, overhead) seconds. A
    start's overhead is charged to progress up front (progress may dip below zero while it
    is paid): that undercounts only a run that ends within its own overhead, which never
    pays (all cost, no progress), so the least cost is unchanged. Only progress that can
    still be had and still meet the deadline is kept at each tick (a band between
    `work - time left` and `time elapsed`), which is what keeps a 72-hour run of 34-second
    ticks (2-second grid) to seconds."""
    gap_s = trace.gap_s
    overhead_s = round(job.overhead_h * 3600)
    work_s = job.work_h * 3600
    deadline_s = job.deadline_h * 3600
    unit = math.gcd(gap_s, overhead_s) if overhead_s else gap_s
    g, r = gap_s // unit, overhead_s // unit
    size = r + math.ceil(work_s / unit - _EPSILON)
    # Index j holds progress (j - r) * unit seconds; every index kept has work still to do.
    need_s = work_s - (np.arange(size) - r) * unit
    ratio, tick_cost, inf = job.spot_price_ratio, gap_s / 3600, np.inf
    later_s = -need_s  # ascending, for searchsorted
    waiting, spot, on_demand = (np.full(size, inf) for _ in range(3))
    nxt_waiting, nxt_spot, nxt_od = (np.full(size, inf) for _ in range(3))
    idle_or_spot, idle_or_od = np.full(size, inf), np.full(size, inf)
    waiting[r] = 0.0
    lo, hi = r, r + 1
    """The band of indices that holds the states now: nothing outside it is ever read."""
    best = math.inf
    for i, spot_now in enumerate(_window(trace, start_tick, job)):
        span_s = min(gap_s, deadline_s - i * gap_s)
        band = slice(lo, hi)
        np.minimum(waiting[band], spot[band], out=idle_or_spot[band])
        np.minimum(waiting[band], on_demand[band], out=idle_or_od[band])
        # Ending within this tick: running on, or starting (a start pays its overhead).
        moves = [(1.0, on_demand, idle_or_spot)]
        if spot_now:
            moves.append((ratio, spot, idle_or_od))
        for price, running, starting in moves:
            for cost, extra_s in ((running, 0.0), (starting, float(overhead_s))):
                best = min(
                    best,
                    _cheapest_end(
                        cost,
                        need_s=need_s,
                        later_s=later_s,
                        price=price,
                        extra_s=extra_s,
                        span_s=span_s,
                        band=band,
                    ),
                )
        if span_s < gap_s:
            break  # the deadline falls within this tick: nothing runs past it
        # The next band: what this tick can reach (a start moves progress down by its
        # overhead, a tick run moves it up), less what could no longer end in time even
        # on on-demand from the next tick.
        left_s = deadline_s - (i + 1) * gap_s
        new_lo = max(0, lo + min(0, g - r), r + math.floor((work_s - left_s) / unit))
        new_hi = min(size, hi + g)
        if new_lo >= new_hi:
            break  # nothing can still meet the deadline
        new = slice(new_lo, new_hi)
        nxt_waiting[new] = inf
        kept = slice(max(lo, new_lo), min(hi, new_hi))
        np.minimum(idle_or_spot[kept], on_demand[kept], out=nxt_waiting[kept])
        _shifted_min(nxt_od, on_demand, idle_or_spot, g=g, r=r, old=band, new=new)
        nxt_od[new] += tick_cost
        if spot_now:
            _shifted_min(nxt_spot, spot, idle_or_od, g=g, r=r, old=band, new=new)
            nxt_spot[new] += ratio * tick_cost
        else:
            nxt_spot[new] = inf
        waiting, nxt_waiting = nxt_waiting, waiting
        spot, nxt_spot = nxt_spot, spot
        on_demand, nxt_od = nxt_od, on_demand
        lo, hi = new_lo, new_hi
    met = best < math.inf
    return Outcome("optimal", best if met else math.nan, met, None, 0.0, 0.0, 0, 0)


def _cheapest_end(
    cost: np.ndarray,
    *,
    need_s: np.ndarray,
    later_s: np.ndarray,
    price: float,
    extra_s: float,
    span_s: float,
    band: slice,
) -> float:
    """The least cost of ending within a tick of `span_s` from the states in `band`, each
    needing `need_s` more (and `extra_s` of overhead) at `price` per hour."""
    # Work left falls as the index rises: the states that end are the top ones.
    first = max(band.start, int(np.searchsorted(later_s, extra_s - span_s - _EPSILON)))
    if first >= band.stop:
        return math.inf
    ends = slice(first, band.stop)
    return float(np.min(cost[ends] + price * (need_s[ends] + extra_s) / 3600))


def _shifted_min(
    out: np.ndarray,
    running: np.ndarray,
    starting: np.ndarray,
    *,
    g: int,
    r: int,
    old: slice,
    new: slice,
) -> None:
    """out[j] = min(running[j - g], starting[j - g + r]) over the band `new`, reading only
    the band `old` (anything outside it is no state at all)."""
    out[new] = np.inf
    for source, by in ((running, g), (starting, g - r)):
        a, b = max(new.start, old.start + by), min(new.stop, old.stop + by)
        if a < b:
            np.minimum(out[a:b], source[a - by : b - by], out=out[a:b])


def make_policy(name: str, job: DeadlineJob) -> OnlinePolicy:
    makers: dict[str, Callable[[DeadlineJob], OnlinePolicy]] = {
        "spotrain": Spotrain,
        "uniform-progress": UniformProgress,
        "greedy": Greedy,
        "on-demand": lambda _: OnDemand(),
    }
    return makers[name](job)


def run(
    name: str,
    trace: SpotTrace,
    start_tick: int,
    job: DeadlineJob,
    learnt: PoolRecord | None = None,
) -> Outcome:
    """One policy's outcome. With `learnt`, the platform's policy starts from what the live
    platform learnt of a pool instead of the trace's past, and no policy sees that past."""
    if name == "optimal":
        return optimal(trace, start_tick, job)
    if name == RENEWAL:
        windows, gaps = renewal.spells(_window(trace, start_tick, job), trace.gap_s / 3600)
        return run_online(RenewalOptimal(job, windows, gaps), trace, start_tick, job)
    if name == FORECAST:
        told = Spotrain(job, learnt)
        told.name = FORECAST
        # Seeded by the run, so that every policy's run sees the same market and the
        # same forecast, here and in another process.
        rng = random.Random(zlib.crc32(f"{trace.name}:{start_tick}".encode()))  # noqa: S311
        return run_online(
            told,
            trace,
            start_tick,
            job,
            history_h=HISTORY_H if learnt is None else 0.0,
            advice=lambda tick: forecast(trace, tick, rng),
        )
    if learnt is None:
        return run_online(make_policy(name, job), trace, start_tick, job)
    policy = Spotrain(job, learnt) if name == "spotrain" else make_policy(name, job)
    return run_online(policy, trace, start_tick, job, history_h=0.0)


def learnt_of(pool: str, knowledge_file: Path | None) -> PoolRecord:
    """What the platform learnt of `pool`: from a file `spotrain pools --learnt` wrote, or
    from the running stack's scaler. A ValueError or PlatformError says why not."""
    knowledge: PoolsKnowledge | None
    if knowledge_file is not None:
        try:
            knowledge = PoolsKnowledge.model_validate_json(knowledge_file.read_text())
        except ValidationError as error:
            why = error.errors()[0]["msg"]
            msg = f"{knowledge_file}: not what `spotrain pools --learnt` writes ({why})"
            raise ValueError(msg) from None
        where = str(knowledge_file)
    else:
        knowledge = asyncio.run(_stack_knowledge())
        where = "the stack"
        if knowledge is None:
            raise ValueError("the stack's scaler has learnt nothing yet (spotrain status)")
    record = knowledge.pools.get(pool)
    if record is None:
        known = ", ".join(sorted(knowledge.pools)) or "none"
        raise ValueError(f"--learnt {pool}: {where} knows no such pool (pools: {known})")
    return record


async def _stack_knowledge() -> PoolsKnowledge | None:
    async with await SpotrainClient.connect() as client:
        return await client.knowledge()


class _Parser(argparse.ArgumentParser):
    """Bad arguments are a ValueError, reported on one line like any other bad input."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="spotrain simulate deadline", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--spot-trace", type=Path, required=True, help="a spot market trace (JSON)")
    p.add_argument("--hours", type=float, required=True, help="work, in hours of running")
    p.add_argument("--deadline", type=float, required=True, help="hours from the start")
    p.add_argument("--overhead", type=float, default=0.2, help="hours each start costs")
    p.add_argument("--spot-price-ratio", type=float, default=0.3)
    p.add_argument("--start-tick", type=int, default=0)
    p.add_argument("--policy", default=",".join(POLICIES), help=f"any of {','.join(POLICIES)}")
    p.add_argument("--json", action="store_true", help="a list of {policy, cost, met}")
    p.add_argument(
        "--learnt",
        metavar="POOL",
        help="start the platform's policy from what the live platform learnt of POOL "
        "(its stock-outs and windows) instead of the trace's past",
    )
    p.add_argument(
        "--knowledge",
        type=Path,
        metavar="FILE",
        help="with --learnt: read it from FILE (`spotrain pools --learnt > FILE`), not the stack",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        names = tuple(n for n in args.policy.split(",") if n)
        for name in names:
            if name not in (*POLICIES, FORECAST, RENEWAL):
                choices = ", ".join((*POLICIES, FORECAST, RENEWAL))
                raise ValueError(f"unknown policy {name!r}; choose from {choices}")
        trace = read_spot_trace(args.spot_trace)
        job = DeadlineJob(args.hours, args.deadline, args.overhead, args.spot_price_ratio)
        check(trace, args.start_tick, job)
        if args.knowledge is not None and args.learnt is None:
            raise ValueError("--knowledge needs --learnt POOL")
        learnt = learnt_of(args.learnt, args.knowledge) if args.learnt else None
    except (OSError, ValueError, PlatformError) as error:
        # The user's to fix: one line, nothing written, no traceback.
        print(f"spotrain simulate deadline: error: {error}", file=sys.stderr)
        return 2
    outcomes = [run(name, trace, args.start_tick, job, learnt) for name in names]
    if args.json:
        print(json.dumps([o.as_json() for o in outcomes]))
        return 0
    for o in outcomes:
        met = "met" if o.met_deadline else "MISSED"
        print(f"{o.policy:>17}  {o.cost_od_hours:8.2f} on-demand hours  deadline {met}")
    return 0
