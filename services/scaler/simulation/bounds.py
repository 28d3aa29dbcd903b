"""Yardsticks for a replay's cost, pure: what no policy could beat on its trace.

- The lower bound (`Result.lower_bound_usd`): every GPU-second of work at the cheapest
  GPU-second price, as if nodes cost nothing while idle or booting.
- The reuse bound (`reuse_bound_usd`): the same work run at its arrival, one GPU a unit,
  by a keep-alive that knows the arrivals: a unit that falls idle is kept exactly when its
  next use comes within a boot (the break-even: keeping it costs the gap, letting it go a
  boot when work comes back), and every start pays its boot. A node of several GPUs only
  adds to it, and a policy that lets work wait trades cost for the wait it adds.
"""

from __future__ import annotations

from collections.abc import Iterable


def reuse_bound_usd(
    jobs: Iterable[tuple[float, float, int]], price_per_gpu_s: float, boot_s: float
) -> float:
    """The reuse bound of jobs given as (arrival s, duration s, GPUs)."""
    changes: list[tuple[float, int]] = []
    for arrival_s, duration_s, gpus in jobs:
        changes += [(arrival_s, gpus), (arrival_s + duration_s, -gpus)]
    # Ends before starts at one instant: a unit freed and taken again is never idle.
    changes.sort(key=lambda change: (change[0], change[1]))
    busy_since: dict[int, float] = {}
    idle_since: dict[int, float] = {}
    paid_s = 0.0
    level = 0
    for at_s, delta in changes:
        if delta > 0:
            for unit in range(level + 1, level + delta + 1):
                freed = idle_since.pop(unit, None)
                paid_s += boot_s if freed is None else min(at_s - freed, boot_s)
                busy_since[unit] = at_s
        else:
            for unit in range(level + delta + 1, level + 1):
                paid_s += at_s - busy_since.pop(unit)
                idle_since[unit] = at_s
        level += delta
    return paid_s * price_per_gpu_s
