"""The scaling decision, pure: from pools, nodes, pending demand and the budget to a target
size per pool, the idle nodes to release, and the demand that must wait, each with its
reason. No I/O, no clock (`now` is an argument), no ids."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any

from services.scaler.model import (
    Blocked,
    BlockedReason,
    Demand,
    NodeView,
    ObservedNode,
    Placement,
    PoolPlan,
    PoolSpec,
    ProvidedNode,
    Reason,
    Room,
    ScalePlan,
    ScalerConfig,
)
from services.scaler.policy.elastic import is_queued_attempt
from shared.events.types import Bundle, CapacityClass
from shared.policy.deadline import RESERVE_SHARE, Run, SpotAdvice, SpotOutlook, queued_decision
from shared.policy.pool_knowledge import PoolRecord
from shared.pools import MAX_QUEUE_SHOWN, PoolsStatus, PoolStatus, QueuedAttempt

_EPSILON = 1e-9


def node_views(
    pools: Sequence[PoolSpec],
    provided: Sequence[ProvidedNode],
    observed: Mapping[str, ObservedNode],
    now: datetime,
) -> list[NodeView]:
    """The scaler's view of each node: a launched node not yet in Ray is booting, with all of
    its shape free; a draining node (under a preemption notice) has no room to offer, so its
    jobs' next attempts get new capacity before it goes; nodes of pools no longer configured
    are left out."""
    shapes = {p.name: p.shape for p in pools}
    views = []
    for node in provided:
        if node.pool not in shapes:
            continue
        seen = observed.get(node.name)
        views.append(
            NodeView(
                name=node.name,
                pool=node.pool,
                ready=seen is not None,
                free=(Room() if seen.draining else seen.free) if seen else shapes[node.pool],
                idle_s=seen.idle_s if seen else 0.0,
                age_s=max(0.0, (now - node.launched_at).total_seconds()),
                draining=seen is not None and seen.draining,
            )
        )
    return views


RISK_PRIOR_NODE_HOURS = 10.0
"""A pool barely used yet counts as if this many node-hours had passed without a loss."""


def preemption_risk(
    taken_back: int, node_hours: float, restart_cost_h: float, uptime_h: float | None = None
) -> float:
    """What a pool's preemptions add to the cost of an hour on it, as a share of its price:
    nodes taken back per node-hour seen, each costing a restart (a boot, and the work since
    the last checkpoint). The cloud's advised uptime, where there is one, counts as
    `ADVICE_NODE_HOURS` more node-hours seen with one take-back per uptime: it says what
    the pool is now, which what was seen says only of the past."""
    hours = max(node_hours, 0.0) + RISK_PRIOR_NODE_HOURS
    losses = float(taken_back)
    if uptime_h is not None and uptime_h > 0:
        hours += ADVICE_NODE_HOURS
        losses += ADVICE_NODE_HOURS / uptime_h
    return losses / hours * restart_cost_h


ADVICE_NODE_HOURS = 24.0
"""How many node-hours of watching the cloud's advice is worth, in a pool's preemption risk."""


def eligible_pools(
    demand: Demand,
    pools: Sequence[PoolSpec],
    config: ScalerConfig,
    now: datetime,
    *,
    unavailable: frozenset[str] = frozenset(),
    risk: Mapping[str, float] | None = None,
    spot_gone: frozenset[str] | None = None,
    outlooks: Mapping[str, SpotOutlook] | None = None,
    spot_room: Mapping[str, Sequence[tuple[int, float]]] | None = None,
) -> list[PoolSpec]:
    """The pools a job may grow, cheapest first, of the capacity it may grow (`_allowed`):
    spot for spot jobs, on-demand for on-demand jobs; for `any` jobs, by their deadline, or
    spot and, once they waited past the fallback time or find every spot pool out of
    capacity, on-demand too. Pools out of capacity (`unavailable`) grow not.
    A pool's `risk` (what its preemptions and stock-outs have been seen to add to the cost
    of an hour on it, as a share of its price) counts against it: of two pools of one shape
    in two zones, the one that takes nodes back less often goes first. `spot_gone`: the
    spot pools a deadline job cannot get now (out of capacity, or full), for its policy;
    `unavailable` by default. `outlooks`: what has been seen of each spot pool, for the
    deadline policy (the prior for a pool not in it). `spot_room`: per spot pool, the room
    its nodes have or will have: (free GPUs, seconds until usable: 0 on a ready node, the
    rest of its boot on a booting one)."""
    allowed = _allowed(
        demand,
        pools,
        config,
        now,
        unavailable,
        spot_gone=spot_gone,
        outlooks=outlooks,
        spot_room=spot_room,
    )
    risk = risk or {}
    return sorted(
        (p for p in pools if p.capacity in allowed and p.name not in unavailable),
        key=lambda p: (p.price_per_hour_usd * (1 + risk.get(p.name, 0.0)), p.name),
    )


_SPOT = frozenset({CapacityClass.SPOT})
_ON_DEMAND = frozenset({CapacityClass.ON_DEMAND})
_EITHER = _SPOT | _ON_DEMAND


def _allowed(  # what the decision looks at
    demand: Demand,
    pools: Sequence[PoolSpec],
    config: ScalerConfig,
    now: datetime,
    unavailable: frozenset[str],
    *,
    spot_gone: frozenset[str] | None = None,
    outlooks: Mapping[str, SpotOutlook] | None = None,
    spot_room: Mapping[str, Sequence[tuple[int, float]]] | None = None,
) -> frozenset[CapacityClass]:
    """The capacity a job may grow. Spot and on-demand jobs: what they asked for. An `any`
    job with a deadline and a known pace: what the deadline policy runs it on (on-demand
    only when it says on-demand; spot when it says spot or to wait for spot), never just
    for having waited. Any other `any` job: spot, and on-demand too once it waited long
    enough for spot, or spot capacity is failing in every spot pool."""
    if demand.capacity is CapacityClass.SPOT:
        return _SPOT
    if demand.capacity is CapacityClass.ON_DEMAND:
        return _ON_DEMAND
    if demand.deadline is not None and demand.work_left_s is not None:
        gone = unavailable if spot_gone is None else spot_gone
        needs = _deadline_needs_on_demand(
            demand, pools, config, now, gone, outlooks or {}, spot_room or {}
        )
        return _ON_DEMAND if needs else _SPOT
    if (now - demand.queued_at).total_seconds() >= config.any_fallback_after_s:
        return _EITHER
    spot = [p.name for p in pools if p.capacity is CapacityClass.SPOT]
    return _EITHER if spot and all(name in unavailable for name in spot) else _SPOT


def _deadline_needs_on_demand(  # noqa: PLR0917  # the decision's inputs, passed on
    demand: Demand,
    pools: Sequence[PoolSpec],
    config: ScalerConfig,
    now: datetime,
    unavailable: frozenset[str],
    outlooks: Mapping[str, SpotOutlook],
    spot_room: Mapping[str, Sequence[tuple[int, float]]],
) -> bool:
    assert demand.deadline is not None
    assert demand.work_left_s is not None
    # The pools that could hold one of its bundles: a CPU pool prices no GPU job.
    fits = [p for p in pools if all(b.gpus <= p.gpus and b.cpus <= p.cpus for b in demand.bundles)]
    spot = [p for p in fits if p.capacity is CapacityClass.SPOT]
    on_demand = [p for p in fits if p.capacity is CapacityClass.ON_DEMAND]
    if not on_demand:
        return False
    if not spot:
        return True
    cheapest = min(spot, key=lambda p: (p.price_per_hour_usd, p.name))
    cheapest_spot = cheapest.price_per_hour_usd
    cheapest_on_demand = min(p.price_per_hour_usd for p in on_demand)
    decision = queued_decision(
        hours_left=(demand.deadline - now).total_seconds() / 3600,
        work_left_h=demand.work_left_s / 3600,
        # A start costs a boot (the checkpoint's resume comes on top; not measured yet);
        # room on a node that is up costs none, and on one that boots the rest of its boot:
        # waiting for the node bought for it spends no slack twice, so its decision holds
        # while the node boots and once it is up.
        restart_overhead_h=min(_start_s(p, demand, spot_room) for p in spot) / 3600,
        decision_interval_h=config.pass_interval_s / 3600,
        spot_available=any(p.name not in unavailable for p in spot),
        spot_price_ratio=cheapest_spot / cheapest_on_demand if cheapest_on_demand else 1.0,
        seen=outlooks.get(cheapest.name),
    )
    return decision.run is Run.ON_DEMAND


@dataclass(eq=False, slots=True)
class _Slot:
    """Free room on a node, existing or planned, while demand is being packed. Compared and
    hashed by identity: two nodes with the same free room are still two nodes."""

    pool: str
    gpus: int
    cpus: float
    memory_gb: float
    gpu_type: str | None
    used: bool = False
    """Some pending bundle was placed here: the node is needed, however long it was idle."""
    node: str | None = None
    """The node's name; None for a node this decision would launch."""
    ready: bool = False
    """In Ray and not draining: an attempt placed here can be handed to Ray now."""

    def holds(self, bundle: Bundle) -> bool:
        if bundle.gpus > 0 and bundle.gpu_type is not None and bundle.gpu_type != self.gpu_type:
            return False
        return (
            bundle.gpus <= self.gpus
            and bundle.cpus <= self.cpus + _EPSILON
            and bundle.memory_gb <= self.memory_gb + _EPSILON
        )

    def holds_all(self, bundles: Sequence[Bundle]) -> bool:
        """Whether each bundle on its own fits (the bundles together need not)."""
        return all(self.holds(bundle) for bundle in bundles)


