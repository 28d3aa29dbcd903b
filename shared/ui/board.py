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
from fractions import Fraction

from shared.cost import CostFold, Ledger, attributed
from shared.cost.report import CostRow, GroupBy, cost_rows, job_costs
from shared.events import Event, EventData
from shared.events.data import NodeLost, NodePreempting, PoolResizeFailed
from shared.jobs import JobRecord

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
    version: int = 0
    """Changes on the board since it started: a cached ledger is as new as its version."""
    _ledger: tuple[int, Ledger] | None = None

    def add(self, event: Event[EventData]) -> str | None:
        """Take one event from the stream (twice is harmless); the job it is about, if any."""
        if event.id in self.seen_ids:
            return None
        self.seen_ids.add(event.id)
        self.version += 1
        self.costs.add(event)
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
        self.version += 1
        return known != record

    def touch(self) -> None:
        """Something the ledger reads besides the events changed (the node sightings)."""
        self.version += 1

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
        if self._ledger is not None and self._ledger[0] == self.version:
            return self._ledger[1]
        computed = attributed(self.costs.inputs({}, seen=seen), now=now)
        self._ledger = (self.version, computed)
        return computed

    def job_costs(self, ledger: Ledger) -> dict[str, CostRow]:
        return job_costs(ledger)

    def rows(self, ledger: Ledger, by: GroupBy) -> list[CostRow]:
        return cost_rows(ledger, by)


def spend_points(
    ledger: Ledger, key_of: Mapping[str, str], points: int = OVER_TIME_POINTS
) -> list[tuple[datetime, dict[str, Fraction]]]:
    """Cumulative spend per key (a job's experiment, owner or team, by `key_of[job_id]`) at
    `points` moments over the ledger's span: attributed again up to each moment, so each
    point is what `spotrain cost` would have said then."""
    start, end = ledger.start, ledger.end
    if end <= start:
        return []
    step = (end - start) / (points - 1)
    result = []
    for index in range(points):
        moment = start + step * index
        partial = attributed(ledger.inputs, now=moment, since=start)
        spent: dict[str, Fraction] = defaultdict(Fraction)
        for charge in partial.attribution.charges:
            if charge.job_id is not None and charge.job_id in key_of:
                spent[key_of[charge.job_id]] += charge.cost_usd
        result.append((moment, dict(spent)))
    return result
