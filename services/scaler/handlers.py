"""The scaler's reactions: queued and settled demand from the bus, and a reconcile loop
that observes pools and Ray, decides (policy), resizes (provider) and says when each node
began and stopped being billed (`node.launched`, `node.released`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import structlog

from services.scaler import metrics, policy
from services.scaler.model import Blocked, Demand, PoolSpec, ScalePlan, ScalerConfig
from services.scaler.policy import decision, elastic, lives
from services.scaler.policy.decision import ScaleRequest, ScalerMemory
from services.scaler.policy.elastic import move_demand_id
from services.scaler.ports import (
    CapacityAdvisor,
    ClusterObserver,
    CostEventFeed,
    DemandStore,
    NodeEventHistory,
    PoolProvider,
    ProvidedNode,
    ProviderBusyError,
    StatusBoard,
)
from shared.clock import Clock
from shared.events import Event, EventData, new_event, node_event_id
from shared.events.data import (
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobMoveRequested,
    JobPlaced,
    JobQueued,
    JobResized,
    JobStarted,
    JobSucceeded,
    NodeEndSource,
    NodeLaunched,
    NodeReleased,
    PoolResized,
    PoolResizeFailed,
    PoolResizeRequested,
    ReleaseReason,
)
from shared.events.types import CapacityClass
from shared.messaging import EventPublisher, HandlerWithDeps
from shared.policy.cost import (
    CostFold,
    attributed,
    month_start,
    on_demand_counterpart,
    spend_by_owner,
)
from shared.policy.cost.attribution import SettledMemo
from shared.policy.cost.node_ends import OpenNode, best_end, closings, node_history
from shared.policy.pool_knowledge import PoolsKnowledge
from shared.pools import NodeSightings, OwnersSpend, PoolsStatus
from shared.ray_head import RayHeadUnavailableError

SERVICE = "scaler"
log = structlog.get_logger()


async def _leads_alone() -> bool:
    """A scaler without a lease (run alone, a test) always may act."""
    return True


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
    history: NodeEventHistory
    memory: ScalerMemory = field(default_factory=ScalerMemory)
    """What each pass leaves to the next (`policy.decision`): replaced, never changed."""
    pass_interval_s: float = 2.0
    """How often `reconcile` runs: said with the sightings, so readers know when one is stale."""
    recovered: bool = False
    """Whether this process has closed the nodes that stopped before it started."""
    billed_nodes: dict[str, OpenNode] = field(default_factory=dict)
    """Nodes open on the ledger (announced launched, by this process or one before it, and
    not ended), by the name the provider lists them under (`OpenNode.machine`): one life
    per name at a time."""
    ledger_names: set[str] = field(default_factory=set)
    """Every node name the ledger holds a launch of: a machine's next life is named apart
    (`policy.lives.ledger_name`)."""
    unwatched: set[str] = field(default_factory=set)
    """Billed nodes that were already gone when this process started."""
    last_seen: dict[str, datetime] = field(default_factory=dict)
    """When each billed node was last listed by the provider: where its billing ends if it
    goes unrecorded."""
    leading: Callable[[], bool] = lambda: True
    """Whether this replica still holds the scaler's lease by its own clock, asked when a
    pass has decided: a replica stalled in the middle of it does not act on it."""
    fenced: Callable[[], Awaitable[bool]] = _leads_alone
    """Proven by a write of the lease, just before each resize or release: a deposed
    leader's late action is refused there (`Leadership.fenced`)."""
    ended_nodes: set[str] = field(default_factory=set)
    """Nodes whose end this process announced, while the provider still lists them (a
    release may take a while): never announced as launched again."""
    cost_events: list[Event[Any]] = field(default_factory=list)
    """Cost events read since the last cost pass, which folds them."""
    costs: CostFold = field(default_factory=CostFold)
    """Every cost event folded so far; touched only by the cost pass, off the event loop."""
    settled_costs: SettledMemo = field(default_factory=dict)
    """The attribution of nodes that ended, kept from pass to pass (same thread)."""
    settled_month: SettledMemo = field(default_factory=dict)
    """The same for this month's window (owners' spend), started over each month."""
    spend_since: datetime | None = None
    last_status: PoolsStatus | None = None
    """The status the last pass published: what is said again, with the head away."""
    ray_head_away_since: datetime | None = None
    """Since when Ray's head has not answered a pass; None while it answers."""
    advisor: CapacityAdvisor | None = None
    """Where the cloud's forecast of the spot pools comes from, if the provider gives one."""


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
            deadline=queued.deadline,
            work_left_s=queued.work_left_s,
            avoid_nodes=queued.avoid_nodes,
            requeued=queued.requeued,
        )
    )
    gpus = sum(b.gpus for b in queued.bundles)
    log.info("demand.queued", attempt=queued.attempt, gpus=gpus, capacity=queued.capacity.value)


