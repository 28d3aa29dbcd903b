"""From the events on the bus to node lifetimes and attempt holds. Pure: the caller reads the
events and says what time it is.

- A node lives from its `node.launched` (`launched_at`) to the first of its `node.released`
  (`released_at`) and `node.lost` (`lost_at`, else the event's time); a repeated event of
  a node changes nothing. A node with no end yet is billed up to now, or, when its
  sightings are given, up to the last time it was seen alive (never past it: it may have
  stopped unrecorded since).
- An attempt holds, from its `job.started` to its end, its bundle on each node
  `job.started` names, in order (Ray reports the driver's node). The bundle is the
  attempt's `job.queued` one, else the request's worker. It ends at the first of its
  `job.succeeded/failed/interrupted`, `job.cancelled`, the next attempt's `job.resumed`
  or `job.started`; and never after its node.
- A multi-node attempt with a `job.resized` holds its workers' nodes instead (its driver
  asks for nothing): one worker bundle on each node a `job.resized` names, from that
  resize to the next (the first from `job.started`: the attempt had its workers placed
  since it started) or the attempt's end. A resize that went back `steps_lost` steps
  turns that part of the segment before it to waste, on every node of it: all the group
  redoes those steps, not only the worker that went.
- An attempt is preempted when it was interrupted, when the next attempt resumed it, or
  when its node was lost while it ran (and it did not succeed). Its lost work is counted
  by steps, the checkpointer's own measure: `steps_lost` of the next attempt's
  `job.resumed` over the steps the attempt ran (from where it resumed to where it
  reached), as a fraction of what it was charged. An attempt that ran no step, or that no
  `job.resumed` followed (retries exhausted, or not resumed yet), lost all of its work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from shared.events import Event, EventData
from shared.events.data import (
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobQueued,
    JobRequested,
    JobResized,
    JobResumed,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
    NodeLost,
    NodeReleased,
)
from shared.events.types import Bundle, CapacityClass
from shared.policy.cost.attribution import ZERO, Attribution, Hold, NodeLife, SettledMemo, attribute
from shared.policy.cost.pricing import PoolPrice

COST_EVENTS: tuple[type[EventData], ...] = (
    JobRequested,
    JobAccepted,
    JobQueued,
    JobStarted,
    JobSucceeded,
    JobFailed,
    JobCancelled,
    JobInterrupted,
    JobResumed,
    JobResized,
    NodeLaunched,
    NodeReleased,
    NodeLost,
)
"""The events cost accounting reads; anything else passed in is ignored."""


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    owner: str
    experiment: str | None = None


@dataclass(frozen=True)
class CostInputs:
    nodes: tuple[NodeLife, ...]
    holds: tuple[Hold, ...]
    jobs: Mapping[str, JobInfo]
    pools_without_baseline: frozenset[str] = frozenset()
    """Spot pools with no on-demand pool of their shape: their saving counts as 0."""


@dataclass(frozen=True)
class Ledger:
    """The inputs and their attribution over one window."""

    inputs: CostInputs
    attribution: Attribution
    start: datetime
    end: datetime


def spend_by_owner(ledger: Ledger) -> dict[str, float]:
    """What each owner's attempts cost inside the ledger's window; idle capacity is nobody's
    (it is the platform's: a team's budget pays for what its jobs held)."""
    owners = {job_id: info.owner for job_id, info in ledger.inputs.jobs.items()}
    spent: dict[str, Fraction] = {}
    for charge in ledger.attribution.charges:
        owner = owners.get(charge.job_id) if charge.job_id is not None else None
        if owner is not None:
            spent[owner] = spent.get(owner, ZERO) + charge.cost_usd
    return {owner: float(usd) for owner, usd in sorted(spent.items())}


def month_start(now: datetime) -> datetime:
    """The first instant of `now`'s month, in UTC: where a monthly budget starts over."""
    utc = now.astimezone(UTC)
    return utc.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def ledger(
    events: Iterable[Event[Any]],
    *,
    now: datetime,
    since: datetime | None = None,
    prices: Mapping[str, PoolPrice] | None = None,
    seen: Mapping[str, datetime] | None = None,
) -> Ledger:
    """Fold the events and attribute the window `[since, now)` (all of time by default);
    `seen` as `CostFold.inputs` takes it."""
    return attributed(fold(events, prices=prices or {}, seen=seen), now=now, since=since)


