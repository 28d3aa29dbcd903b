"""The least expected cost of a deadline job on a spot market whose windows of availability
and gaps between them are drawn, independently, from known distributions of their lengths
(a renewal model of the market), pure: a yardstick for `bench/deadline.py`, not a policy
the platform runs.

Told the lengths of the windows and gaps of a run's own span, it knows everything about the
market but their order: the best that any policy learning the market's distribution (of
windows and of gaps, by age) can hope for, if the market were a renewal process. How far it
stays from the offline optimum says how much of that optimum's advantage lies in the order
of the windows, which no statistics of the past can give.

Dynamic programming over steps of `STEP_H`: the state is the time and work left, what runs
(nothing, spot, on-demand) and the market's spell (a window or a gap) with its age; a start
pays the restart overhead (rounded to whole steps) before any progress, and a spot run is
lost when its window ends. A state that could miss the deadline costs `_MISSED`, so no
action that risks a miss is ever the cheapest."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import numpy as np

from shared.policy.deadline import Run

STEP_H = 0.2
"""One step of the model: a restart overhead of the benchmark's jobs. A tenth of an hour
gives the same figures (within 0.002 of the mean) and takes four times as long."""
AGES = 30
"""Ages told apart, in steps (6 h); older spells go on at the chance the longest show."""
SURE = 1e-3
"""No spell is ever sure to go on, or to end: a spot run always risks its window ending."""
_MISSED = 1e6

_ORDER = (Run.WAIT, Run.ON_DEMAND, Run.SPOT)
_MODE = {run: i for i, run in enumerate(_ORDER)}


def stay_chances(lengths: Sequence[int], ages: int = AGES) -> np.ndarray:
    """For each age (whole steps a spell has lasted), the chance that a spell of these
    lengths (in steps, each at least 1) lasts one more step; the last age stands for every
    older one, at the chance that makes their mean left over right."""
    counts = np.bincount(np.clip(np.asarray(lengths, dtype=int), 1, None), minlength=ages + 2)
    longer = np.array([counts[a + 1 :].sum() for a in range(ages + 1)], dtype=float)
    """longer[a]: spells that lasted past age a."""
    chances = np.full(ages, 0.5)
    seen = longer[:-1] > 0
    chances[seen] = longer[1:][seen] / longer[:-1][seen]
    old = [k - (ages - 1) for k in lengths if k >= ages]
    if old:
        chances[ages - 1] = 1 - 1 / max(float(np.mean(old)), 1.0)
    clipped: np.ndarray = np.clip(chances, SURE, 1 - SURE)
    return clipped


@dataclass(frozen=True)
class RenewalPlan:
    """Each state's cheapest action, by (time left, work left, spell, running)."""

    actions: np.ndarray
    step_h: float

    @classmethod
    def solve(
        cls,
        *,
        windows: Sequence[float],
        gaps: Sequence[float],
        work_h: float,
        deadline_h: float,
        overhead_h: float,
        spot_price_ratio: float,
        step_h: float = STEP_H,
    ) -> RenewalPlan:
        """The plan for a job of `work_h` due in `deadline_h`, on a market whose windows and
        gaps last as long as `windows` and `gaps` (hours) did."""
        steps = max(1, round(overhead_h / step_h)) if overhead_h > 0 else 0
        stay, goes_on, turns, in_window = _market(windows, gaps, step_h)

        def next_step(value: np.ndarray) -> np.ndarray:
            """The value one step on, over where the spell goes."""
            stepped: np.ndarray = value[:, goes_on] * stay + value[:, turns] * (1 - stay)
            return stepped

        def after(value: np.ndarray, count: int) -> np.ndarray:
            for _ in range(count):
                value = next_step(value)
            return value

        time_steps = math.floor(deadline_h / step_h + 1e-9)
        work_steps = math.ceil(work_h / step_h - 1e-9)
        shape = (work_steps + 1, 2 * AGES)
        missed = np.full(shape, _MISSED)
        done = missed.copy()
        done[0] = 0.0
        actions = np.zeros((time_steps + 1, *shape, len(_ORDER)), dtype=np.int8)
        kept = max(steps, 1)
        idle: deque[np.ndarray] = deque([done], maxlen=kept)
        on_demand: deque[np.ndarray] = deque([done], maxlen=kept)
        after_spot: deque[np.ndarray] = deque([done], maxlen=kept)
        """For the last `kept` times left: the value waiting, on on-demand, and just after
        a spot step (on spot if the window goes on, waiting if it ended)."""
        for t in range(1, time_steps + 1):
            wait = next_step(idle[-1])
            run_od, run_spot = missed.copy(), missed.copy()
            run_od[1:] = 1.0 + next_step(on_demand[-1])[:-1]
            run_spot[1:] = spot_price_ratio + next_step(after_spot[-1])[:-1]
            run_spot[:, ~in_window] = _MISSED
            if steps == 0:  # a start costs nothing: it is a step run
                start_od, start_spot = run_od, run_spot
            elif t >= steps:
                start_od = steps + after(on_demand[-steps], steps)
                start_spot = steps * spot_price_ratio + after(after_spot[-steps], steps)
            else:
                start_od = start_spot = missed
            start_spot = np.where(in_window, start_spot, _MISSED)
            values = []
            by_mode = (
                (wait, start_od, start_spot),
                (wait, run_od, start_spot),
                (wait, start_od, run_spot),
            )
            for mode, choices in enumerate(by_mode):
                stacked = np.stack(choices)
                actions[t, :, :, mode] = stacked.argmin(axis=0)
                best = np.minimum(stacked.min(axis=0), _MISSED)
                best[0] = 0.0
                values.append(best)
            idle.append(values[0])
            on_demand.append(values[1])
            after_spot.append(np.where(in_window, values[2], values[0]))
        return cls(actions=actions, step_h=step_h)

    def action(
        self,
        *,
        hours_left: float,
        work_left_h: float,
        running: Run,
        spot_available: bool,
        age_h: float,
    ) -> Run:
        """The plan's action now: `age_h` is how long the spell now (a window if spot is
        available, else a gap) has lasted. Time is rounded down and work up, to the step."""
        t = min(max(int(hours_left / self.step_h + 1e-9), 0), self.actions.shape[0] - 1)
        w = min(math.ceil(work_left_h / self.step_h - 1e-9), self.actions.shape[1] - 1)
        age = min(int(age_h / self.step_h + 1e-9), AGES - 1)
        spell = age if spot_available else AGES + age
        return _ORDER[self.actions[t, w, spell, _MODE[running]]]