async def on_job_move_requested(event: Event[JobMoveRequested], deps: Deps) -> None:
    """Room wanted for a running attempt to move to: pending demand of the attempt that
    would follow it, on the capacity asked, kept apart from the job's own."""
    wanted = event.data
    await deps.demand.put(
        Demand(
            job_id=move_demand_id(wanted.job_id),
            attempt=wanted.attempt + 1,
            bundles=wanted.bundles,
            capacity=wanted.capacity,
            priority=wanted.priority,
            queued_at=event.time,
        )
    )
    log.info("demand.move", job_id=wanted.job_id, capacity=wanted.capacity.value)


async def on_job_resized(event: Event[JobResized], deps: Deps) -> None:
    """A running multi-node attempt has fewer workers than it may have: room for each it
    misses (`policy.elastic`); room it no longer misses is withdrawn."""
    resized = event.data
    wanted = elastic.growth(resized, event.time)
    for demand in wanted.wanted:
        await deps.demand.put(demand)
    for withdrawn in wanted.withdrawn:
        await deps.demand.remove(withdrawn, resized.attempt)
    log.info(
        "demand.resized",
        job_id=resized.job_id,
        workers=resized.workers,
        previous=resized.previous,
        missing=len(wanted.wanted),
    )


async def on_job_settled(event: Event[Any], deps: Deps) -> None:
    """The attempt started or ended: its demand is no longer pending (but for a multi-node
    gang still to be placed, `elastic.kept_at_start`), nor is the room wanted for moving it
    (an attempt that ends, moved or not, wants no room), nor for workers it misses."""
    job_id, attempt = event.data.job_id, event.data.attempt
    kept = None
    if isinstance(event.data, JobStarted):
        kept = elastic.kept_at_start(
            await deps.demand.get(job_id), attempt, in_room=job_id in deps.memory.in_room
        )
    if kept is not None:
        await deps.demand.put(kept)
        log.info("demand.started_without_room", attempt=attempt, workers=len(kept.bundles))
    else:
        await deps.demand.remove(job_id, attempt)
    await deps.demand.remove(move_demand_id(event.data.job_id), attempt=_EVERY_ATTEMPT)
    if not isinstance(event.data, JobStarted):
        await _withdraw_growth(event.data.job_id, deps)


async def _withdraw_growth(job_id: str, deps: Deps) -> None:
    for demand in await deps.demand.all():
        if elastic.is_growth_of(demand.job_id, job_id):
            await deps.demand.remove(demand.job_id, attempt=_EVERY_ATTEMPT)


async def on_job_cancelled(event: Event[JobCancelled], deps: Deps) -> None:
    """A cancelled job has no pending demand, whichever attempt it was at."""
    await deps.demand.remove(event.data.job_id, attempt=_EVERY_ATTEMPT)
    await deps.demand.remove(move_demand_id(event.data.job_id), attempt=_EVERY_ATTEMPT)
    await _withdraw_growth(event.data.job_id, deps)