def attributed(
    inputs: CostInputs,
    *,
    now: datetime,
    since: datetime | None = None,
    settled: SettledMemo | None = None,
) -> Ledger:
    """Attribute folded inputs over `[since, now)` (all of time by default); `settled` as
    `attribute` takes it, for a caller that attributes again and again."""
    earliest = min((n.start for n in inputs.nodes), default=now)
    start = min(since if since is not None else earliest, now)
    return Ledger(
        inputs=inputs,
        attribution=attribute(inputs.nodes, inputs.holds, start, now, settled=settled),
        start=start,
        end=now,
    )


def fold(
    events: Iterable[Event[Any]],
    *,
    prices: Mapping[str, PoolPrice],
    seen: Mapping[str, datetime] | None = None,
) -> CostInputs:
    """Node lifetimes, attempt holds and job owners from events in stream order."""
    state = CostFold()
    for event in events:
        state.add(event)
    return state.inputs(prices, seen=seen)


AttemptKey = tuple[str, int]


class CostFold:
    """`fold`, one event at a time, for a reader that follows the stream. Adding an event
    twice changes nothing, so a reader may start again from an earlier point."""

    def __init__(self) -> None:
        self.launched: dict[str, NodeLaunched] = {}
        self.node_end: dict[str, datetime] = {}
        self.node_lost: dict[str, datetime] = {}
        self.jobs: dict[str, JobInfo] = {}
        self.requested: dict[str, JobRequested] = {}
        self.queued: dict[AttemptKey, tuple[Bundle, ...]] = {}
        self.started: dict[AttemptKey, tuple[datetime, JobStarted]] = {}
        self.ended: dict[AttemptKey, datetime] = {}
        self.succeeded: set[AttemptKey] = set()
        self.interrupted: set[AttemptKey] = set()
        self.resumed: dict[AttemptKey, JobResumed] = {}
        self.resumed_at: dict[AttemptKey, datetime] = {}
        self.cancelled: dict[str, datetime] = {}
        self.resized: dict[AttemptKey, dict[tuple[object, ...], tuple[datetime, JobResized]]] = {}

    def add(self, event: Event[Any]) -> None:  # noqa: PLR0912  # one branch per event type
        data, at = event.data, event.time
        if isinstance(data, NodeLaunched):
            self.launched.setdefault(data.node, data)
        elif isinstance(data, NodeReleased):
            self._end_node(data.node, data.released_at)
        elif isinstance(data, NodeLost):
            lost_at = data.lost_at or at
            self._end_node(data.node, lost_at)
            self.node_lost[data.node] = min(self.node_lost.get(data.node, lost_at), lost_at)
        elif isinstance(data, JobRequested):
            self.requested.setdefault(data.job_id, data)
            self.jobs.setdefault(data.job_id, JobInfo(data.job_id, data.owner, data.experiment))
        elif isinstance(data, JobAccepted):
            self.jobs.setdefault(data.job_id, JobInfo(data.job_id, data.owner, data.experiment))
        elif isinstance(data, JobQueued):
            self.queued.setdefault((data.job_id, data.attempt), data.bundles)
        elif isinstance(data, JobStarted):
            self.started.setdefault((data.job_id, data.attempt), (at, data))
        elif isinstance(data, JobSucceeded):
            self._end((data.job_id, data.attempt), at)
            self.succeeded.add((data.job_id, data.attempt))
        elif isinstance(data, JobFailed):
            self._end((data.job_id, data.attempt), at)
        elif isinstance(data, JobInterrupted):
            self._end((data.job_id, data.attempt), at)
            self.interrupted.add((data.job_id, data.attempt))
        elif isinstance(data, JobResumed):
            key = (data.job_id, data.attempt)
            self.resumed.setdefault(key, data)
            self.resumed_at.setdefault(key, at)
        elif isinstance(data, JobResized):
            once = (data.previous, data.workers, data.step, data.nodes)
            self.resized.setdefault((data.job_id, data.attempt), {}).setdefault(once, (at, data))
        elif isinstance(data, JobCancelled):
            if data.attempt is None:
                self.cancelled[data.job_id] = min(self.cancelled.get(data.job_id, at), at)
            else:
                self._end((data.job_id, data.attempt), at)

    def _end(self, key: AttemptKey, at: datetime) -> None:
        self.ended[key] = min(self.ended.get(key, at), at)

    def _end_node(self, node: str, at: datetime) -> None:
        self.node_end[node] = min(self.node_end.get(node, at), at)

    def inputs(
        self, prices: Mapping[str, PoolPrice], *, seen: Mapping[str, datetime] | None = None
    ) -> CostInputs:
        """`seen`, when given: when each node was last seen alive. A node with no end is
        then billed up to its last sighting (its launch if it was never seen), not to now."""
        nodes = []
        without_baseline = set()
        for name, launched in self.launched.items():
            node, has_baseline = _node_life(launched, self.node_end.get(name), prices)
            if seen is not None and node.end is None:
                sighting = max(seen.get(name, launched.launched_at), launched.launched_at)
                node = replace(node, seen_until=sighting)
            nodes.append(node)
            if not has_baseline:
                without_baseline.add(launched.pool)
        holds = [hold for key in self.started for hold in self._holds(key)]
        jobs = dict(self.jobs)
        for job_id in {key[0] for key in self.started} - jobs.keys():
            # Not remembered: the job's own request may still be on its way.
            jobs[job_id] = JobInfo(job_id, owner="unknown")
        return CostInputs(
            nodes=tuple(nodes),
            holds=tuple(holds),
            jobs=jobs,
            pools_without_baseline=frozenset(without_baseline),
        )

    def _holds(self, key: AttemptKey) -> list[Hold]:
        job_id, attempt = key
        start, started = self.started[key]
        ends = [
            self.ended.get(key),
            self.cancelled.get(job_id),
            self.resumed_at.get((job_id, attempt + 1)),
            self.started.get((job_id, attempt + 1), (None, None))[0],
        ]
        end = min((e for e in ends if e is not None and e >= start), default=None)
        lost = self._lost(key, started.nodes, start, end)
        if key in self.resized:
            return self._worker_holds(key, start, end, lost=lost)
        bundles = self.queued.get(key) or self._requested_bundles(job_id)
        waste = self._waste_fraction(key) if lost else ZERO
        return [
            Hold(
                job_id=job_id,
                attempt=attempt,
                node=node,
                gpus=bundle.gpus,
                cpus=bundle.cpus,
                start=start,
                end=end,
                waste_fraction=waste,
            )
            for node, bundle in zip(started.nodes, bundles, strict=False)
        ]

    def _worker_holds(
        self, key: AttemptKey, start: datetime, end: datetime | None, *, lost: bool
    ) -> list[Hold]:
        """A multi-node attempt's holds, segment by segment between its resizes."""
        resizes = sorted(self.resized[key].values(), key=lambda timed: timed[0])
        holds = []
        for i, (at, resized) in enumerate(resizes):
            since = start if i == 0 else max(at, start)
            following = resizes[i + 1] if i + 1 < len(resizes) else None
            until = following[0] if following is not None else None
            if end is not None:
                until = end if until is None else min(until, end)
            if until is not None and until <= since:
                continue
            from_step = resized.step or 0
            if following is not None:
                waste = _part_lost(following[1].steps_lost, following[1].step or 0, from_step)
            elif lost:
                waste = self._segment_waste(key, from_step)
            else:
                waste = ZERO
            holds += [
                Hold(
                    job_id=key[0],
                    attempt=key[1],
                    node=node,
                    gpus=resized.worker.gpus,
                    cpus=resized.worker.cpus,
                    start=since,
                    end=until,
                    waste_fraction=waste,
                )
                for node in resized.nodes
            ]
        return holds

    def _segment_waste(self, key: AttemptKey, from_step: int) -> Fraction:
        """The part of an attempt's last segment lost with the attempt."""
        resumed = self.resumed.get((key[0], key[1] + 1))
        if resumed is None:
            return Fraction(1)
        ran = resumed.from_step + resumed.steps_lost - from_step
        if ran <= 0:
            return Fraction(1)  # as for any lost attempt: it ran no step, all is lost
        return min(Fraction(resumed.steps_lost, ran), Fraction(1))

    def _requested_bundles(self, job_id: str) -> tuple[Bundle, ...]:
        request = self.requested.get(job_id)
        if request is None:
            return (Bundle(),)
        return (request.worker,) * request.num_workers

    def _lost(
        self, key: AttemptKey, nodes: Iterable[str], start: datetime, end: datetime | None
    ) -> bool:
        if key in self.interrupted or (key[0], key[1] + 1) in self.resumed:
            return True
        if key in self.succeeded:
            return False
        return any(
            start <= lost_at and (end is None or lost_at <= end)
            for lost_at in (self.node_lost.get(n) for n in nodes)
            if lost_at is not None
        )

    def _waste_fraction(self, key: AttemptKey) -> Fraction:
        job_id, attempt = key
        resumed = self.resumed.get((job_id, attempt + 1))
        if resumed is None:
            return Fraction(1)
        own = self.resumed.get(key)
        ran = resumed.from_step + resumed.steps_lost - (own.from_step if own else 0)
        if ran <= 0:
            return Fraction(1)
        return min(Fraction(resumed.steps_lost, ran), Fraction(1))


