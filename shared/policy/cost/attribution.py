"""Cost attribution: who used which node-seconds. Pure: no I/O, no clock, no asyncio.

Every node-second of the window is attributed exactly once, in exact rational arithmetic
(so that the parts add up to the bill to the last fraction of a cent):

- to the attempts that held the node's resources at that second, by their share of the
  node: GPUs on a GPU node, CPUs on a CPU-only node. While some attempt holds GPUs on a
  GPU node, one that holds none there is not charged (the GPUs are what the node is paid
  for); while only CPU work holds it, that work shares it by CPUs: it is what keeps the
  node up (an elastic job's CPU workers on the local stack's GPU-declaring nodes);
- the rest to the node's pool as idle.

If the holds on a node ever add up to more than the node has (late or missing end events,
a resubmission placed on a dead node's "free" GPUs), each hold is scaled down to its share
of what is held, so a node-second is still charged once. A hold is charged only for time
its node existed inside the window. A preempted attempt's lost work is the given fraction
of its charge (see `ledger` for how that fraction is found).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from itertools import pairwise

from shared.events.types import CapacityClass

ZERO = Fraction(0)
ONE = Fraction(1)
_SECONDS_PER_HOUR = 3600
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class NodeLife:
    """A billed node: launched at `start`, gone at `end` (None while it is up)."""

    node: str
    pool: str
    capacity: CapacityClass
    gpus: int
    cpus: float
    price_per_hour_usd: float
    on_demand_price_per_hour_usd: float
    """What the same node-second would cost on on-demand capacity."""
    start: datetime
    end: datetime | None = None
    seen_until: datetime | None = None
    """For a node with no end yet, the last time it was seen alive, if that is known: it
    is billed up to there and no further (it may have stopped unrecorded since)."""
    host: str | None = None
    """The machine's name, which attempts hold it by, where the node is another life of
    it (`NodeLaunched.host`): its holds are the machine's within the node's life."""

    @property
    def machine(self) -> str:
        return self.host or self.node


@dataclass(frozen=True)
class Hold:
    """One attempt's hold on one node: `gpus` and `cpus` of it from `start` to `end`."""

    job_id: str
    attempt: int
    node: str
    gpus: int
    cpus: float
    start: datetime
    end: datetime | None = None
    """None while the attempt runs."""
    waste_fraction: Fraction = ZERO
    """The part of its work lost to a preemption, 0 to 1; 0 if it was not preempted."""


@dataclass(frozen=True)
class Charge:
    """What one node's seconds cost one attempt, or idle capacity (`job_id` None)."""

    node: str
    pool: str
    capacity: CapacityClass
    job_id: str | None
    attempt: int | None
    node_seconds: Fraction
    """Node-seconds weighted by the share held: 1800 for half a node for an hour."""
    gpu_seconds: Fraction
    cost_usd: Fraction
    on_demand_usd: Fraction
    waste_usd: Fraction = ZERO

    @property
    def idle(self) -> bool:
        return self.job_id is None

    @property
    def saving_usd(self) -> Fraction:
        return self.on_demand_usd - self.cost_usd


@dataclass(frozen=True)
class Bill:
    """What the provider bills for one node inside the window."""

    node: str
    pool: str
    capacity: CapacityClass
    node_seconds: Fraction
    gpu_seconds: Fraction
    cost_usd: Fraction
    on_demand_usd: Fraction


@dataclass(frozen=True)
class Attribution:
    bills: tuple[Bill, ...]
    charges: tuple[Charge, ...]
    unbilled: tuple[Hold, ...] = ()
    """Holds on nodes with no launch on record (before cost accounting, or past the stream's
    retention): they cost nothing here, because the bill does not know their node."""

    @property
    def cost_usd(self) -> Fraction:
        return sum((b.cost_usd for b in self.bills), ZERO)


def exact(value: float) -> Fraction:
    """A configured figure as the decimal it was written as: 3.6 is 18/5, not the binary
    float nearest to it, so that $3.60/h for an hour is $3.60 to the last digit."""
    return Fraction(repr(value))