def _slot_for_new_node(shape: _Slot, bundle: Bundle) -> _Slot:
    """A node about to be launched with the bundle already on it."""
    return _Slot(
        shape.pool,
        shape.gpus - bundle.gpus,
        shape.cpus - bundle.cpus,
        shape.memory_gb - bundle.memory_gb,
        shape.gpu_type,
    )


class _FreeRoom:
    """Free room by pool and by free GPUs, so that placing a bundle looks only at the nodes
    with the fewest free GPUs that could hold it, not at every node: a decision for ten
    thousand jobs on a thousand nodes takes under 100 ms. Slots with the same free GPUs
    are kept in the order they got there, and the first that holds a bundle takes it."""

    def __init__(self, slots: Iterable[_Slot], *, gpuless_asked: bool) -> None:
        """The room of the given slots, in their order."""
        self.gpuless_asked = gpuless_asked
        """Whether a pending bundle asks for no GPU. Only such a bundle can be given a node
        with no GPU free; without one, that room is not kept at all, and a busy cluster's
        full GPU nodes (with a few CPUs left) cost nothing to pack around."""
        self._by_pool: dict[str, dict[int, dict[_Slot, None]]] = {}
        """Per pool, per free-GPU count, its slots (a dict as an ordered set)."""
        # Filled in one pass rather than by `add`: the simulator builds the room of hundreds
        # of nodes at each of tens of thousands of decisions.
        for slot in slots:
            if self.offers(slot):
                buckets = self._by_pool.setdefault(slot.pool, {})
                buckets.setdefault(slot.gpus, {})[slot] = None
        self._gpu_counts: dict[str, list[int]] = {
            pool: sorted(buckets) for pool, buckets in self._by_pool.items()
        }
        """Per pool, the free-GPU counts that have a bucket, ascending."""
        self.free_gpus: dict[str, int] = {
            pool: sum(gpus * len(bucket) for gpus, bucket in buckets.items())
            for pool, buckets in self._by_pool.items()
        }
        """Per pool, free GPUs in all: a job asking for more need not be searched for."""

    def offers(self, slot: _Slot) -> bool:
        """Whether the slot has room that a pending bundle could be given."""
        return slot.gpus > 0 or (self.gpuless_asked and slot.cpus > _EPSILON)

    def add(self, slot: _Slot) -> None:
        if not self.offers(slot):
            return
        buckets = self._by_pool.get(slot.pool)
        if buckets is None:
            buckets = self._by_pool[slot.pool] = {}
            self._gpu_counts[slot.pool] = []
            self.free_gpus[slot.pool] = 0
        bucket = buckets.get(slot.gpus)
        if bucket is None:
            bucket = buckets[slot.gpus] = {}
            bisect.insort(self._gpu_counts[slot.pool], slot.gpus)
        bucket[slot] = None
        self.free_gpus[slot.pool] += slot.gpus

    def remove(self, slot: _Slot) -> None:
        buckets = self._by_pool.get(slot.pool, {})
        bucket = buckets.get(slot.gpus)
        if bucket is None or slot not in bucket:
            return
        del bucket[slot]
        self.free_gpus[slot.pool] -= slot.gpus
        if bucket:
            return
        # An empty bucket goes, so a search never walks past room that is not there.
        del buckets[slot.gpus]
        counts = self._gpu_counts[slot.pool]
        del counts[bisect.bisect_left(counts, slot.gpus)]

    def find(
        self, bundle: Bundle, pools: Sequence[str], avoid: frozenset[str] = frozenset()
    ) -> _Slot | None:
        """The first slot that holds the bundle, on none of the `avoid` nodes: pools in the
        order given, then the fewest free GPUs (the tightest fit) first."""
        gpus = bundle.gpus
        for pool in pools:
            counts = self._gpu_counts.get(pool)
            if not counts or counts[-1] < gpus:
                continue  # no node of this pool has that many GPUs free
            buckets = self._by_pool[pool]
            for count in counts[bisect.bisect_left(counts, gpus) :]:
                for slot in buckets[count]:
                    if slot.holds(bundle) and (not avoid or slot.node not in avoid):
                        return slot
        return None

    def most_free(self, pools: Sequence[str], avoid: frozenset[str]) -> _Slot | None:
        """The slot with the most GPUs free in these pools, on none of the `avoid` nodes."""
        best: _Slot | None = None
        for pool in pools:
            buckets = self._by_pool.get(pool, {})
            for count in reversed(self._gpu_counts.get(pool, [])):
                if best is not None and count <= best.gpus:
                    break
                found = next((s for s in buckets[count] if s.node not in avoid), None)
                if found is not None:
                    best = found
                    break
        return best

    def free_gpus_in(self, pools: Sequence[str]) -> int:
        """Free GPUs in all over these pools: the most a job could be given without growth."""
        free = 0
        for pool in pools:
            free += self.free_gpus.get(pool, 0)
        return free

    def take(self, slot: _Slot, bundle: Bundle, sign: int = 1) -> None:
        """Take the bundle's resources from the slot (or give them back, with sign=-1)."""
        self.remove(slot)
        slot.gpus -= sign * bundle.gpus
        slot.cpus -= sign * bundle.cpus
        slot.memory_gb -= sign * bundle.memory_gb
        self.add(slot)


