"""One pass's decision as one call, pure: `decide(ScaleRequest) -> ScaleReply`.

The request is what the pass observed (the pools' nodes as the scaler sees them, the
pending demand, when each billed node was launched) and what the scaler remembers from the
passes before (`ScalerMemory`, a frozen value). The reply is everything the pass then does
and says: the plan to act on, the status to publish, the demands now served, the blocked
demand not yet reported, and the memory for the next pass. The live scaler's `reconcile`
observes, calls this, acts and publishes; the rules between live here, with their tests.

What happens while acting (a growth refused for want of capacity, nodes lost, the cloud's
forecast read) is folded into the memory by the small functions below, each pure too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import AwareDatetime

from services.scaler.model import (
    Blocked,
    BlockedReason,
    Demand,
    NodeView,
    PoolSpec,
    ScalePlan,
    ScalerConfig,
)
from services.scaler.policy import elastic, lives
from services.scaler.policy.keepalive import IdleHistory
from services.scaler.policy.packing import plan, preemption_risk, summarize
from shared.events.types import CapacityClass, Frozen
from shared.policy import deadline
from shared.policy.deadline import SpotAdvice, SpotOutlook
from shared.policy.pool_knowledge import PoolRecord, observe
from shared.pools import PoolsStatus

ADVICE_EVERY_S = 300.0
"""How often the cloud's forecast is read: it moves with the market, in minutes, not seconds
(and each read is an API call per pool)."""

BlockKey = tuple[str, int, str]
"""A blocked demand as reported: its job, attempt and reason."""


class ScalerMemory(Frozen):
    """What one pass leaves to the next. Kept by the process, not across a restart, except
    `knowledge`, which is also published (and read back on taking over)."""

    in_room: frozenset[str] = frozenset()
    """The demands the last pass found room for on the nodes (`ScalePlan.in_room`). A gang
    that starts just after a restart keeps its demand until the next pass, which buys a
    node for it if its workers took the room meanwhile."""
    reported_blocks: frozenset[BlockKey] = frozenset()
    """Blocked demand already announced, so each is said once per attempt and reason; only
    that of demands still pending is kept."""
    out_of_capacity_until: Mapping[str, AwareDatetime] = {}
    """Pools whose last growth failed (or whose nodes never started), and until when they
    are left alone."""
    knowledge: Mapping[str, PoolRecord] = {}
    """What has been learnt of each pool, by this process and those before it."""
    advice: Mapping[str, SpotAdvice] = {}
    """The cloud's last forecast read, per spot pool."""
    advice_read_at: AwareDatetime | None = None
    """When the forecast was last asked for (read or not)."""
    idle: Mapping[str, IdleHistory] = {}
    """Per pool, the idle periods the keep-alive learns its timeout from."""
    idle_nodes: Mapping[str, AwareDatetime] = {}
    """The nodes the last pass saw idle, and since when."""
    placed: Mapping[str, AwareDatetime] = {}
    """The nodes a pass placed an attempt on within `PLACED_GRACE_S`, and when."""


class ScaleRequest(Frozen):
    """What one pass observed, and what the scaler remembers."""

    pools: tuple[PoolSpec, ...]
    config: ScalerConfig
    at: AwareDatetime
    """When the pass decides (its `now`)."""
    nodes: tuple[NodeView, ...]
    demands: tuple[Demand, ...]
    launched: Mapping[str, AwareDatetime] = {}
    """When each node open on the ledger was launched, by the name it is listed under."""
    memory: ScalerMemory = ScalerMemory()


class ScaleReply(Frozen):
    """What the pass does and says."""

    plan: ScalePlan
    status: PoolsStatus
    served: tuple[str, ...]
    """Demands done with: running attempts whose room the nodes have now (`elastic.served`)."""
    to_report: tuple[Blocked, ...]
    """Blocked demand not reported before (a moment's settling is not news): once said,
    `reported` remembers it."""
    memory: ScalerMemory


