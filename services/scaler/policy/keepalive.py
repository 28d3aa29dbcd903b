"""How long an idle node is kept, pure: per pool, the idle timeout that would have cost the
least over the idle periods seen. A data-driven ski rental: keeping an idle node costs its
price by the second; releasing it costs a boot of a new one when work comes back for it.
A fixed timeout equal to the boot is 2-competitive whatever comes; the pool's history does
better on real arrivals (bursts reuse nodes within seconds, lulls never do).

It learns from each idle period of the pool's nodes: work came for the node `x` s after
it went idle (it was taken, or a node of the pool was launched while it was gone: the
work it would have run), or none came within the configured timeout. For any timeout `t`
up to that one the cost of a period is then exact (`x` if `x <= t`, else `t` and a boot;
`t` when no work came), so the timeout chosen is the best fixed one in hindsight.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from datetime import datetime
from itertools import accumulate

from shared.events.types import Frozen

MIN_PERIODS = 20
"""Fewer idle periods seen than this: the configured timeout stands."""


def best_idle_timeout_s(
    reused_after_s: Sequence[float],
    released: int,
    boot_s: float,
    longest_s: float,
) -> float:
    """The idle timeout in [0, longest_s] that would have cost least over these idle
    periods: idle seconds paid, plus `boot_s` for each one whose work came only after the
    timeout (it would have waited for, and paid for, a new node's boot); the `released`
    periods, for which no work came within `longest_s`, cost the timeout itself. Ties go
    to the longer timeout, whose reuse also spares the work a wait."""
    if len(reused_after_s) + released < MIN_PERIODS:
        return longest_s
    reused = sorted(reused_after_s)
    prefix = [0.0, *accumulate(reused)]
    best_t, best_cost = longest_s, float("inf")
    for t in sorted({0.0, longest_s, *(x for x in reused if x <= longest_s)}, reverse=True):
        k = bisect.bisect_right(reused, t)  # reused within t: they cost their idle time
        cost = prefix[k] + (len(reused) - k) * (t + boot_s) + released * t
        if cost < best_cost - 1e-9:
            best_t, best_cost = t, cost
    return best_t


IDLE_PERIODS_KEPT = 1000
"""Per pool, the latest idle periods learnt from: the pool's recent weeks, not its life."""


class IdleHistory(Frozen):
    """What one pool's keep-alive learns from: when its nodes went idle, for the periods no
    work has ended yet (oldest first), and the latest periods that ended (`periods`: work
    came after so many seconds, or None when none came within the longest timeout)."""

    open_since: tuple[datetime, ...] = ()
    periods: tuple[float | None, ...] = ()

    def went_idle(self, since: datetime) -> IdleHistory:
        return self.model_copy(update={"open_since": tuple(sorted((*self.open_since, since)))})

    def demand_came(self, now: datetime, longest_s: float) -> IdleHistory:
        """Work came for a node of the pool (an idle one was taken, or one was launched):
        it ends the oldest idle period still open, as if that node had been kept, whichever
        node it was and whatever timeout let it go. The periods older than `longest_s`
        end first, with no work."""
        starts = list(self.open_since)
        ended: list[float | None] = []
        while starts and (now - starts[0]).total_seconds() > longest_s:
            starts.pop(0)
            ended.append(None)
        if starts:
            ended.append(max(0.0, (now - starts.pop(0)).total_seconds()))
        if not ended:
            return self
        periods = (*self.periods, *ended)[-IDLE_PERIODS_KEPT:]
        return IdleHistory(open_since=tuple(starts), periods=periods)

    def timeout_s(self, boot_s: float, longest_s: float) -> float:
        reused = [x for x in self.periods if x is not None]
        return best_idle_timeout_s(reused, len(self.periods) - len(reused), boot_s, longest_s)