def _part_lost(steps_lost: int, resumed_at: int, from_step: int) -> Fraction:
    """What part of a stretch that ran from `from_step` was lost, when the run went back
    `steps_lost` steps to `resumed_at`."""
    if steps_lost <= 0:
        return ZERO
    ran = resumed_at + steps_lost - from_step
    return Fraction(1) if ran <= 0 else min(Fraction(steps_lost, ran), Fraction(1))


def _node_life(
    launched: NodeLaunched, end: datetime | None, prices: Mapping[str, PoolPrice]
) -> tuple[NodeLife, bool]:
    """The node with its prices, and whether its on-demand baseline is known.

    A pool's override comes first, then what the node carried from the pools file. The
    baseline of an on-demand node is its own price; of a spot node, its on-demand pool's
    (overridden too); a spot node with none is measured against itself (no saving).
    """
    own = prices.get(launched.pool, PoolPrice())
    override = own.price(launched.capacity)
    price = launched.price_per_hour_usd if override is None else override
    if launched.capacity is CapacityClass.ON_DEMAND:
        on_demand: float | None = price
    else:
        counterpart = prices.get(launched.on_demand_pool or "", PoolPrice())
        on_demand = _first(
            own.on_demand_price(),
            counterpart.price(CapacityClass.ON_DEMAND),
            launched.on_demand_price_per_hour_usd,
        )
    node = NodeLife(
        node=launched.node,
        pool=launched.pool,
        capacity=launched.capacity,
        gpus=launched.gpus,
        cpus=launched.cpus,
        price_per_hour_usd=price,
        on_demand_price_per_hour_usd=price if on_demand is None else on_demand,
        start=launched.launched_at,
        end=None if end is None else max(end, launched.launched_at),
        host=launched.host,
    )
    return node, on_demand is not None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)