def seconds(delta: timedelta) -> Fraction:
    """A duration as exact seconds (datetimes are exact to the microsecond)."""
    return Fraction(delta // _MICROSECOND, 1_000_000)


NodeAttribution = tuple[Bill | None, list[Charge]]
SettledMemo = dict[str, tuple[tuple[NodeLife, tuple[Hold, ...], datetime], NodeAttribution]]
"""Per node: the inputs of its last attribution once it had ended, and the result."""


def attribute(
    nodes: Iterable[NodeLife],
    holds: Iterable[Hold],
    start: datetime,
    end: datetime,
    *,
    settled: SettledMemo | None = None,
) -> Attribution:
    """Attribute every node-second in `[start, end)` once: to holds by share, else to idle.

    No side effects but on `settled`. `end` is "now" for a running node or attempt. A
    caller that attributes again and again as `end` moves on (the scaler's metrics) passes
    the same `settled` each time: a node that ended by `end` is attributed the same for
    every later `end`, so it is worked out again only when its life, its holds or `start`
    change.
    """
    by_node: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        by_node[hold.node].append(hold)
    bills: list[Bill] = []
    charges: list[Charge] = []
    known: set[str] = set()
    for node in nodes:
        known.add(node.machine)
        node_holds = by_node.get(node.machine, [])
        if settled is not None and node.end is not None and node.end <= end:
            key = (node, tuple(node_holds), start)
            remembered = settled.get(node.node)
            if remembered is None or remembered[0] != key:
                remembered = key, _attribute_node(node, node_holds, start, end)
                settled[node.node] = remembered
            bill, node_charges = remembered[1]
        else:
            bill, node_charges = _attribute_node(node, node_holds, start, end)
        if bill is not None:
            bills.append(bill)
            charges += node_charges
    unbilled = tuple(h for name, hs in by_node.items() if name not in known for h in hs)
    return Attribution(bills=tuple(bills), charges=tuple(charges), unbilled=unbilled)


@dataclass
class _Tally:
    node_seconds: Fraction = ZERO
    gpu_seconds: Fraction = ZERO
    wasted_node_seconds: Fraction = ZERO
    """Its node-seconds lost to preemptions: an attempt's holds on one node may differ
    (an elastic attempt's segments)."""


@dataclass
class _Clipped:
    hold: Hold
    start: datetime
    end: datetime


def _attribute_node(
    node: NodeLife, holds: Sequence[Hold], start: datetime, end: datetime
) -> NodeAttribution:
    lo = max(node.start, start)
    hi = min(node.end or node.seen_until or end, end)
    if hi <= lo:
        return None, []
    clipped = []
    for hold in holds:
        a, b = max(hold.start, lo), min(hold.end or hi, hi)
        if b > a and (hold.gpus > 0 or hold.cpus > 0):
            clipped.append(_Clipped(hold, a, b))
    tallies: dict[tuple[str, int], _Tally] = defaultdict(_Tally)
    idle = _Tally()
    cuts = sorted({lo, hi, *(c.start for c in clipped), *(c.end for c in clipped)})
    for t0, t1 in pairwise(cuts):
        span = seconds(t1 - t0)
        active = [c for c in clipped if c.start <= t0 and c.end >= t1]
        # Shared by GPUs where anything holds them; a GPU node that only CPU work holds
        # (or a CPU node) is shared by CPUs: that work is what keeps it up.
        by_gpu = node.gpus > 0 and any(c.hold.gpus > 0 for c in active)
        capacity = Fraction(node.gpus) if by_gpu else exact(node.cpus)
        units = {id(c): Fraction(c.hold.gpus) if by_gpu else exact(c.hold.cpus) for c in active}
        held = sum(units.values(), ZERO)
        whole = max(capacity, held)
        if whole == 0:  # a node with nothing to share is all idle
            idle.node_seconds += span
            idle.gpu_seconds += span * node.gpus
            continue
        for c in active:
            tally = tallies[(c.hold.job_id, c.hold.attempt)]
            share = span * units[id(c)] / whole
            tally.node_seconds += share
            tally.gpu_seconds += share * node.gpus
            tally.wasted_node_seconds += share * min(max(c.hold.waste_fraction, ZERO), ONE)
        idle.node_seconds += span * (whole - held) / whole
        idle.gpu_seconds += span * node.gpus * (whole - held) / whole

    price = exact(node.price_per_hour_usd) / _SECONDS_PER_HOUR
    on_demand = exact(node.on_demand_price_per_hour_usd) / _SECONDS_PER_HOUR

    def charge(job_id: str | None, attempt: int | None, tally: _Tally) -> Charge:
        cost = tally.node_seconds * price
        return Charge(
            node=node.node,
            pool=node.pool,
            capacity=node.capacity,
            job_id=job_id,
            attempt=attempt,
            node_seconds=tally.node_seconds,
            gpu_seconds=tally.gpu_seconds,
            cost_usd=cost,
            on_demand_usd=tally.node_seconds * on_demand,
            waste_usd=tally.wasted_node_seconds * price,
        )

    charges = [charge(job, attempt, tally) for (job, attempt), tally in tallies.items()]
    if idle.node_seconds > 0:
        charges.append(charge(None, None, idle))
    total = seconds(hi - lo)
    bill = Bill(
        node=node.node,
        pool=node.pool,
        capacity=node.capacity,
        node_seconds=total,
        gpu_seconds=total * node.gpus,
        cost_usd=total * price,
        on_demand_usd=total * on_demand,
    )
    return bill, charges