_EVERY_ATTEMPT = 1_000_000


async def reconcile(deps: Deps) -> ScalePlan:
    """One pass: observe, decide (`policy.decision.decide`, one pure call), act, publish.
    Level-triggered: a missed pass is repaired by the next."""
    # Before the listing: each node listed was alive at some instant after this.
    seen_at = deps.clock.now()
    provided = await deps.provider.nodes()
    try:
        observed = await deps.observer.nodes()
    except RayHeadUnavailableError as away:
        await _while_the_head_is_away(deps, away)
        return ScalePlan(pools=())
    if deps.ray_head_away_since is not None:
        away_s = (seen_at - deps.ray_head_away_since).total_seconds()
        log.info("ray.head_back", away_s=round(away_s, 1))
        deps.ray_head_away_since = None
    by_pool = {p.name: p for p in deps.pools}
    now = deps.clock.now()
    if not deps.recovered:
        await _take_over(deps, provided)
    taken_back = await _close_recreated(deps, provided)
    provided, never_started = await _remove_unstarted(deps, provided, now)
    for pool, count in (await _announce_node_lifetimes(deps, provided, by_pool, seen_at)).items():
        taken_back[pool] = taken_back.get(pool, 0) + count
    await _read_advice(deps, now)
    demands = await deps.demand.all()
    reply = decision.decide(
        ScaleRequest(
            pools=tuple(deps.pools),
            config=deps.config,
            at=now,
            nodes=tuple(policy.node_views(deps.pools, provided, observed, now)),
            demands=tuple(demands),
            launched={name: node.launched_at for name, node in deps.billed_nodes.items()},
            memory=deps.memory,
        )
    )
    if not deps.leading():
        # Decided by a replica that no longer leads (it stalled meanwhile): the leader's
        # own pass acts instead, and reports what is blocked (nothing is said here, so
        # nothing is remembered as said).
        log.warning("scaler.pass_dropped", why="no longer leads")
        deps.memory = reply.memory
        return reply.plan
    deps.memory = reply.memory
    await _hand_over(deps, demands, reply.plan)
    for served in reply.served:
        await deps.demand.remove(served, attempt=_EVERY_ATTEMPT)
    await deps.status.publish_status(reply.status)
    deps.last_status = reply.status
    metrics.PASS.replace(metrics.pass_samples(reply.status, demands))
    stocked_out = set(never_started) | await _resize(deps, reply.plan, by_pool, provided, now)
    await _learn(deps, provided, taken_back=taken_back, stocked_out=stocked_out, now=now)
    await _report_blocked(deps, reply.to_report)
    return reply.plan


async def _resize(
    deps: Deps,
    decided: ScalePlan,
    by_pool: Mapping[str, PoolSpec],
    provided: Sequence[ProvidedNode],
    now: datetime,
) -> set[str]:
    """Act on the pass's resizes, each said before and after; the pools found out of
    capacity."""
    stocked_out: set[str] = set()
    for pool_plan in decided.pools:
        if pool_plan.target == pool_plan.current:
            continue
        if not await deps.fenced():
            log.warning("pool.resize_skipped", pool=pool_plan.pool, why="no longer leads")
            break
        requested = PoolResizeRequested(
            pool=pool_plan.pool,
            from_size=pool_plan.current,
            to_size=pool_plan.target,
            reason=pool_plan.reason.value,
        )
        await _publish(deps, requested)
        direction = "up" if pool_plan.target > pool_plan.current else "down"
        metrics.RESIZES.labels(pool_plan.pool, direction, pool_plan.reason.value).inc()
        log.info(
            "pool.resize",
            pool=pool_plan.pool,
            current=pool_plan.current,
            target=pool_plan.target,
            reason=pool_plan.reason.value,
        )
        try:
            if pool_plan.target > pool_plan.current:
                pool = by_pool[pool_plan.pool]
                launched = await deps.provider.launch(pool, pool_plan.target - pool_plan.current)
                await _announce_launches(deps, pool, launched)
            else:
                for name in decided.release:
                    if any(n.name == name and n.pool == pool_plan.pool for n in provided):
                        await _release_idle(deps, name, pool_plan.pool)
        except OSError as error:
            if pool_plan.target > pool_plan.current and not isinstance(error, ProviderBusyError):
                # Likely no capacity of this kind in the zone now (a spot stock-out): stop
                # asking for a while, and let `any` jobs take on-demand meanwhile.
                stocked_out.add(pool_plan.pool)
                deps.memory = decision.stocked_out(
                    deps.memory, [pool_plan.pool], now, deps.config.capacity_retry_after_s
                )
            metrics.RESIZE_FAILURES.labels(pool_plan.pool).inc()
            failed = PoolResizeFailed(
                pool=pool_plan.pool, to_size=pool_plan.target, message=str(error)
            )
            await _publish(deps, failed)
            continue
        await _publish(deps, PoolResized(pool=pool_plan.pool, size=pool_plan.target))
    return stocked_out