def _market(
    windows: Sequence[float], gaps: Sequence[float], step_h: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The market's spells as states (a window of each age, then a gap of each age): the
    chance each goes on a step, where it goes if it does, where if it ends, and which are
    windows."""
    stay = np.concatenate(
        [
            stay_chances([max(1, round(x / step_h)) for x in windows] or [1]),
            stay_chances([max(1, round(x / step_h)) for x in gaps] or [1]),
        ]
    )
    ages = np.arange(AGES)
    older = np.minimum(ages + 1, AGES - 1)
    goes_on = np.concatenate([older, AGES + older])
    turns = np.concatenate([np.full(AGES, AGES), np.zeros(AGES, dtype=int)])
    in_window = np.arange(2 * AGES) < AGES
    if not windows:
        stay[~in_window] = 1.0  # never any spot: the gap never ends
    return stay, goes_on, turns, in_window


def spells(available: Sequence[bool], step_h: float) -> tuple[list[float], list[float]]:
    """The lengths (hours) of the windows and of the gaps in a run of sightings `step_h`
    apart, the first and last as far as they go."""
    windows: list[float] = []
    gaps: list[float] = []
    for seen, run in groupby(available):
        (windows if seen else gaps).append(sum(1 for _ in run) * step_h)
    return windows, gaps