def decide(request: ScaleRequest) -> ScaleReply:
    """The whole decision of one pass. Pure: the same request always gives the same reply."""
    now, memory, pools = request.at, request.memory, request.pools
    idle, idle_nodes = watch_idle(
        memory, request.pools, request.nodes, now, request.config.idle_timeout_s
    )
    placed = {
        node: at
        for node, at in memory.placed.items()
        if (now - at).total_seconds() < placed_grace_s(request.config)
    }
    decided = plan(
        pools,
        request.nodes,
        lives.every_avoided(request.demands, request.launched),
        request.config,
        now,
        unavailable=out_of_capacity(memory, now),
        risk=risk(pools, memory),
        idle_timeouts=(
            idle_timeouts(pools, idle, request.config)
            if request.config.learn_idle_timeout
            else None
        ),
        outlooks=outlooks(pools, memory, now),
        kept=frozenset(placed),
    )
    grown = {p.pool: p.target - p.current for p in decided.pools if p.target > p.current}
    for pool, count in grown.items():
        history = idle.get(pool, IdleHistory())
        for _ in range(count):
            history = history.demand_came(now, request.config.idle_timeout_s)
        idle[pool] = history
    status = summarize(
        pools,
        nodes=request.nodes,
        demands=request.demands,
        decided=decided,
        config=request.config,
        now=now,
        out_of_capacity_until=memory.out_of_capacity_until,
        knowledge=memory.knowledge,
        advice=memory.advice,
    )
    to_report, said = new_blocks(decided.blocked, memory.reported_blocks, request.demands)
    return ScaleReply(
        plan=decided,
        status=status,
        served=tuple(elastic.served(request.demands, decided.in_room)),
        to_report=to_report,
        memory=memory.model_copy(
            update={
                "in_room": frozenset(decided.in_room),
                "reported_blocks": said,
                "idle": idle,
                "idle_nodes": idle_nodes,
                "placed": placed | {n: now for p in decided.placements for n in p.nodes},
            }
        ),
    )


PLACED_GRACE_S = 60.0
"""A node a pass placed an attempt on is kept this long after (never longer than the
configured idle timeout), however idle Ray says it is: the work shows in
Ray only some seconds after its job starts (a Ray Train driver starts on the head, then asks
for its workers' room), and a node let go meanwhile, as idle, strands that work, whose
workers then never start."""


def placed_grace_s(config: ScalerConfig) -> float:
    """How long a node placed on is kept: `PLACED_GRACE_S`, or the configured idle timeout
    if shorter (a platform that lets idle nodes go at once wants that)."""
    return min(PLACED_GRACE_S, config.idle_timeout_s)


def out_of_capacity(memory: ScalerMemory, now: datetime) -> frozenset[str]:
    """The pools left alone now after a stock-out."""
    return frozenset(pool for pool, until in memory.out_of_capacity_until.items() if until > now)


def stocked_out(
    memory: ScalerMemory, pools: Iterable[str], now: datetime, retry_after_s: float
) -> ScalerMemory:
    """The memory after these pools ran out of capacity now (a growth refused, or a node the
    provider gave up starting): they are not grown until `retry_after_s` has passed, and
    `any` jobs take on-demand meanwhile."""
    until = now + timedelta(seconds=retry_after_s)
    out = dict(memory.out_of_capacity_until)
    out.update(dict.fromkeys(pools, until))
    if out == memory.out_of_capacity_until:
        return memory
    return memory.model_copy(update={"out_of_capacity_until": out})


def new_blocks(
    blocked: Sequence[Blocked], reported: frozenset[BlockKey], demands: Sequence[Demand]
) -> tuple[tuple[Blocked, ...], frozenset[BlockKey]]:
    """The blocked demand to report now (once per attempt and reason; settling is a
    moment's wait, not news), and what has been reported of the demands still pending.
    What is reported now is remembered once it has been said (`reported`): a pass that
    fails before saying it says it next time."""
    pending = {demand.job_id for demand in demands}
    kept = frozenset(key for key in reported if key[0] in pending)
    fresh: dict[BlockKey, Blocked] = {}
    for block in blocked:
        key = _key(block)
        if block.reason is not BlockedReason.SETTLING and key not in kept:
            fresh.setdefault(key, block)
    return tuple(fresh.values()), kept


def reported(memory: ScalerMemory, said: Iterable[Blocked]) -> ScalerMemory:
    """The memory once these blocked demands were said."""
    keys = memory.reported_blocks | {_key(block) for block in said}
    return memory.model_copy(update={"reported_blocks": keys})


def _key(block: Blocked) -> BlockKey:
    return (block.job_id, block.attempt, block.reason.value)


def risk(pools: Sequence[PoolSpec], memory: ScalerMemory) -> dict[str, float]:
    """What each pool's losses, as learnt and as the cloud forecasts them, add to its
    price: a restart (its boot) each."""
    found = {}
    for pool in pools:
        record = memory.knowledge.get(pool.name)
        advice = memory.advice.get(pool.name)
        if record is None and advice is None:
            continue
        found[pool.name] = preemption_risk(
            record.taken_back if record is not None else 0,
            record.node_hours if record is not None else 0.0,
            pool.boot_time_s / 3600,
            uptime_h=advice.uptime_h if advice is not None else None,
        )
    return found