async def _hand_over(deps: Deps, demands: Sequence[Demand], decided: ScalePlan) -> None:
    """Say each placement (`job.placed`: the submitter hands the attempt to Ray, pinned to
    its nodes), then hold its room in the demand. Said first: a pass that dies in between
    places the attempt again, and the submitter takes the second placement for the first
    or moves the attempt; held first, an attempt nobody heard of would keep its room."""
    by_id = {demand.job_id: demand for demand in demands}
    for placement in decided.placements:
        demand = by_id[placement.job_id]
        digest = hashlib.sha256(",".join(placement.nodes).encode()).hexdigest()[:12]
        placed = JobPlaced(
            job_id=placement.job_id,
            attempt=placement.attempt,
            requeued=placement.requeued,
            nodes=placement.nodes,
            pool=placement.pool,
        )
        key = f"placed-{placement.job_id}-{placement.attempt}-{placement.requeued}-{digest}"
        await _publish(deps, placed, event_id=key)
        if await deps.demand.place(demand, placement.nodes):
            metrics.PLACEMENTS.labels(placement.pool).inc()
            log.info(
                "demand.placed",
                job_id=placement.job_id,
                attempt=placement.attempt,
                nodes=list(placement.nodes),
            )


async def _release_idle(deps: Deps, name: str, pool: str) -> None:
    """Drained in Ray first: Ray refuses a node that took work since this pass saw it idle,
    and that node stays; one Ray agreed to let go takes no more work while its VM goes."""
    refusal = await deps.observer.drain_idle(name)
    if refusal is not None:
        log.info("node.release_refused", node=name, pool=pool, why=refusal)
        return
    if not await deps.fenced():
        log.warning("node.release_skipped", node=name, pool=pool, why="no longer leads")
        return
    await deps.provider.release(name)
    await _node_released(deps, name, pool, ReleaseReason.SCALED_DOWN)


async def _while_the_head_is_away(deps: Deps, away: RayHeadUnavailableError) -> None:
    """No pass without Ray: which nodes are busy, idle or gone is Ray's to say, and a node
    missing from a head that is away is not lost. Nothing is placed, grown or released
    until it answers; the status says since when it is away."""
    now = deps.clock.now()
    if deps.ray_head_away_since is None:
        deps.ray_head_away_since = now
        log.warning("ray.head_away", error=str(away))
    if deps.last_status is not None:
        await deps.status.publish_status(
            deps.last_status.model_copy(
                update={"updated_at": now, "ray_head_away_since": deps.ray_head_away_since}
            )
        )