@dataclass(frozen=True, slots=True)
class _Eligible:
    """The pools a class of job may use, cheapest first, and their names, all and by zone."""

    pools: list[PoolSpec]
    names: list[str]
    zones: dict[str | None, list[str]] = field(default_factory=dict)
    """Zone → the names of its pools, cheapest first; zones in the order of their cheapest
    pool. A gang is placed within one zone (pools without a zone count as one)."""
    stocked_out: tuple[str, ...] = ()
    """Pools the job could use but for their last failed growth."""

    @classmethod
    def of(cls, pools: list[PoolSpec], stocked_out: tuple[str, ...] = ()) -> _Eligible:
        zones: dict[str | None, list[str]] = {}
        for pool in pools:
            zones.setdefault(pool.zone, []).append(pool.name)
        return cls(pools, [p.name for p in pools], zones, stocked_out)


@dataclass(slots=True)
class _Packing:
    """What one decision has placed so far, and what that leaves."""

    room: _FreeRoom
    empty_nodes: dict[str, _Slot]
    """A fresh node of each pool: whether a bundle could ever fit, and the shape of a new
    node; never mutated."""
    sizes: dict[str, int]
    """Nodes per pool now, booting ones included."""
    settling: dict[str, datetime]
    """Pools that launched a node less than the settle time ago, with when the youngest
    was launched."""
    cost_per_hour_usd: float
    launches: dict[str, int] = field(default_factory=dict)
    placements: list[Placement] = field(default_factory=list)


