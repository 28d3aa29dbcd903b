"""The scaling decision, pure: from pools, nodes, pending demand and the budget to a target
size per pool, the idle nodes to release, and the demand that must wait, each with its
reason. No I/O, no clock (`now` is an argument), no ids."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from services.scaler.model import (
    Blocked,
    BlockedReason,
    Demand,
    NodeView,
    ObservedNode,
    PoolPlan,
    PoolSpec,
    ProvidedNode,
    Reason,
    Room,
    ScalePlan,
    ScalerConfig,
)
from shared.events.types import Bundle, CapacityClass
from shared.pools import PoolsStatus, PoolStatus

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
            )
        )
    return views


def eligible_pools(
    demand: Demand, pools: Sequence[PoolSpec], config: ScalerConfig, now: datetime
) -> list[PoolSpec]:
    """The pools a job may grow, cheapest first: spot for spot and `any` jobs, on-demand for
    on-demand jobs, and on-demand for an `any` job that has waited past the fallback time."""
    waited_s = (now - demand.queued_at).total_seconds()
    allowed = {
        CapacityClass.SPOT: {CapacityClass.SPOT},
        CapacityClass.ON_DEMAND: {CapacityClass.ON_DEMAND},
        CapacityClass.ANY: {CapacityClass.SPOT}
        | ({CapacityClass.ON_DEMAND} if waited_s >= config.any_fallback_after_s else set()),
    }[demand.capacity]
    return sorted(
        (p for p in pools if p.capacity in allowed),
        key=lambda p: (p.price_per_hour_usd, p.name),
    )


@dataclass(eq=False)
class _Slot:
    """Free room on a node, existing or planned, while demand is being packed."""

    pool: str
    gpus: int
    cpus: float
    memory_gb: float
    gpu_type: str | None
    new: bool
    used: bool = False

    @classmethod
    def of(cls, pool: str, room: Room, *, new: bool) -> _Slot:
        return cls(pool, room.gpus, room.cpus, room.memory_gb, room.gpu_type, new)

    def holds(self, bundle: Bundle) -> bool:
        if bundle.gpus > 0 and bundle.gpu_type is not None and bundle.gpu_type != self.gpu_type:
            return False
        return (
            bundle.gpus <= self.gpus
            and bundle.cpus <= self.cpus + _EPSILON
            and bundle.memory_gb <= self.memory_gb + _EPSILON
        )


class _FreeRoom:
    """Free room by pool and by free GPUs, so that placing a bundle does not scan every
    node: a decision for ten thousand jobs on a thousand nodes stays well under a second."""

    def __init__(self) -> None:
        self._by_pool: dict[str, dict[int, dict[int, _Slot]]] = {}
        self._gpu_counts: dict[str, list[int]] = {}
        """Per pool, the free-GPU counts that have a bucket, ascending."""
        self.free_gpus: dict[str, int] = {}
        """Per pool, free GPUs in all: a job asking for more need not be searched for."""

    def add(self, slot: _Slot) -> None:
        if slot.gpus <= 0 and slot.cpus <= _EPSILON:
            return  # a full node has no room to offer
        buckets = self._by_pool.setdefault(slot.pool, {})
        if slot.gpus not in buckets:
            buckets[slot.gpus] = {}
            bisect.insort(self._gpu_counts.setdefault(slot.pool, []), slot.gpus)
        buckets[slot.gpus][id(slot)] = slot
        self.free_gpus[slot.pool] = self.free_gpus.get(slot.pool, 0) + slot.gpus

    def remove(self, slot: _Slot) -> None:
        buckets = self._by_pool.get(slot.pool, {})
        bucket = buckets.get(slot.gpus)
        if bucket is None or bucket.pop(id(slot), None) is None:
            return
        self.free_gpus[slot.pool] -= slot.gpus
        if bucket:
            return
        # An empty bucket goes, so a search never walks past room that is not there.
        del buckets[slot.gpus]
        counts = self._gpu_counts[slot.pool]
        counts.pop(bisect.bisect_left(counts, slot.gpus))

    def find(self, bundle: Bundle, pools: Sequence[str]) -> _Slot | None:
        """The first slot that holds the bundle, tightest GPU fit first."""
        for pool in pools:
            counts = self._gpu_counts.get(pool)
            if not counts:
                continue
            buckets = self._by_pool[pool]
            for gpus in counts[bisect.bisect_left(counts, bundle.gpus) :]:
                for slot in buckets[gpus].values():
                    if slot.holds(bundle):
                        return slot
        return None

    def take(self, slot: _Slot, bundle: Bundle, sign: int = 1) -> None:
        """Take the bundle's resources from the slot (or give them back, with sign=-1)."""
        self.remove(slot)
        slot.gpus -= sign * bundle.gpus
        slot.cpus -= sign * bundle.cpus
        slot.memory_gb -= sign * bundle.memory_gb
        self.add(slot)