async def _remove_unstarted(
    deps: Deps, provided: Sequence[ProvidedNode], now: datetime
) -> tuple[list[ProvidedNode], set[str]]:
    """Nodes the provider gave up starting are removed (billed nothing: they end where they
    were launched), and their pools are out of capacity for a while, as after a failed
    growth. Returns the nodes left and the pools that stocked out. One whose removal fails
    stays listed, to be tried again next pass."""
    kept: list[ProvidedNode] = []
    stocked_out: set[str] = set()
    for node in provided:
        if node.not_started is None:
            kept.append(node)
            continue
        stocked_out.add(node.pool)
        deps.memory = decision.stocked_out(
            deps.memory, [node.pool], now, deps.config.capacity_retry_after_s
        )
        log.warning("node.never_started", node=node.name, pool=node.pool, why=node.not_started)
        try:
            await deps.provider.release(node.name)
        except OSError as error:
            log.warning("node.unstarted_not_removed", node=node.name, error=str(error))
            kept.append(node)
            continue
        billed = deps.billed_nodes.get(node.name)
        if billed is not None:
            await _node_released(
                deps, node.name, node.pool, ReleaseReason.NEVER_STARTED, at=billed.launched_at
            )
    return kept, stocked_out


async def _close_recreated(deps: Deps, provided: Sequence[ProvidedNode]) -> dict[str, int]:
    """A name whose machine the provider made again (or that names another machine now)
    ends the life billed under it, at the provider's record of that life's end, else its
    last sighting; the next life is announced as any new node is, once it is listed and
    starting. Returns, per pool, the lives the market took back (not those an upgrade or
    repair replaced)."""
    renewed = [
        (node, billed)
        for node in provided
        if (billed := deps.billed_nodes.get(node.name)) is not None
        and lives.new_life(billed.life, node.life, recreating=node.recreating)
    ]
    if not renewed:
        return {}
    try:
        recorded = await deps.provider.ended({n.name: b.launched_at for n, b in renewed})
    except OSError as error:
        # The life before still ends, at its last sighting: the next one bills from here.
        log.warning("nodes.end_records_unreadable", nodes=len(renewed), error=str(error))
        recorded = {}
    taken_back: dict[str, int] = {}
    for node, billed in renewed:
        end = best_end(
            billed, recorded=recorded.get(node.name), last_seen=deps.last_seen.get(node.name)
        )
        reason = lives.gone_reason(maintenance=end.maintenance, unwatched=False)
        if reason is ReleaseReason.GONE:
            taken_back[billed.pool] = taken_back.get(billed.pool, 0) + 1
        log.info("node.recreated", node=node.name, pool=billed.pool, life=node.life)
        await _node_released(deps, node.name, billed.pool, reason, at=end.at, source=end.source)
        # Still listed, as its next life: to be announced, not taken for a release under way.
        deps.ended_nodes.discard(node.name)
    return taken_back


async def _report_blocked(deps: Deps, blocked: Sequence[Blocked]) -> None:
    """Each blocked demand the decision has not reported before."""
    for block in blocked:
        message = f"{block.job_id}: {block.reason.value}: {block.detail}"
        await _publish(
            deps,
            PoolResizeFailed(pool=block.pool or "none", to_size=0, message=message),
            event_id=f"blocked-{block.job_id}-{block.attempt}-{block.reason.value}",
        )
        log.warning(
            "demand.blocked",
            job_id=block.job_id,
            reason=block.reason.value,
            detail=block.detail,
        )
        deps.memory = decision.reported(deps.memory, [block])


async def _read_advice(deps: Deps, now: datetime) -> None:
    """The cloud's forecast of the spot pools, read again when it is old; one that cannot be
    read leaves the last one (and a pool never advised on is decided on what was learnt)."""
    if deps.advisor is None or not decision.advice_due(deps.memory, now):
        return
    deps.memory = deps.memory.model_copy(update={"advice_read_at": now})
    spot = [pool for pool in deps.pools if pool.capacity is CapacityClass.SPOT]
    try:
        advice = await deps.advisor.advice(spot)
    except OSError as error:
        log.warning("pools.advice_unread", error=str(error))
        return
    deps.memory = deps.memory.model_copy(update={"advice": advice})
    for pool, forecast in advice.items():
        log.info(
            "pools.advice",
            pool=pool,
            obtainability=forecast.obtainability,
            uptime_h=forecast.uptime_h,
        )