def placement_order(demands: Iterable[Demand], now: datetime) -> list[Demand]:
    """The platform's order, in which waiting attempts take room (and growth is bought):
    deadline jobs behind their reserve first (`shared.policy.deadline`: their slack, the time they
    could still wait, is below a share of their work left), then higher priority, then the
    longest queued, then by id. Pure.

    A gang is not starved by a stream of smaller jobs: once its turn comes and it cannot
    be placed nor grown for (the pools at their maximum, the budget), the room it finds on
    the nodes is reserved for it, and later jobs take only what is left (`plan`)."""
    # Three stable sorts by one attribute each are faster than one by a tuple key: the
    # simulator decides tens of thousands of times.
    ordered = sorted(demands, key=attrgetter("job_id"))
    ordered.sort(key=attrgetter("queued_at"))
    ordered.sort(key=attrgetter("priority"), reverse=True)
    ordered.sort(key=lambda demand: not _behind_reserve(demand, now))
    return ordered


def _behind_reserve(demand: Demand, now: datetime) -> bool:
    if demand.deadline is None or demand.work_left_s is None:
        return False
    slack_s = (demand.deadline - now).total_seconds() - demand.work_left_s
    return slack_s < RESERVE_SHARE * demand.work_left_s


_RESERVES_ROOM = frozenset({BlockedReason.POOL_AT_MAX, BlockedReason.OVER_BUDGET})
"""Why a demand may wait with the room it finds held for it: no growth can serve it now,
so room freed on the nodes must accumulate for it rather than go to later jobs."""


def _largest_first(bundles: Sequence[Bundle]) -> tuple[Bundle, ...]:
    """A gang's bundles in first-fit-decreasing order, which packs tightest."""
    if len(bundles) == 1:
        return tuple(bundles)
    return tuple(sorted(bundles, key=lambda b: (b.gpus, b.cpus, b.memory_gb), reverse=True))


def _spot_room(
    nodes: Sequence[NodeView], pools: Mapping[str, PoolSpec]
) -> dict[str, list[tuple[int, float]]]:
    """Per spot pool, each node's free GPUs and the seconds until they are usable."""
    room: dict[str, list[tuple[int, float]]] = {}
    for node in nodes:
        pool = pools.get(node.pool)
        if pool is None or pool.capacity is not CapacityClass.SPOT or node.draining:
            continue
        if node.free.gpus > 0:
            left = 0.0 if node.ready else max(0.0, pool.boot_time_s - node.age_s)
            room.setdefault(node.pool, []).append((node.free.gpus, left))
    return room


def _start_s(
    pool: PoolSpec, demand: Demand, spot_room: Mapping[str, Sequence[tuple[int, float]]]
) -> float:
    """How soon the demand could start on the pool: on room a node has or will have for
    its largest bundle, else on a new node (a boot)."""
    needs = max(bundle.gpus for bundle in demand.bundles)
    return min(
        (left for gpus, left in spot_room.get(pool.name, ()) if gpus >= needs),
        default=pool.boot_time_s,
    )


def _hold_placed(
    demands: Iterable[Demand], ready: Mapping[str, _Slot | None], room: _FreeRoom
) -> tuple[list[str], list[Demand]]:
    """Hold the room of demands placed by an earlier pass, not started yet, on nodes that
    are still up; returns their ids and the demands still to place (not placed yet, or a
    node they were placed on went: placed again)."""
    held: list[str] = []
    pending: list[Demand] = []
    for demand in demands:
        if demand.placed_on and all(node in ready for node in demand.placed_on):
            _hold(demand, ready, room)
            held.append(demand.job_id)
        else:
            pending.append(demand)
    return held, pending


def _hold(demand: Demand, ready: Mapping[str, _Slot | None], room: _FreeRoom) -> None:
    """Keep the room a placed attempt was given on its nodes until it starts. Room Ray has
    already given it (its driver is starting) is not taken again where too little is left
    to hold the bundle twice; on a node with room for two, it is, for the second or so
    before `job.started` ends the hold: another job may wait a pass, or a node be bought
    for it (Ray's view of a node does not say which job holds its room)."""
    for bundle, node in zip(_largest_first(demand.bundles), demand.placed_on, strict=False):
        slot = ready.get(node)
        if slot is not None and slot.holds(bundle):
            room.take(slot, bundle)
            slot.used = True


