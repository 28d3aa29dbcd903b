"""What the web page reads from: every job's record and story, and the cost ledger, kept
in memory as the platform's events arrive. The page answers from here, never by reading
the stream again, so a job page costs the same with 10,000 jobs in the store as with one.
No I/O: the server feeds it (`add`, `put_record`) and asks it.

The history comes from the platform's own events: a job's story (its attempts, where
each ran, its metric) is told here after the Ray head that ran it is gone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from shared.events import Event, EventData
from shared.events.data import NodeLost, NodePreempting, PoolResizeFailed
from shared.jobs import JobRecord
from shared.policy.cost import COST_EVENTS, CostFold, Ledger, attributed

OVER_TIME_POINTS = 24
"""Moments a spend-over-time chart is drawn at, evenly over the ledger's span."""


@dataclass
class Board:
    records: dict[str, JobRecord] = field(default_factory=dict)
    histories: dict[str, list[Event[EventData]]] = field(default_factory=lambda: defaultdict(list))
    notices: dict[str, list[Event[EventData]]] = field(default_factory=lambda: defaultdict(list))
    """Preemption notices by node: a job page shows those of the nodes it ran on."""
    take_backs: list[tuple[str, datetime]] = field(default_factory=list)
    """Nodes the cloud took back (`node.lost`): their pool and when."""
    stock_outs: list[tuple[str, datetime]] = field(default_factory=list)
    """Growths the cloud refused (`pool.resize_failed`): the pool and when."""
    seen_ids: set[str] = field(default_factory=set)
    costs: CostFold = field(default_factory=CostFold)
    cost_version: int = 0
    """Changes to what the ledger reads (cost events, node sightings) since the board
    started: a cached ledger is as new as its version. Progress reports, the bulk of the
    stream, change nothing of it."""
    _ledger: tuple[int, Ledger] | None = None

    def add(self, event: Event[EventData]) -> str | None:
        """Take one event from the stream (twice is harmless); the job it is about, if any."""
        if event.id in self.seen_ids:
            return None
        self.seen_ids.add(event.id)
        if isinstance(event.data, COST_EVENTS):
            self.costs.add(event)
            self.cost_version += 1
        data = event.data
        if isinstance(data, NodePreempting):
            self.notices[data.node].append(event)
        elif isinstance(data, NodeLost) and data.pool is not None:
            self.take_backs.append((data.pool, data.lost_at or event.time))
        elif isinstance(data, PoolResizeFailed):
            self.stock_outs.append((data.pool, event.time))
        job_id = getattr(event.data, "job_id", None)
        if isinstance(job_id, str):
            self.histories[job_id].append(event)
            return job_id
        return None

    def put_record(self, record: JobRecord) -> bool:
        """The job's record as the bucket holds it now; whether it changed what is shown."""
        known = self.records.get(record.job_id)
        if known is not None and known.updated_at > record.updated_at:
            return False  # an older read that arrived late
        self.records[record.job_id] = record
        return known != record

    def touch(self) -> None:
        """Something the ledger reads besides the events changed (the node sightings)."""
        self.cost_version += 1

    def history(self, job_id: str) -> list[Event[EventData]]:
        """The job's events, and the notices of the nodes it ran on, in time order."""
        events = list(self.histories.get(job_id, ()))
        record = self.records.get(job_id)
        if record is not None:
            nodes = {n for a in record.attempts for n in (*a.nodes, *a.worker_nodes)}
            for node in nodes:
                events.extend(self.notices.get(node, ()))
        return sorted(events, key=lambda e: e.time)

    def ledger(self, now: datetime, seen: Mapping[str, datetime]) -> Ledger:
        """The cost ledger up to `now`, as `spotrain cost` computes it (the same fold and
        attribution); computed again only when an event arrived since."""
        if self._ledger is not None and self._ledger[0] == self.cost_version:
            return self._ledger[1]
        computed = attributed(self.costs.inputs({}, seen=seen), now=now)
        self._ledger = (self.cost_version, computed)
        return computed


def spend_points(
    ledger: Ledger, key_of: Mapping[str, str], points: int = OVER_TIME_POINTS
) -> list[tuple[datetime, dict[str, float]]]:
    """Cumulative spend per key (a job's experiment, say, by `key_of[job_id]`) at `points`
    moments over the ledger's span. Each charge is spread evenly over its attempt's time on
    its node, as the node's seconds were billed, so the last point is the ledger's total;
    one pass over the charges, whatever the number of jobs."""
    start, end = ledger.start, ledger.end
    if end <= start:
        return []
    spans: dict[tuple[str, int, str], tuple[datetime, datetime]] = {}
    for hold in ledger.inputs.holds:
        key = (hold.job_id, hold.attempt, hold.node)
        held_until = min(hold.end or end, end)
        first, last = spans.get(key, (hold.start, held_until))
        spans[key] = (min(first, hold.start), max(last, held_until))
    step = (end - start) / (points - 1)
    moments = [start + step * index for index in range(points)]
    spent: list[dict[str, float]] = [defaultdict(float) for _ in moments]
    for charge in ledger.attribution.charges:
        job_id = charge.job_id
        if job_id is None or job_id not in key_of or charge.attempt is None:
            continue
        span = spans.get((job_id, charge.attempt, charge.node))
        if span is None:
            continue
        first, last = span
        length_s = (last - first).total_seconds()
        cost = float(charge.cost_usd)
        for index, moment in enumerate(moments):
            if moment <= first:
                continue
            done = (
                1.0
                if moment >= last or length_s <= 0
                else (moment - first).total_seconds() / length_s
            )
            spent[index][key_of[job_id]] += cost * done
    return [(moment, dict(totals)) for moment, totals in zip(moments, spent, strict=True)]