async def _learn(
    deps: Deps,
    provided: Sequence[ProvidedNode],
    *,
    taken_back: Mapping[str, int],
    stocked_out: set[str],
    now: datetime,
) -> None:
    """What this pass saw of each pool, added to what is known of it, and posted."""
    # A pass that comes after a restart does not count the time between as held.
    deps.memory = decision.learnt(
        deps.memory,
        deps.pools,
        nodes=Counter(node.pool for node in provided),
        taken_back=taken_back,
        stocked_out=stocked_out,
        now=now,
        max_gap_s=3 * deps.pass_interval_s,
    )
    knowledge = PoolsKnowledge(updated_at=now, pools=dict(deps.memory.knowledge))
    await deps.status.publish_knowledge(knowledge)


async def _take_over(deps: Deps, provided: Sequence[ProvidedNode]) -> None:
    """At start: every node open on the ledger becomes this process's to close, those the
    provider no longer lists marked as gone while no scaler watched, and so does every node
    the provider started and saw stop that the ledger never heard of. A failure leaves it
    to the next pass."""
    history = node_history(await deps.history.node_events())
    board = await deps.status.sightings()
    stopped = await deps.provider.stopped()
    learnt = await deps.status.knowledge()
    if learnt is not None:
        knowledge = {**learnt.pools, **deps.memory.knowledge}
        deps.memory = deps.memory.model_copy(update={"knowledge": knowledge})
    seen = dict(board.seen) if board is not None else {}
    listed = {node.name: node for node in provided}
    deps.ledger_names |= history.launched
    known_lives = board.lives if board is not None else {}
    for node in history.open:
        if node.life is None and node.node in known_lives:
            node = replace(node, life=known_lives[node.node])  # noqa: PLW2901
        deps.billed_nodes[node.machine] = node
        deps.last_seen[node.machine] = seen.get(node.node, node.launched_at)
        if node.machine not in listed:
            deps.unwatched.add(node.machine)
    for name in history.ended:
        machine, life = history.lives.get(name, (name, None))
        now_listed = listed.get(machine)
        if machine in deps.billed_nodes or now_listed is None:
            continue
        # Released, and listed while it goes; unless its name is another machine's now.
        if not lives.new_life(life, now_listed.life, recreating=now_listed.recreating):
            deps.ended_nodes.add(machine)
    by_pool = {pool.name: pool for pool in deps.pools}
    for gone in stopped:
        if gone.name in history.launched or gone.name in listed or gone.pool not in by_pool:
            continue
        # Launched by a scaler that died before announcing it, and gone before this one
        # could list it: billed from its start, then closed as any gone node is. Its loss
        # may be on record already (the watcher saw it go): that is no launch.
        await _node_launched(deps, gone.name, by_pool[gone.pool], gone.launched_at)
        deps.unwatched.add(gone.name)
    deps.recovered = True
    log.info("nodes.taken_over", open=len(history.open), gone=len(deps.unwatched))