def _reserve(demand: Demand, choice: _Eligible, packing: _Packing) -> None:
    """Hold for a blocked demand the room its bundles would take as it frees
    (`placement_order`): for each bundle, the node with the most GPUs free of a pool whose
    node shape holds the bundle, up to what the bundle asks. Room on a node is held in
    part: its other GPUs, once free, complete what the bundle needs."""
    avoid = frozenset(demand.avoid_nodes)
    room = packing.room
    for bundle in _largest_first(demand.bundles):
        pools = [name for name in choice.names if packing.empty_nodes[name].holds(bundle)]
        slot = room.most_free(pools, avoid)
        if slot is None or (bundle.gpus > 0 and slot.gpus == 0):
            return
        held = Bundle.model_construct(
            gpus=min(bundle.gpus, slot.gpus),
            cpus=min(bundle.cpus, max(slot.cpus, 0.0)),
            memory_gb=min(bundle.memory_gb, max(slot.memory_gb, 0.0)),
            gpu_type=bundle.gpu_type,
        )
        room.take(slot, held)
        slot.used = True


def plan(
    pools: Sequence[PoolSpec],
    nodes: Sequence[NodeView],
    demands: Sequence[Demand],
    config: ScalerConfig,
    now: datetime,
    *,
    unavailable: frozenset[str] = frozenset(),
    risk: Mapping[str, float] | None = None,
    idle_timeouts: Mapping[str, float] | None = None,
    outlooks: Mapping[str, SpotOutlook] | None = None,
    kept: frozenset[str] = frozenset(),
) -> ScalePlan:
    """Decide pool sizes. Pure: the same inputs always give the same plan.

    `unavailable`: pools whose last resize failed for want of capacity; they are not grown.
    `risk`: per pool, what its preemptions and stock-outs add to its price, as a share (see
    `eligible_pools`). `idle_timeouts`: per pool, the idle timeout learnt from its history
    (`keepalive.best_idle_timeout_s`), never above the configured one. `outlooks`: what
    has been seen of each spot pool, for deadline jobs (see `eligible_pools`). `kept`: nodes
    not released however long idle (work was placed there that Ray does not show yet).

    Demand is packed, most urgent first, into free room on existing and booting nodes, then
    into as few new nodes of the cheapest allowed pool as hold all of a job's bundles. A job
    whose bundles cannot all be placed within the pool limits and the budget is blocked, and
    takes nothing. Nodes idle past the timeout, whose room no pending job needs, are released.
    """
    by_name = {p.name: p for p in pools}
    sizes = dict.fromkeys(by_name, 0)
    settling: dict[str, datetime] = {}
    cost_per_hour_usd = 0.0
    slots = []
    idle: list[tuple[NodeView, _Slot | None]] = []
    ready: dict[str, _Slot | None] = {}
    """Nodes an attempt can be handed to Ray on now, with their room."""
    gpuless_asked = any(b.gpus == 0 for d in demands for b in d.bundles)
    # One pass over the nodes: the simulator asks for a decision tens of thousands of times
    # on clusters of hundreds of nodes.
    for node in nodes:
        pool = by_name.get(node.pool)
        if pool is None:
            continue  # a pool no longer configured
        sizes[node.pool] += 1
        cost_per_hour_usd += pool.price_per_hour_usd
        if node.age_s < config.settle_s and not node.draining:
            # A fresh node may yet take the pending job; a draining one never will.
            launched_at = now - timedelta(seconds=node.age_s)
            settling[node.pool] = max(launched_at, settling.get(node.pool, launched_at))
        free = node.free
        slot = None
        if free.gpus > 0 or (gpuless_asked and free.cpus > _EPSILON):
            # Room a pending bundle could be given (see `_FreeRoom.offers`).
            slot = _Slot(
                node.pool,
                free.gpus,
                free.cpus,
                free.memory_gb,
                free.gpu_type,
                node=node.name,
                ready=node.ready and not node.draining,
            )
            slots.append(slot)
        if node.ready and not node.draining:
            ready[node.name] = slot
        if (
            node.ready
            and node.name not in kept
            and node.idle_s >= _idle_timeout_s(node, config, idle_timeouts)
            and free.gpus >= pool.gpus
            and free.cpus >= pool.cpus - _EPSILON
        ):
            idle.append((node, slot))
    packing = _Packing(
        room=_FreeRoom(slots, gpuless_asked=gpuless_asked),
        empty_nodes={p.name: _Slot(p.name, p.gpus, p.cpus, p.memory_gb, p.gpu_type) for p in pools},
        sizes=sizes,
        settling=settling,
        cost_per_hour_usd=cost_per_hour_usd,
    )

    blocked: list[Blocked] = []
    # Which pools a job may grow depends only on the capacity it may grow (`_allowed`):
    # computed once per such set, not once per job.
    eligible: dict[frozenset[CapacityClass], _Eligible] = {}
    in_room, pending = _hold_placed(demands, ready, packing.room)
    spot_room = _spot_room(nodes, by_name)
    ordered = placement_order(pending, now)
    # Spot that cannot be had for a deadline job: pools out of capacity, and pools at their
    # limit with no room left on their nodes.
    spot_full = unavailable | frozenset(
        p.name
        for p in pools
        if p.capacity is CapacityClass.SPOT
        and sizes[p.name] >= p.max_nodes
        and not any(s.pool == p.name and s.gpus > 0 for s in slots)
    )
    for demand in ordered:
        allowed = _allowed(
            demand,
            pools,
            config,
            now,
            unavailable,
            spot_gone=spot_full,
            outlooks=outlooks,
            spot_room=spot_room,
        )
        choice = eligible.get(allowed)
        if choice is None:
            choice = eligible[allowed] = _choice(
                demand, pools, config, now, unavailable, risk, spot_full, outlooks, spot_room
            )
        if (outcome := _place(demand, choice, packing, config)) is not None:
            blocked.append(outcome)
            if outcome.reason in _RESERVES_ROOM:
                _reserve(demand, choice, packing)
        elif not packing.launches:
            # Room the nodes have now: none was bought yet, whose room would count too.
            in_room.append(demand.job_id)

    release = _idle_nodes(idle, by_name, sizes)
    plans = _pool_plans(pools, sizes, packing.launches, release)
    return ScalePlan(
        pools=tuple(plans),
        release=tuple(sorted(node.name for node in release)),
        blocked=tuple(blocked),
        in_room=tuple(in_room),
        placements=tuple(packing.placements),
    )