@dataclass
class _Packing:
    room: _FreeRoom
    shapes: dict[str, Room]
    empty_nodes: dict[str, _Slot]
    """A fresh node of each pool, to ask whether a bundle could ever fit; never mutated."""
    launches: dict[str, int] = field(default_factory=dict)
    cost_per_hour_usd: float = 0.0


def plan(
    pools: Sequence[PoolSpec],
    nodes: Sequence[NodeView],
    demands: Sequence[Demand],
    config: ScalerConfig,
    now: datetime,
) -> ScalePlan:
    """Decide pool sizes. Pure: the same inputs always give the same plan.

    Demand is packed, most urgent first, into free room on existing and booting nodes, then
    into as few new nodes of the cheapest allowed pool as hold all of a job's bundles. A job
    whose bundles cannot all be placed within the pool limits and the budget is blocked, and
    takes nothing. Nodes idle past the timeout, whose room no pending job needs, are released.
    """
    by_name = {p.name: p for p in pools}
    known = [n for n in nodes if n.pool in by_name]
    slots = [_Slot.of(n.pool, n.free, new=False) for n in known]
    packing = _Packing(
        room=_FreeRoom(),
        shapes={p.name: p.shape for p in pools},
        empty_nodes={p.name: _Slot.of(p.name, p.shape, new=True) for p in pools},
        cost_per_hour_usd=sum(by_name[n.pool].price_per_hour_usd for n in known),
    )
    for slot in slots:
        packing.room.add(slot)
    sizes = {p.name: sum(1 for n in known if n.pool == p.name) for p in pools}
    settling = {n.pool for n in known if n.age_s < config.settle_s}
    blocked: list[Blocked] = []
    # Which pools a job may grow depends only on its class and whether it waited past the
    # fallback: computed once per pair, not once per job.
    eligible: dict[tuple[CapacityClass, bool], list[PoolSpec]] = {}
    for demand in sorted(demands, key=lambda d: (-d.priority, d.queued_at, d.job_id)):
        waited = (now - demand.queued_at).total_seconds() >= config.any_fallback_after_s
        key = (demand.capacity, waited)
        if key not in eligible:
            eligible[key] = eligible_pools(demand, pools, config, now)
        candidates = eligible[key]
        outcome = _place(
            demand,
            candidates=candidates,
            sizes=sizes,
            settling=settling,
            packing=packing,
            config=config,
        )
        if outcome is not None:
            blocked.append(outcome)

    release = _idle_nodes(known, slots, by_name, sizes, config)
    plans = []
    for pool in pools:
        current = sizes[pool.name]
        launched = packing.launches.get(pool.name, 0)
        released = sum(1 for n in known if n.name in release and n.pool == pool.name)
        target = current + launched - released
        reason = Reason.PENDING_DEMAND if launched else Reason.IDLE if released else Reason.STEADY
        if target < pool.min_nodes:
            target, reason = pool.min_nodes, Reason.BELOW_MIN
        plans.append(PoolPlan(pool=pool.name, current=current, target=target, reason=reason))
    return ScalePlan(pools=tuple(plans), release=tuple(sorted(release)), blocked=tuple(blocked))


