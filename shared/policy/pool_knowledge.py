"""What the platform learns of each pool as it runs: how often it takes nodes back, how
often it refuses to grow (a stock-out), and how long it stays available once it is. Pure.

The scaler updates it each pass from what it sees (`observe`) and keeps it in its `pools`
bucket (key `knowledge`), so a restarted scaler keeps what it learnt; `spotrain pools`
shows it, the scaler weighs pools by their losses (`policy.preemption_risk`), and the
checkpointer's deadline decisions read a pool's windows from it (`outlook`) instead of the
prior alone.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, Field

from shared.events.types import Frozen
from shared.policy import deadline

KNOWLEDGE_KEY = "knowledge"
WINDOWS_KEPT = deadline.WINDOWS_KEPT
"""The latest availability windows kept per pool: the deadline policy's window lengths."""


class PoolRecord(Frozen):
    """What the scaler has seen of one pool since it first watched it."""

    pool: str
    watched_since: AwareDatetime
    seen_until: AwareDatetime
    node_hours: float = Field(0.0, ge=0)
    """Node-hours held, as the passes saw them."""
    taken_back: int = Field(0, ge=0)
    """Nodes that went without being released: preempted, or deleted from outside."""
    stock_outs: int = Field(0, ge=0)
    """Growths refused for want of capacity."""
    windows_h: tuple[float, ...] = ()
    """The latest availability windows that closed, in hours: from the first node held
    after a stock-out or a loss, to the next one."""
    available_since: AwareDatetime | None = None
    """When the open window began; None while the pool is out of capacity."""
    windows_closed: int = Field(0, ge=0)
    """Every window that closed, counted (`windows_h` keeps only the latest): how often
    windows come."""

    @property
    def watched_h(self) -> float:
        return (self.seen_until - self.watched_since).total_seconds() / 3600

    def outlook(self, restart_overhead_h: float, now: datetime) -> deadline.SpotOutlook:
        """The deadline policy's view of this pool: its windows, blended with the prior
        while little has been seen."""
        open_h = 0.0
        if self.available_since is not None:
            open_h = max(0.0, (now - self.available_since).total_seconds() / 3600)
        return deadline.outlook(
            deadline.tally(self.windows_h, restart_overhead_h),
            self.watched_h,
            restart_overhead_h,
            open_window_h=open_h,
            # Its age is known only while a node is held (None: not seen, so not judged).
            window_age_h=open_h if self.available_since is not None else None,
            windows_seen=max(self.windows_closed, len(self.windows_h)),
        )


class PoolsKnowledge(Frozen):
    updated_at: AwareDatetime
    pools: dict[str, PoolRecord]


def observe(  # what one pass saw of one pool
    record: PoolRecord | None,
    pool: str,
    *,
    now: datetime,
    nodes: int,
    taken_back: int = 0,
    stocked_out: bool = False,
    max_gap_s: float = float("inf"),
) -> PoolRecord:
    """The record after one pass: `nodes` held since the last pass (no longer ago than
    `max_gap_s`: the time nobody watched is not counted as held), `taken_back` of them
    gone unasked, and whether a growth was refused. A loss or a stock-out closes the open
    window; holding a node opens one."""
    if record is None:
        record = PoolRecord(pool=pool, watched_since=now, seen_until=now)
    elapsed_s = min(max(0.0, (now - record.seen_until).total_seconds()), max_gap_s)
    elapsed_h = elapsed_s / 3600
    windows = record.windows_h
    closed = record.windows_closed
    available_since = record.available_since
    if (taken_back or stocked_out) and available_since is not None:
        closed_h = max(0.0, (now - available_since).total_seconds() / 3600)
        windows = (*windows, closed_h)[-WINDOWS_KEPT:]
        closed = max(closed, len(record.windows_h)) + 1
        available_since = None
    if available_since is None and nodes > 0 and not stocked_out:
        available_since = now
    return record.model_copy(
        update={
            "seen_until": now,
            "node_hours": record.node_hours + nodes * elapsed_h,
            "taken_back": record.taken_back + taken_back,
            "stock_outs": record.stock_outs + int(stocked_out),
            "windows_h": windows,
            "windows_closed": closed,
            "available_since": available_since,
        }
    )