def outlooks(
    pools: Sequence[PoolSpec], memory: ScalerMemory, now: datetime
) -> dict[str, SpotOutlook]:
    """What has been seen of each spot pool, with what the cloud forecasts of it now, for
    the deadline policy (a boot a restart)."""
    return {
        pool.name: deadline.advised(
            record.outlook(pool.boot_time_s / 3600, now), memory.advice.get(pool.name)
        )
        for pool in pools
        if pool.capacity is CapacityClass.SPOT
        and (record := memory.knowledge.get(pool.name)) is not None
    }


def advice_due(memory: ScalerMemory, now: datetime) -> bool:
    """Whether the cloud's forecast is old enough to be asked for again."""
    if memory.advice_read_at is None:
        return True
    return (now - memory.advice_read_at).total_seconds() >= ADVICE_EVERY_S


def learnt(
    memory: ScalerMemory,
    pools: Sequence[PoolSpec],
    *,
    nodes: Mapping[str, int],
    taken_back: Mapping[str, int],
    stocked_out: Iterable[str],
    now: datetime,
    max_gap_s: float,
) -> ScalerMemory:
    """What this pass saw of each pool (`nodes` held, `taken_back` of them lost, whether it
    stocked out), added to what is known of it."""
    out = set(stocked_out)
    knowledge = dict(memory.knowledge)
    for pool in pools:
        knowledge[pool.name] = observe(
            knowledge.get(pool.name),
            pool.name,
            now=now,
            nodes=nodes.get(pool.name, 0),
            taken_back=taken_back.get(pool.name, 0),
            stocked_out=pool.name in out,
            max_gap_s=max_gap_s,
        )
    return memory.model_copy(update={"knowledge": knowledge})


SAME_PERIOD_S = 10.0
"""Two sightings of a node idle whose starts differ by less than this are one period (the
idle time Ray reports and the pass's clock are read a moment apart); by more, the node
took work and let it go between the passes."""


def idle_since(nodes: Sequence[NodeView], now: datetime) -> dict[str, datetime]:
    """The ready nodes that hold no work, and since when."""
    return {
        node.name: now - timedelta(seconds=node.idle_s)
        for node in nodes
        if node.ready and not node.draining and node.idle_s > 0
    }


def watch_idle(
    memory: ScalerMemory,
    pools: Sequence[PoolSpec],
    nodes: Sequence[NodeView],
    now: datetime,
    longest_s: float,
) -> tuple[dict[str, IdleHistory], dict[str, datetime]]:
    """The idle periods after this pass's sighting, and the nodes idle now with the start
    of their period. A node seen idle that was not opens a period; one seen idle before
    and busy now (or idle again since a later start) is work coming back, which ends the
    pool's oldest open period. A node gone while idle, or going (draining under a notice,
    out of Ray while still listed), leaves its period open: work that comes for the pool
    later ends it, as if the node had been kept; its going is no work coming for it."""
    known = {pool.name for pool in pools}
    idle = dict(memory.idle)
    seen = idle_since(nodes, now)
    kept: dict[str, datetime] = {}
    for node in nodes:
        if node.pool not in known:
            continue
        if node.draining or not node.ready:
            continue  # going, or not in Ray: as if gone (its period, if any, stays open)
        before = memory.idle_nodes.get(node.name)
        since = seen.get(node.name)
        history = idle.get(node.pool, IdleHistory())
        same = (
            before is not None
            and since is not None
            and (since - before).total_seconds() < SAME_PERIOD_S
        )
        if before is not None and not same:
            history = history.demand_came(now, longest_s)
        if since is not None and not same:
            history = history.went_idle(since)
        if since is not None:
            kept[node.name] = before if same and before is not None else since
        idle[node.pool] = history
    return idle, kept


def idle_timeouts(
    pools: Sequence[PoolSpec], idle: Mapping[str, IdleHistory], config: ScalerConfig
) -> dict[str, float]:
    """Per pool, the idle timeout its history says costs least (never above the one
    configured; the configured one until enough periods were seen)."""
    return {
        pool.name: history.timeout_s(pool.boot_time_s, config.idle_timeout_s)
        for pool in pools
        if (history := idle.get(pool.name)) is not None
    }