async def _announce_node_lifetimes(
    deps: Deps, provided: Sequence[ProvidedNode], by_pool: Mapping[str, PoolSpec], seen_at: datetime
) -> dict[str, int]:
    """Level-triggered, so that every node-second can be billed: a listed node not yet
    announced (launched before a restart, or named only once it registered) is announced
    from the provider's launch time; an announced node that is no longer listed, and that
    the scaler did not release, is gone (preempted, deleted by hand), and ends where the
    provider recorded its end, else where it was last listed. Returns, per pool, how many
    nodes went unasked while this process watched. After `_take_over`."""
    listed = {node.name for node in provided}
    for node in provided:
        billed = deps.billed_nodes.get(node.name)
        if billed is not None and billed.life is None and node.life is not None:
            # The machine made for it exists now: this is the life it is.
            deps.billed_nodes[node.name] = replace(billed, life=node.life)
        if billed is not None or node.name in deps.ended_nodes:
            continue
        pool = by_pool.get(node.pool)
        if pool is None:
            log.warning("node.unknown_pool", node=node.name, pool=node.pool)
            continue
        await _node_launched(deps, node.name, pool, node.launched_at, life=node.life)
    gone = sorted(name for name in deps.billed_nodes if name not in listed)
    try:
        since = {name: deps.billed_nodes[name].launched_at for name in gone}
        recorded = await deps.provider.ended(since) if gone else {}
    except OSError as error:
        # Closed at a guess, a node could never be closed right: it waits for the record
        # (billed meanwhile up to its last sighting, no further).
        log.warning("nodes.end_records_unreadable", nodes=len(gone), error=str(error))
        gone, recorded = [], {}
    billed_gone = [deps.billed_nodes[name] for name in gone]
    # `closings` reads the ledger's names; the provider and the sightings, the machines'.
    by_ledger = {node.node: node.machine for node in billed_gone}
    taken_back: dict[str, int] = {}
    for closing in closings(
        billed_gone,
        running=(),
        recorded={
            node.node: recorded[node.machine] for node in billed_gone if node.machine in recorded
        },
        last_seen={
            node.node: deps.last_seen[node.machine]
            for node in billed_gone
            if node.machine in deps.last_seen
        },
    ):
        machine = by_ledger[closing.node]
        end = closing.end
        reason = lives.gone_reason(maintenance=end.maintenance, unwatched=machine in deps.unwatched)
        if reason is ReleaseReason.GONE:
            taken_back[closing.pool] = taken_back.get(closing.pool, 0) + 1
        await _node_released(deps, machine, closing.pool, reason, at=end.at, source=end.source)
    for name in deps.billed_nodes.keys() & listed:
        deps.last_seen[name] = seen_at
    deps.ended_nodes &= listed
    await deps.status.publish_sightings(
        NodeSightings(
            updated_at=seen_at,
            pass_interval_s=deps.pass_interval_s,
            seen={
                node.node: deps.last_seen[name] for name, node in sorted(deps.billed_nodes.items())
            },
            lives={
                node.node: node.life for node in deps.billed_nodes.values() if node.life is not None
            },
        )
    )
    return taken_back


async def _announce_launches(deps: Deps, pool: PoolSpec, names: Sequence[str]) -> None:
    """Billed from when the provider says each started (a node that takes a while to
    start bills from its start, not from when the launch call returned)."""
    if not names:
        return
    now = deps.clock.now()
    started = {node.name: node.launched_at for node in await deps.provider.nodes()}
    for name in names:
        await _node_launched(deps, name, pool, started.get(name, now))


async def _node_launched(
    deps: Deps, name: str, pool: PoolSpec, launched_at: datetime, *, life: str | None = None
) -> None:
    """Billed from `launched_at`, under the ledger's name for this life of machine `name`."""
    counterpart = on_demand_counterpart(pool, deps.pools)
    ledger = lives.ledger_name(name, launched_at, deps.ledger_names)
    launched = NodeLaunched(
        node=ledger,
        pool=pool.name,
        capacity=pool.capacity,
        gpus=pool.gpus,
        gpu_type=pool.gpu_type,
        cpus=pool.cpus,
        memory_gb=pool.memory_gb,
        price_per_hour_usd=pool.price_per_hour_usd,
        on_demand_pool=counterpart.name if counterpart else None,
        on_demand_price_per_hour_usd=counterpart.price_per_hour_usd if counterpart else None,
        launched_at=launched_at,
        host=None if ledger == name else name,
        life=life,
    )
    await _publish(deps, launched, event_id=node_event_id("launched", ledger))
    deps.ledger_names.add(ledger)
    deps.billed_nodes[name] = OpenNode(
        node=ledger,
        pool=pool.name,
        launched_at=launched_at,
        host=None if ledger == name else name,
        life=life,
    )
    deps.last_seen.setdefault(name, launched_at)
    metrics.NODES_LAUNCHED.labels(pool.name, pool.capacity.value).inc()
    log.info("node.launched", node=name, pool=pool.name)