def _place(
    demand: Demand,
    *,
    candidates: list[PoolSpec],
    sizes: dict[str, int],
    settling: set[str],
    packing: _Packing,
    config: ScalerConfig,
) -> Blocked | None:
    """Place all of a demand's bundles, or none; say why when none."""
    if not candidates:
        return Blocked(
            job_id=demand.job_id,
            attempt=demand.attempt,
            reason=BlockedReason.NO_POOL_FITS,
            detail=f"no {demand.capacity.value} pool is configured",
        )
    allowed = [p.name for p in candidates]
    # Largest bundles first: the classic first-fit-decreasing order packs tightest.
    bundles = sorted(demand.bundles, key=lambda b: (b.gpus, b.cpus, b.memory_gb), reverse=True)
    asked = sum(b.gpus for b in bundles)
    if sum(packing.room.free_gpus.get(p, 0) for p in allowed) >= asked:
        trial = _Trial(packing.room)
        if trial.fit(bundles, allowed, grow=None):
            trial.commit()
            return None
    why = BlockedReason.NO_POOL_FITS
    detail = "no allowed pool has a node shape that holds its bundles"
    would_grow: str | None = None
    for pool in candidates:
        empty_node = packing.empty_nodes[pool.name]
        if not all(empty_node.holds(b) for b in bundles):
            continue
        trial = _Trial(packing.room)
        if not trial.fit(bundles, allowed, grow=(pool.name, packing.shapes[pool.name])):
            trial.undo()
            continue
        count = len(trial.new_slots)
        launched = packing.launches.get(pool.name, 0)
        cost = packing.cost_per_hour_usd + count * pool.price_per_hour_usd
        if pool.name in settling:
            why, would_grow = BlockedReason.SETTLING, pool.name
            detail = f"{pool.name} launched a node less than {config.settle_s:.0f}s ago"
        elif (
            sizes[pool.name] + launched + count > pool.max_nodes
            or launched + count > config.max_launch_per_pool
        ):
            why, would_grow = BlockedReason.POOL_AT_MAX, pool.name
            detail = (
                f"{pool.name} would need {sizes[pool.name] + launched + count} nodes; "
                f"its maximum is {pool.max_nodes}"
            )
        elif cost > config.budget_per_hour_usd + _EPSILON:
            why, would_grow = BlockedReason.OVER_BUDGET, pool.name
            detail = (
                f"{count} more {pool.name} node(s) would cost ${cost:.2f}/h in all, "
                f"over the budget of ${config.budget_per_hour_usd:.2f}/h"
            )
        else:
            packing.launches[pool.name] = launched + count
            packing.cost_per_hour_usd = cost
            trial.commit()
            return None
        trial.undo()
    return Blocked(
        job_id=demand.job_id, attempt=demand.attempt, reason=why, detail=detail, pool=would_grow
    )


class _Trial:
    """A tentative placement of one job's bundles that is committed whole or undone whole."""

    def __init__(self, room: _FreeRoom) -> None:
        self._room = room
        self._taken: list[tuple[_Slot, Bundle]] = []
        self.new_slots: list[_Slot] = []

    def fit(
        self, bundles: list[Bundle], pools: Sequence[str], grow: tuple[str, Room] | None
    ) -> bool:
        """Place every bundle, opening new nodes of `grow` (a pool and its shape) if given."""
        for bundle in bundles:
            slot = self._room.find(bundle, pools)
            if slot is None and grow is not None:
                slot = _Slot.of(grow[0], grow[1], new=True)
                self.new_slots.append(slot)
                self._room.add(slot)
            if slot is None:
                self.undo()
                return False
            self._room.take(slot, bundle)
            self._taken.append((slot, bundle))
        return True

    def commit(self) -> None:
        for slot, _ in self._taken:
            slot.used = True

    def undo(self) -> None:
        for slot, bundle in reversed(self._taken):
            self._room.take(slot, bundle, sign=-1)
        for slot in self.new_slots:
            self._room.remove(slot)
        self._taken.clear()
        self.new_slots.clear()


def _idle_nodes(
    nodes: list[NodeView],
    slots: list[_Slot],
    pools: dict[str, PoolSpec],
    sizes: dict[str, int],
    config: ScalerConfig,
) -> set[str]:
    remaining = dict(sizes)
    release = set()
    for node, slot in sorted(zip(nodes, slots, strict=True), key=lambda pair: -pair[0].idle_s):
        pool = pools[node.pool]
        empty = node.free.gpus >= pool.gpus and node.free.cpus >= pool.cpus - _EPSILON
        idle = node.ready and empty and node.idle_s >= config.idle_timeout_s
        if idle and not slot.used and remaining[node.pool] > pool.min_nodes:
            release.add(node.name)
            remaining[node.pool] -= 1
    return release


def summarize(
    pools: Sequence[PoolSpec],
    *,
    nodes: Sequence[NodeView],
    demands: Sequence[Demand],
    decided: ScalePlan,
    config: ScalerConfig,
    now: datetime,
) -> PoolsStatus:
    """What `spotrain pools` shows: each pool's nodes, GPUs, price and the demand it serves."""
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
    )
