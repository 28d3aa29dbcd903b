"""The scaler's reactions: queued and settled demand from the bus, and a reconcile loop
that observes pools and Ray, decides (policy) and resizes (provider)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from services.scaler import policy
from services.scaler.model import BlockedReason, Demand, PoolSpec, ScalePlan, ScalerConfig
from services.scaler.ports import ClusterObserver, DemandStore, PoolProvider, StatusBoard
from shared.clock import Clock
from shared.events import Event, EventData, new_event
from shared.events.data import (
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobQueued,
    JobStarted,
    JobSucceeded,
    PoolResized,
    PoolResizeFailed,
    PoolResizeRequested,
)
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "scaler"
log = structlog.get_logger()


@dataclass
class Deps:
    bus: EventPublisher
    clock: Clock
    pools: Sequence[PoolSpec]
    config: ScalerConfig
    provider: PoolProvider
    observer: ClusterObserver
    demand: DemandStore
    status: StatusBoard
    reported_blocks: set[tuple[str, int, str]] = field(default_factory=set)
    """Blocked demand already announced, so each is said once per attempt and reason."""


async def on_job_queued(event: Event[JobQueued], deps: Deps) -> None:
    queued = event.data
    await deps.demand.put(
        Demand(
            job_id=queued.job_id,
            attempt=queued.attempt,
            bundles=queued.bundles,
            capacity=queued.capacity,
            priority=queued.priority,
            queued_at=event.time,
        )
    )
    gpus = sum(b.gpus for b in queued.bundles)
    log.info("demand.queued", attempt=queued.attempt, gpus=gpus, capacity=queued.capacity.value)


async def on_job_settled(event: Event[Any], deps: Deps) -> None:
    """The attempt started or ended: its demand is no longer pending."""
    await deps.demand.remove(event.data.job_id, event.data.attempt)


async def on_job_cancelled(event: Event[JobCancelled], deps: Deps) -> None:
    """A cancelled job has no pending demand, whichever attempt it was at."""
    await deps.demand.remove(event.data.job_id, attempt=_EVERY_ATTEMPT)


_EVERY_ATTEMPT = 1_000_000


async def reconcile(deps: Deps) -> ScalePlan:
    """One pass: observe, decide, act. Level-triggered: a missed pass is repaired by the next."""
    provided = await deps.provider.nodes()
    observed = await deps.observer.nodes()
    by_pool = {p.name: p for p in deps.pools}
    now = deps.clock.now()
    views = policy.node_views(deps.pools, provided, observed, now)
    demands = await deps.demand.all()
    decided = policy.plan(deps.pools, views, demands, deps.config, now)
    await deps.status.publish_status(
        policy.summarize(
            deps.pools, nodes=views, demands=demands, decided=decided, config=deps.config, now=now
        )
    )
    for pool_plan in decided.pools:
        if pool_plan.target == pool_plan.current:
            continue
        requested = PoolResizeRequested(
            pool=pool_plan.pool,
            from_size=pool_plan.current,
            to_size=pool_plan.target,
            reason=pool_plan.reason.value,
        )
        await _publish(deps, requested)
        log.info(
            "pool.resize",
            pool=pool_plan.pool,
            current=pool_plan.current,
            target=pool_plan.target,
            reason=pool_plan.reason.value,
        )
        try:
            if pool_plan.target > pool_plan.current:
                await deps.provider.launch(
                    by_pool[pool_plan.pool], pool_plan.target - pool_plan.current
                )
            else:
                for name in decided.release:
                    if any(n.name == name and n.pool == pool_plan.pool for n in provided):
                        await deps.provider.release(name)
        except OSError as error:
            failed = PoolResizeFailed(
                pool=pool_plan.pool, to_size=pool_plan.target, message=str(error)
            )
            await _publish(deps, failed)
            continue
        await _publish(deps, PoolResized(pool=pool_plan.pool, size=pool_plan.target))
    for blocked in decided.blocked:
        if blocked.reason is BlockedReason.SETTLING:
            continue  # a moment's wait, not news
        key = (blocked.job_id, blocked.attempt, blocked.reason.value)
        if key in deps.reported_blocks:
            continue
        deps.reported_blocks.add(key)
        message = f"{blocked.job_id}: {blocked.reason.value}: {blocked.detail}"
        await _publish(
            deps,
            PoolResizeFailed(pool=blocked.pool or "none", to_size=0, message=message),
            event_id=f"blocked-{blocked.job_id}-{blocked.attempt}-{blocked.reason.value}",
        )
        log.warning(
            "demand.blocked",
            job_id=blocked.job_id,
            reason=blocked.reason.value,
            detail=blocked.detail,
        )
    return decided


async def _publish(deps: Deps, data: EventData, event_id: str | None = None) -> None:
    await deps.bus.publish(
        new_event(data, source=SERVICE, time=deps.clock.now(), event_id=event_id)
    )


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    JobQueued: on_job_queued,
    JobStarted: on_job_settled,
    JobSucceeded: on_job_settled,
    JobFailed: on_job_settled,
    JobCancelled: on_job_cancelled,
    JobInterrupted: on_job_settled,
}
