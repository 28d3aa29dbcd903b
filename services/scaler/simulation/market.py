"""Spot markets for the cluster replay: a spot pool that follows a real trace can hold, at
each tick, at most the trace's count of nodes. Growth past the count is a stock-out; a drop
below the nodes held takes nodes back (a preemption). A trace shorter than the replay
starts over from its first tick."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from services.scaler.model import PoolSpec
from services.scaler.simulation.traces import SpotTrace, read_spot_trace
from shared.events.types import CapacityClass


@dataclass(frozen=True, slots=True)
class SpotMarket:
    """One pool's market: its trace from `offset`, tick 0 at `start_s` of the replay."""

    pool: str
    trace: SpotTrace
    offset: int
    start_s: float
    changes: tuple[int, ...]
    """The ticks of one cycle (from the offset) at which the count differs from the tick
    before (tick 0 always)."""

    @classmethod
    def of(cls, pool: str, trace: SpotTrace, offset: int, start_s: float) -> SpotMarket:
        counts = trace.counts[offset:] + trace.counts[:offset]
        changes = tuple(i for i in range(len(counts)) if i == 0 or counts[i] != counts[i - 1])
        return cls(pool, trace, offset, start_s, changes)

    def _tick(self, at_s: float) -> int:
        return max(0, math.floor((at_s - self.start_s) / self.trace.gap_s + 1e-9))

    def count_at(self, at_s: float) -> int:
        """How many nodes of the pool can be held at this time."""
        counts = self.trace.counts
        return counts[(self.offset + self._tick(at_s)) % len(counts)]

    def next_change_s(self, after_s: float) -> float:
        """When the count next changes after `after_s` (inf for a count that never does)."""
        if len(self.changes) == 1:
            return math.inf
        cycle = len(self.trace.counts)
        tick = self._tick(after_s)
        base, within = divmod(tick, cycle)
        k = bisect.bisect_right(self.changes, within)
        change = self.changes[k] + base * cycle if k < len(self.changes) else (base + 1) * cycle
        return self.start_s + change * self.trace.gap_s


def parse_spot_trace_option(value: str) -> tuple[str, Path, int]:
    """`POOL=FILE[@OFFSET]` → (pool, file, offset tick)."""
    pool, sep, rest = value.partition("=")
    if not sep or not pool or not rest:
        raise ValueError(f"--spot-trace {value!r}: expected POOL=FILE[@OFFSET]")
    path, _, offset = rest.rpartition("@") if "@" in rest else (rest, "", "0")
    try:
        tick = int(offset)
    except ValueError:
        raise ValueError(f"--spot-trace {value!r}: the offset {offset!r} is not a tick") from None
    if tick < 0:
        raise ValueError(f"--spot-trace {value!r}: the offset must be 0 or more")
    return pool, Path(path), tick


def markets(options: Sequence[str], pools: Sequence[PoolSpec]) -> dict[str, tuple[SpotTrace, int]]:
    """The trace and offset that `--spot-trace` options give each pool; a ValueError names the first
    problem (a pool no pools file defines or that is not spot, a bad file, an offset past
    the trace's end, a pool given twice)."""
    by_name = {p.name: p for p in pools}
    found: dict[str, tuple[SpotTrace, int]] = {}
    for option in options:
        name, path, offset = parse_spot_trace_option(option)
        pool = by_name.get(name)
        if pool is None:
            raise ValueError(
                f"--spot-trace {option!r}: no pool {name!r} in the pools file "
                f"(pools: {', '.join(sorted(by_name))})"
            )
        if pool.capacity is not CapacityClass.SPOT:
            raise ValueError(f"--spot-trace {option!r}: {name} is not a spot pool")
        if name in found:
            raise ValueError(f"--spot-trace {option!r}: {name} already follows a trace")
        trace = read_spot_trace(path)
        if offset >= len(trace.counts):
            raise ValueError(
                f"--spot-trace {option!r}: offset {offset} is past the end of {path} "
                f"({len(trace.counts)} ticks)"
            )
        found[name] = (trace, offset)
    return found


@dataclass(frozen=True, slots=True)
class MarketRoom:
    """The most the markets allowed a trace's work: its GPU-seconds run at their arrival,
    each on spot wherever the markets then had room for it, the rest on on-demand."""

    work_gpu_s: float
    spot_gpu_s: float
    cost_usd: float
    """The work at the cheapest spot GPU-second where there was room, else on-demand's."""
    on_demand_usd: float
    """The same work all on the cheapest on-demand GPU-second."""

    @property
    def saving_possible(self) -> float:
        """The most any policy could save against all on-demand on these markets."""
        return 1 - self.cost_usd / self.on_demand_usd if self.on_demand_usd else 0.0


def market_room(
    jobs: Sequence[tuple[float, float, int]],
    followed: Sequence[SpotMarket],
    pools: Sequence[PoolSpec],
) -> MarketRoom:
    """`MarketRoom` of jobs given as (arrival s, duration s, GPUs), under markets whose
    pools are among `pools`: a sweep over the moments the work or a market's count changes,
    the spot GPUs at each the least of the work's and the markets' (count times the
    pool's GPUs). An upper bound on spot: no wait, no boot, no node split between jobs is paid."""
    gpus = {p.name: p.gpus for p in pools}
    per_gpu = {
        capacity: min(
            (p.price_per_hour_usd / p.gpus for p in pools if p.gpus and p.capacity is capacity),
            default=math.inf,
        )
        for capacity in (CapacityClass.SPOT, CapacityClass.ON_DEMAND)
    }
    changes = [(start, g) for start, _, g in jobs] + [(start + d, -g) for start, d, g in jobs]
    if not changes:
        return MarketRoom(0.0, 0.0, 0.0, 0.0)
    changes.sort()
    end_s = changes[-1][0]
    moments = {t for t, _ in changes}
    for market in followed:
        t = market.start_s
        while t < end_s:
            moments.add(t)
            t = market.next_change_s(t)
    work = spot = 0.0
    demand, k = 0, 0
    ordered = sorted(moments)
    for t0, t1 in pairwise(ordered):
        while k < len(changes) and changes[k][0] <= t0:
            demand += changes[k][1]
            k += 1
        room = sum(m.count_at(t0) * gpus.get(m.pool, 0) for m in followed)
        work += demand * (t1 - t0)
        spot += min(demand, room) * (t1 - t0)
    cost = (
        spot * per_gpu[CapacityClass.SPOT] + (work - spot) * per_gpu[CapacityClass.ON_DEMAND]
    ) / 3600
    return MarketRoom(
        work_gpu_s=work,
        spot_gpu_s=spot,
        cost_usd=cost,
        on_demand_usd=work * per_gpu[CapacityClass.ON_DEMAND] / 3600,
    )