def _pool_plans(
    pools: Sequence[PoolSpec],
    sizes: Mapping[str, int],
    launches: Mapping[str, int],
    release: Sequence[NodeView],
) -> list[PoolPlan]:
    """Each pool's target: its nodes, plus those launched, less those released, never
    below its minimum; with the reason."""
    released = dict.fromkeys(sizes, 0)
    for node in release:
        released[node.pool] += 1
    plans = []
    for pool in pools:
        current = sizes[pool.name]
        launched = launches.get(pool.name, 0)
        target = current + launched - released[pool.name]
        reason = (
            Reason.PENDING_DEMAND
            if launched
            else Reason.IDLE
            if released[pool.name]
            else Reason.STEADY
        )
        if target < pool.min_nodes:
            target, reason = pool.min_nodes, Reason.BELOW_MIN
        plans.append(PoolPlan(pool=pool.name, current=current, target=target, reason=reason))
    return plans


def _choice(  # noqa: PLR0917  # plan's inputs, passed on
    demand: Demand,
    pools: Sequence[PoolSpec],
    config: ScalerConfig,
    now: datetime,
    unavailable: frozenset[str],
    risk: Mapping[str, float] | None,
    spot_gone: frozenset[str],
    outlooks: Mapping[str, SpotOutlook] | None,
    spot_room: Mapping[str, Sequence[tuple[int, float]]],
) -> _Eligible:
    """The pools the demand may grow; with none, those it could but for a stock-out."""
    candidates = eligible_pools(
        demand,
        pools,
        config,
        now,
        unavailable=unavailable,
        risk=risk,
        spot_gone=spot_gone,
        outlooks=outlooks,
        spot_room=spot_room,
    )
    stocked_out: tuple[str, ...] = ()
    if not candidates and unavailable:
        could = eligible_pools(demand, pools, config, now, spot_gone=spot_gone, outlooks=outlooks)
        stocked_out = tuple(p.name for p in could if p.name in unavailable)
    return _Eligible.of(candidates, stocked_out)


def _place(
    demand: Demand, choice: _Eligible, packing: _Packing, config: ScalerConfig
) -> Blocked | None:
    """Place all of a demand's bundles, or none; say why when none."""
    if not choice.pools and choice.stocked_out:
        return Blocked(
            job_id=demand.job_id,
            attempt=demand.attempt,
            reason=BlockedReason.OUT_OF_CAPACITY,
            detail=f"every pool it may use is out of capacity ({', '.join(choice.stocked_out)}):"
            f" growth is tried again {config.capacity_retry_after_s:g} s after it failed",
            pool=choice.stocked_out[0],
        )
    if not choice.pools:
        return Blocked(
            job_id=demand.job_id,
            attempt=demand.attempt,
            reason=BlockedReason.NO_POOL_FITS,
            detail=f"no {demand.capacity.value} pool is configured",
        )
    bundles = _largest_first(demand.bundles)
    lone = len(bundles) == 1
    avoid = frozenset(demand.avoid_nodes)
    asked_gpus = bundles[0].gpus if lone else sum(b.gpus for b in bundles)
    room = packing.room
    if room.free_gpus_in(choice.names) >= asked_gpus:
        fitted = _fit_in_room(bundles, choice, room, avoid)
        if fitted is not None:
            _record_placement(demand, fitted, packing)
            return None
    why = BlockedReason.NO_POOL_FITS
    detail = "no allowed pool has a node shape that holds its bundles"
    would_grow: str | None = None
    for pool in choice.pools:
        empty_node = packing.empty_nodes[pool.name]
        # The largest bundle is first: too many GPUs for this node shape rules it out quickly.
        if bundles[0].gpus > empty_node.gpus or not empty_node.holds_all(bundles):
            continue
        trial: _Trial | None = None
        if lone:
            # A lone bundle that found no room above would find none now (the room is as it
            # was, or has fewer free GPUs in all than it asks): it takes one new node.
            count = 1
        else:
            trial = _Trial(room)
            trial.fit(bundles, choice.zones[pool.zone], grow=empty_node, avoid=avoid)
            count = len(trial.new_slots)
        refusal = _refusal(demand, pool, count, packing, config)
        if refusal is None:
            packing.launches[pool.name] = packing.launches.get(pool.name, 0) + count
            packing.cost_per_hour_usd += count * pool.price_per_hour_usd
            if trial is None:
                room.add(_slot_for_new_node(empty_node, bundles[0]))
            else:
                trial.commit()
            return None
        why, detail = refusal
        would_grow = pool.name
        if trial is not None:
            trial.undo()
    return Blocked(
        job_id=demand.job_id, attempt=demand.attempt, reason=why, detail=detail, pool=would_grow
    )