async def _node_released(
    deps: Deps,
    name: str,
    pool: str,
    reason: ReleaseReason,
    *,
    at: datetime | None = None,
    source: NodeEndSource = NodeEndSource.RECORDED,
) -> None:
    """Machine `name`'s billed life ends (under its name in the ledger)."""
    billed = deps.billed_nodes.get(name)
    ledger = name if billed is None else billed.node
    released = NodeReleased(
        node=ledger,
        pool=pool,
        reason=reason,
        released_at=at or deps.clock.now(),
        end_source=source,
    )
    # Published before it is forgotten: if the bus fails, the next pass says it again.
    await _publish(deps, released, event_id=node_event_id("released", ledger))
    deps.billed_nodes.pop(name, None)
    deps.last_seen.pop(name, None)
    deps.unwatched.discard(name)
    deps.ended_nodes.add(name)
    metrics.NODES_RELEASED.labels(pool, reason.value).inc()
    log.info("node.released", node=name, pool=pool, reason=reason.value)


async def follow_costs(feed: CostEventFeed, deps: Deps, stop: asyncio.Event) -> None:
    """Collect every cost event, stored and new, until `stop`. Folding is idempotent and
    order-free across aggregates, so a feed that starts over or interleaves is fine."""
    await feed.follow(stop, deps.cost_events.append)


async def measure_costs(deps: Deps) -> None:
    """Fold what arrived and attribute all of it, for the cost-accrued metrics: the same
    attribution as `spotrain cost`, from the nodes' own prices. In a thread: a long
    history takes seconds (bench/cost_meter.py), and the reconcile loop must not wait."""
    # The same list, emptied: the feed holds on to it (`follow_costs`).
    arrived = deps.cost_events.copy()
    deps.cost_events.clear()
    now = deps.clock.now()
    # Open nodes are billed to their last sighting, as `spotrain cost` bills them, once
    # this process knows every open node's (before, up to now).
    seen = (
        {
            node.node: deps.last_seen[name]
            for name, node in deps.billed_nodes.items()
            if name in deps.last_seen
        }
        if deps.recovered
        else None
    )

    since = month_start(now)
    if deps.spend_since != since:
        deps.settled_month.clear()
        deps.spend_since = since

    def attribute() -> tuple[metrics.Samples, dict[str, float]]:
        for event in arrived:
            deps.costs.add(event)
        inputs = deps.costs.inputs({}, seen=seen)
        samples = metrics.cost_samples(attributed(inputs, now=now, settled=deps.settled_costs))
        month = attributed(inputs, now=now, since=since, settled=deps.settled_month)
        return samples, spend_by_owner(month)

    samples, spend = await asyncio.to_thread(attribute)
    metrics.COSTS.replace(samples)
    # Team budgets read it (the submitter): what each owner spent this month.
    await deps.status.publish_spend(OwnersSpend(since=since, at=now, by_owner=spend))


async def _publish(deps: Deps, data: EventData, event_id: str | None = None) -> None:
    await deps.bus.publish(
        new_event(data, source=SERVICE, time=deps.clock.now(), event_id=event_id)
    )


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    JobQueued: on_job_queued,
    JobMoveRequested: on_job_move_requested,
    JobResized: on_job_resized,
    JobStarted: on_job_settled,
    JobSucceeded: on_job_settled,
    JobFailed: on_job_settled,
    JobCancelled: on_job_cancelled,
    JobInterrupted: on_job_settled,
}
