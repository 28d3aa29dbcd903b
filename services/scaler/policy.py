"""The scaling decision, pure: from pools, nodes, pending demand and the budget to a target
size per pool, the idle nodes to release, and the demand that must wait, each with its
reason. No I/O, no clock (`now` is an argument), no ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from services.scaler.model import (
    Blocked,
    BlockedReason,
    Demand,
    NodeView,
    PoolPlan,
    PoolSpec,
    Reason,
    Room,
    ScalePlan,
    ScalerConfig,
)
from shared.events.types import Bundle, CapacityClass

_EPSILON = 1e-9


def fits(bundle: Bundle, free: Room) -> bool:
    if bundle.gpu_type is not None and bundle.gpus > 0 and bundle.gpu_type != free.gpu_type:
        return False
    return (
        bundle.gpus <= free.gpus
        and bundle.cpus <= free.cpus + _EPSILON
        and bundle.memory_gb <= free.memory_gb + _EPSILON
    )


def take(free: Room, bundle: Bundle) -> Room:
    return free.model_copy(
        update={
            "gpus": free.gpus - bundle.gpus,
            "cpus": max(0.0, free.cpus - bundle.cpus),
            "memory_gb": max(0.0, free.memory_gb - bundle.memory_gb),
        }
    )


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


@dataclass
class _Slot:
    """Free room on a node, existing or planned, while demand is being packed."""

    pool: str
    free: Room
    new: bool
    used: bool = False


@dataclass
class _Packing:
    slots: list[_Slot]
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
    packing = _Packing(
        slots=[_Slot(pool=n.pool, free=n.free, new=False) for n in known],
        cost_per_hour_usd=sum(by_name[n.pool].price_per_hour_usd for n in known),
    )
    sizes = {p.name: sum(1 for n in known if n.pool == p.name) for p in pools}
    settling = {n.pool for n in known if n.age_s < config.settle_s}
    blocked: list[Blocked] = []
    for demand in sorted(demands, key=lambda d: (-d.priority, d.queued_at, d.job_id)):
        candidates = eligible_pools(demand, pools, config, now)
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

    release = _idle_nodes(known, packing.slots[: len(known)], by_name, sizes, config)
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
    allowed = {p.name for p in candidates}
    if not candidates:
        return Blocked(
            job_id=demand.job_id,
            attempt=demand.attempt,
            reason=BlockedReason.NO_POOL_FITS,
            detail=f"no {demand.capacity.value} pool is configured",
        )
    # Largest bundles first: the classic first-fit-decreasing order packs tightest.
    bundles = sorted(demand.bundles, key=lambda b: (b.gpus, b.cpus, b.memory_gb), reverse=True)
    existing = _fit_all(bundles, [s for s in packing.slots if s.pool in allowed])
    if existing is not None:
        _commit(packing, existing)
        return None
    why = BlockedReason.NO_POOL_FITS
    detail = "no allowed pool has a node shape that holds its bundles"
    would_grow: str | None = None
    for pool in candidates:
        if not all(fits(b, pool.shape) for b in bundles):
            continue
        trial_new: list[_Slot] = []
        placement = _fit_all(
            bundles, [s for s in packing.slots if s.pool in allowed], grow=(pool, trial_new)
        )
        if placement is None:
            continue
        count = len(trial_new)
        if pool.name in settling:
            why, would_grow = BlockedReason.SETTLING, pool.name
            detail = f"{pool.name} launched a node less than {config.settle_s:.0f}s ago"
            continue
        planned = sizes[pool.name] + packing.launches.get(pool.name, 0) + count
        if (
            planned > pool.max_nodes
            or packing.launches.get(pool.name, 0) + count > config.max_launch_per_pool
        ):
            why, would_grow = BlockedReason.POOL_AT_MAX, pool.name
            detail = f"{pool.name} would need {planned} nodes; its maximum is {pool.max_nodes}"
            continue
        cost = packing.cost_per_hour_usd + count * pool.price_per_hour_usd
        if cost > config.budget_per_hour_usd + _EPSILON:
            why, would_grow = BlockedReason.OVER_BUDGET, pool.name
            detail = (
                f"{count} more {pool.name} node(s) would cost ${cost:.2f}/h in all, "
                f"over the budget of ${config.budget_per_hour_usd:.2f}/h"
            )
            continue
        packing.slots.extend(trial_new)
        packing.launches[pool.name] = packing.launches.get(pool.name, 0) + count
        packing.cost_per_hour_usd = cost
        _commit(packing, placement)
        return None
    return Blocked(
        job_id=demand.job_id, attempt=demand.attempt, reason=why, detail=detail, pool=would_grow
    )


def _fit_all(
    bundles: list[Bundle],
    slots: list[_Slot],
    grow: tuple[PoolSpec, list[_Slot]] | None = None,
) -> list[tuple[_Slot, Bundle]] | None:
    """First fit over a scratch copy of the room; new nodes of `grow`'s pool when allowed."""
    room = {id(s): s.free for s in slots}
    placed: list[tuple[_Slot, Bundle]] = []
    for bundle in bundles:
        slot = next(
            (s for s in [*slots, *(grow[1] if grow else [])] if fits(bundle, room[id(s)])), None
        )
        if slot is None and grow is not None:
            pool, new_slots = grow
            slot = _Slot(pool=pool.name, free=pool.shape, new=True)
            new_slots.append(slot)
            room[id(slot)] = slot.free
        if slot is None:
            return None
        room[id(slot)] = take(room[id(slot)], bundle)
        placed.append((slot, bundle))
    return placed


def _commit(packing: _Packing, placement: list[tuple[_Slot, Bundle]]) -> None:
    for slot, bundle in placement:
        slot.free = take(slot.free, bundle)
        slot.used = True


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