def _record_placement(demand: Demand, fitted: _Trial, packing: _Packing) -> None:
    """A demand fitted in room: placed, when all of that room is on ready nodes (room on
    a booting node is counted, but the attempt waits for the node to join Ray)."""
    nodes = fitted.ready_nodes()
    if nodes is None or not is_queued_attempt(demand):
        return
    packing.placements.append(
        Placement(
            job_id=demand.job_id,
            attempt=demand.attempt,
            requeued=demand.requeued,
            nodes=nodes,
            pool=fitted.first_pool(),
        )
    )


def _fit_in_room(
    bundles: Sequence[Bundle], choice: _Eligible, room: _FreeRoom, avoid: frozenset[str]
) -> _Trial | None:
    """Place every bundle in free room, or none; the committed trial, if placed. A gang is
    placed within one zone: its workers talk to each other all the time, and cross-zone
    traffic is slow and billed."""
    groups = [choice.names] if len(bundles) == 1 else list(choice.zones.values())
    for names in groups:
        trial = _Trial(room)
        if trial.fit(bundles, names, grow=None, avoid=avoid):
            trial.commit()
            return trial
    return None


def _refusal(
    demand: Demand, pool: PoolSpec, count: int, packing: _Packing, config: ScalerConfig
) -> tuple[BlockedReason, str] | None:
    """Why the pool may not grow by `count` nodes for the demand now, if it may not. A pool
    that launched a node within the settle time holds back the demand queued before that
    launch (the node may be its, still to be seen taking it); one queued after it cannot
    be what the node was bought for, and grows the pool at once (a sweep's jobs seconds
    apart wait one boot, not a boot and the settle time)."""
    settling_since = packing.settling.get(pool.name)
    if settling_since is not None and demand.queued_at <= settling_since:
        return (
            BlockedReason.SETTLING,
            f"{pool.name} launched a node less than {config.settle_s:.0f}s ago",
        )
    launched = packing.launches.get(pool.name, 0)
    size = packing.sizes[pool.name] + launched + count
    if size > pool.max_nodes or launched + count > config.max_launch_per_pool:
        return (
            BlockedReason.POOL_AT_MAX,
            f"{pool.name} would need {size} nodes; its maximum is {pool.max_nodes}",
        )
    cost = packing.cost_per_hour_usd + count * pool.price_per_hour_usd
    if cost > config.budget_per_hour_usd + _EPSILON:
        return BlockedReason.OVER_BUDGET, (
            f"{count} more {pool.name} node(s) would cost ${cost:.2f}/h in all, "
            f"over the budget of ${config.budget_per_hour_usd:.2f}/h"
        )
    return None


class _Trial:
    """A tentative placement of one job's bundles that is committed whole or undone whole."""

    def __init__(self, room: _FreeRoom) -> None:
        self._room = room
        self._taken: list[tuple[_Slot, Bundle]] = []
        """Bundles put into room that was there before this trial, in order."""
        self.new_slots: list[_Slot] = []
        """New nodes this trial opened."""

    def fit(
        self,
        bundles: Sequence[Bundle],
        pools: Sequence[str],
        grow: _Slot | None,
        avoid: frozenset[str] = frozenset(),
    ) -> bool:
        """Place every bundle, opening new nodes of the shape `grow` (an empty node of a pool
        that holds every bundle) where no room is left, if given."""
        room = self._room
        for bundle in bundles:
            slot = room.find(bundle, pools, avoid)
            if slot is not None:
                room.take(slot, bundle)
                self._taken.append((slot, bundle))
            elif grow is not None:
                slot = _slot_for_new_node(grow, bundle)
                self.new_slots.append(slot)
                room.add(slot)
            else:
                self.undo()
                return False
        return True

    def commit(self) -> None:
        for slot, _ in self._taken:
            slot.used = True

    def ready_nodes(self) -> tuple[str, ...] | None:
        """The node of each bundle placed, when every one is on a ready node (not booting,
        not launched by this decision); None otherwise."""
        if self.new_slots or not self._taken:
            return None
        nodes = [slot.node for slot, _ in self._taken if slot.ready]
        if len(nodes) != len(self._taken):
            return None
        return tuple(node for node in nodes if node is not None) or None

    def first_pool(self) -> str:
        return self._taken[0][0].pool

    def undo(self) -> None:
        # Given back in reverse, so each slot's room is restored exactly; like any change, it
        # moves the slot to the end of its bucket.
        for slot, bundle in reversed(self._taken):
            self._room.take(slot, bundle, sign=-1)
        for slot in self.new_slots:
            self._room.remove(slot)
        self._taken.clear()
        self.new_slots.clear()


def _idle_timeout_s(
    node: NodeView, config: ScalerConfig, idle_timeouts: Mapping[str, float] | None
) -> float:
    if idle_timeouts is None or node.pool not in idle_timeouts:
        return config.idle_timeout_s
    return min(idle_timeouts[node.pool], config.idle_timeout_s)


def _idle_nodes(
    idle: list[tuple[NodeView, _Slot | None]], pools: dict[str, PoolSpec], sizes: dict[str, int]
) -> list[NodeView]:
    """Of the nodes empty and idle past the timeout, those to release: the longest idle
    first, not one whose room a pending job was given, never below a pool's minimum."""
    remaining = dict(sizes)
    release = []
    for node, slot in sorted(idle, key=lambda pair: -pair[0].idle_s):
        if (slot is None or not slot.used) and remaining[node.pool] > pools[node.pool].min_nodes:
            release.append(node)
            remaining[node.pool] -= 1
    return release


def _learnt(record: PoolRecord | None, pool: PoolSpec, now: datetime) -> dict[str, Any]:
    """What `spotrain pools` shows of what has been learnt of a pool."""
    if record is None:
        return {}
    learnt: dict[str, Any] = {"taken_back": record.taken_back, "stock_outs": record.stock_outs}
    if pool.capacity is CapacityClass.SPOT:
        learnt["outlook"] = record.outlook(pool.boot_time_s / 3600, now)
    return learnt


def summarize(
    pools: Sequence[PoolSpec],
    *,
    nodes: Sequence[NodeView],
    demands: Sequence[Demand],
    decided: ScalePlan,
    config: ScalerConfig,
    now: datetime,
    out_of_capacity_until: Mapping[str, datetime] | None = None,
    knowledge: Mapping[str, PoolRecord] | None = None,
    advice: Mapping[str, SpotAdvice] | None = None,
) -> PoolsStatus:
    """What `spotrain pools` shows: each pool's nodes, GPUs, price and the demand it serves,
    and until when a pool whose growth failed (a stock-out) is left alone."""
    stocked_out = {
        pool: until for pool, until in (out_of_capacity_until or {}).items() if until > now
    }
    rows = []
    for pool in pools:
        members = [n for n in nodes if n.pool == pool.name]
        serves = [d for d in demands if pool in eligible_pools(d, pools, config, now)]
        rows.append(
            PoolStatus(
                pool=pool.name,
                capacity=pool.capacity,
                price_per_hour_usd=pool.price_per_hour_usd,
                nodes=len(members),
                ready=sum(1 for n in members if n.ready),
                gpus_total=pool.gpus * len(members),
                gpus_free=sum(n.free.gpus for n in members),
                pending_jobs=len(serves),
                pending_gpus=sum(b.gpus for d in serves for b in d.bundles),
                target=decided.target(pool.name),
                min_nodes=pool.min_nodes,
                max_nodes=pool.max_nodes,
                gpus_per_node=pool.gpus,
                out_of_capacity_until=stocked_out.get(pool.name),
                advice=(advice or {}).get(pool.name),
                **_learnt((knowledge or {}).get(pool.name), pool, now),
            )
        )
    by_name = {p.name: p for p in pools}
    return PoolsStatus(
        updated_at=now,
        budget_per_hour_usd=config.budget_per_hour_usd,
        cost_per_hour_usd=sum(
            by_name[n.pool].price_per_hour_usd for n in nodes if n.pool in by_name
        ),
        pools=tuple(rows),
        blocked_jobs=len(decided.blocked),
        queue=queue_positions(demands, decided, now),
    )


def queue_positions(
    demands: Sequence[Demand], decided: ScalePlan, now: datetime
) -> tuple[QueuedAttempt, ...]:
    """Where each queued attempt stands in the platform's order, and why it waits: placed
    (Ray is starting it), blocked (the reason the decision gave), room on a node that
    boots, or a node bought for it. Growth of running attempts and room wanted for a move
    are not attempts in the queue."""
    blocked = {b.job_id: b for b in decided.blocked}
    placed = {p.job_id: p.nodes for p in decided.placements}
    in_room = set(decided.in_room)
    queued = [d for d in demands if is_queued_attempt(d)]
    shown = []
    for position, demand in enumerate(placement_order(queued, now)[:MAX_QUEUE_SHOWN], start=1):
        nodes = placed.get(demand.job_id) or (demand.placed_on if demand.job_id in in_room else ())
        if nodes:
            why = f"placed on {', '.join(sorted(set(nodes)))}: Ray is starting it"
        elif (stop := blocked.get(demand.job_id)) is not None:
            why = f"{stop.reason.value}: {stop.detail}"
        elif demand.job_id in in_room:
            why = "its room is on a node that is still booting"
        else:
            why = "a node is being bought for it"
        shown.append(
            QueuedAttempt(job_id=demand.job_id, attempt=demand.attempt, position=position, why=why)
        )
    return tuple(shown)
