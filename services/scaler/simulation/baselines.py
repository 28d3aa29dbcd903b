"""The scaling policies compared by the trace replay: ours (`policy.plan`, called as is),
Ray's autoscaler bin-packing, a naive one and a static one. Each is a function of the
cluster's state at a decision tick; none keeps a clock."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from services.scaler.model import Demand, NodeView, PoolSpec, Room, ScalerConfig
from services.scaler.policy import plan, preemption_risk
from services.scaler.policy.decision import placed_grace_s
from services.scaler.policy.keepalive import best_idle_timeout_s
from services.scaler.simulation.cluster import (
    CPUS_PER_GPU,
    EPOCH,
    ClusterState,
    Decision,
    SimJob,
    SimNode,
)
from shared.events.types import CapacityClass
from shared.policy import deadline
from shared.policy.deadline import DeadlineState, Run


def idle_expired(state: ClusterState, idle_timeout_s: float) -> list[SimNode]:
    """Ready, empty nodes idle at least the timeout, longest idle first, above each pool's
    minimum."""
    counts = dict(state.sizes)
    idle = sorted(
        (
            n
            for n in state.idle
            if n.ready
            and n.idle_since_s is not None
            and state.now_s - n.idle_since_s >= idle_timeout_s
        ),
        key=lambda n: (n.idle_since_s, n.name),
    )
    chosen = []
    for node in idle:
        if counts[node.pool.name] > node.pool.min_nodes:
            chosen.append(node)
            counts[node.pool.name] -= 1
    return chosen


JobRule = Callable[[SimJob, ClusterState, bool], Run]
"""A deadline job's choice at a decision: the job, the cluster, whether spot can be had."""


def boot_overhead_s(pools: Sequence[PoolSpec]) -> float:
    """What a start costs a job in the replay: its node's boot, the slowest pool's."""
    return max((p.boot_time_s for p in pools if p.gpus > 0), default=0.0)


def _price_ratio(pools: Sequence[PoolSpec]) -> float:
    """Spot's price per GPU-hour as a share of on-demand's, the cheapest of each."""
    per_gpu = {
        capacity: min(
            (p.price_per_hour_usd / p.gpus for p in pools if p.gpus and p.capacity is capacity),
            default=None,
        )
        for capacity in (CapacityClass.SPOT, CapacityClass.ON_DEMAND)
    }
    spot, on_demand = per_gpu[CapacityClass.SPOT], per_gpu[CapacityClass.ON_DEMAND]
    if spot is None or not on_demand:
        return 1.0
    return min(1.0, max(spot / on_demand, 1e-6))


def deadline_rule(job: SimJob, state: ClusterState, spot_available: bool) -> Run:
    """The platform's deadline policy (`shared.policy.deadline.decide`) for a queued job."""
    overhead_h = state.restart_overhead_s / 3600
    assert job.deadline_s is not None
    decision = deadline.decide(
        DeadlineState.model_construct(
            hours_left=(job.deadline_s - state.now_s) / 3600,
            work_left_h=job.remaining_s / 3600,
            running=Run.WAIT,
            overhead_left_h=0.0,
            restart_overhead_h=overhead_h,
            decision_interval_h=state.decision_interval_s / 3600,
            spot_available=spot_available,
            spot_price_ratio=_price_ratio(state.pools),
            outlook=deadline.advised(
                deadline.outlook(deadline.WindowTally(), 0.0, overhead_h),
                _best_advice(job, state),
            ),
        )
    )
    return decision.run


def _best_advice(job: SimJob, state: ClusterState) -> deadline.SpotAdvice | None:
    """Of the spot pools the job fits, the forecast with the longest uptime (None when the
    policy is told none)."""
    fits = [
        advice
        for pool in state.pools
        if pool.gpus >= job.bundles[0] and (advice := state.advice.get(pool.name)) is not None
    ]
    return max(fits, key=lambda a: a.uptime_h or 0.0, default=None)


def uniform_progress_rule(job: SimJob, state: ClusterState, spot_available: bool) -> Run:
    """The paper's Uniform Progress for a queued job: on-demand once the time left is less
    than the work left and two restarts; spot when it can be had; on-demand when behind
    the line from its arrival to its deadline; else wait."""
    assert job.deadline_s is not None
    overhead_s = state.restart_overhead_s
    if job.deadline_s - state.now_s < job.remaining_s + 2 * overhead_s:
        return Run.ON_DEMAND
    if spot_available:
        return Run.SPOT
    line_s = job.duration_s * (state.now_s - job.arrival_s) / (job.deadline_s - job.arrival_s)
    return Run.ON_DEMAND if job.saved_s < line_s else Run.WAIT


_PAST_EDGE_S = 1.0
"""How far past an edge of the deadline rule a wake falls: on the edge, a job still waits."""


def deadline_wakes(job: SimJob, now_s: float, overhead_s: float) -> list[float]:
    """When a queued deadline job's choice may change while nothing else happens: its slack
    down to the deadline policy's reserve, its last chance to wait (two restarts left), and
    Uniform Progress's line overtaking it."""
    assert job.deadline_s is not None
    remaining = job.remaining_s
    edges = [
        job.deadline_s - remaining * (1 + deadline.RESERVE_SHARE) - overhead_s,
        job.deadline_s - remaining - 2 * overhead_s,
        job.arrival_s + job.saved_s / job.duration_s * (job.deadline_s - job.arrival_s),
    ]
    # Just past each edge: on it, the job may still wait, and nothing would wake it again.
    return [edge + _PAST_EDGE_S for edge in edges if edge + _PAST_EDGE_S > now_s]


class Spotrain:
    """Ours: `services.scaler.policy.plan` on the same views the live scaler builds, told of
    the pools that stocked out within the retry time, as the live scaler is, and of each
    market pool's preemption risk from the nodes it took back so far. A job with a
    deadline runs on what its rule says (spot, on-demand, or not yet: then it may take only
    free spot room); the others are `any` jobs."""

    watches_queue = True
    places_jobs = True

    def __init__(
        self,
        rule: JobRule = deadline_rule,
        name: str = "spotrain",
        *,
        told_advice: bool = False,
        interval_s: float = ScalerConfig().pass_interval_s,
    ) -> None:
        self.name = name
        self.rule = rule
        self.told_advice = told_advice
        """Whether the replay tells it the markets' forecast (`ClusterState.advice`)."""
        self.interval_s = interval_s
        """The live scaler's pass interval (`ScalerConfig.pass_interval_s`)."""
        self._rooms: dict[tuple[str, int], Room] = {}
        """Free room by pool and free GPUs: a node's free room follows from those two."""
        self._timeouts: dict[str, float] = {}
        self._periods_seen: dict[str, int] = {}

    def decide(self, state: ClusterState) -> Decision:
        views = [
            node.view if node.view is not None else self._view(node, state) for node in state.nodes
        ]
        retry_s = state.config.capacity_retry_after_s
        unavailable = frozenset(
            pool for pool, at_s in state.stocked_out_s.items() if state.now_s - at_s < retry_s
        )
        demands, capacity = self._demands(state, unavailable)
        restart_h = state.restart_overhead_s / 3600
        risk = {
            pool: preemption_risk(
                taken,
                state.node_hours.get(pool, 0.0),
                restart_h,
                uptime_h=advice.uptime_h if (advice := state.advice.get(pool)) else None,
            )
            for pool, taken in state.taken_back.items()
        }
        idle_timeouts = self._idle_timeouts(state)
        grace_s = placed_grace_s(state.config)
        kept = frozenset(
            node.name
            for node in state.idle
            if node.placed_s is not None and state.now_s - node.placed_s < grace_s
        )
        decided = plan(
            state.pools,
            views,
            demands,
            state.config,
            EPOCH + timedelta(seconds=state.now_s),
            unavailable=unavailable,
            risk=risk,
            idle_timeouts=idle_timeouts,
            kept=kept,
        )
        remaining = {p.pool: p.current for p in decided.pools}
        name_to_pool = {node.name: node.pool.name for node in state.idle}
        for name in decided.release:
            remaining[name_to_pool[name]] -= 1
        launch = {p.pool: p.target - remaining[p.pool] for p in decided.pools}
        launch = {pool: count for pool, count in launch.items() if count > 0}
        index = {job.job_id: job for job in state.pending}
        placements = {
            job.index: placement.nodes
            for placement in decided.placements
            if (job := index.get(placement.job_id)) is not None and job.attempt == placement.attempt
        }
        return Decision(
            launch=launch,
            release=decided.release,
            capacity=capacity,
            idle_timeouts=idle_timeouts,
            placements=placements,
        )

    def _idle_timeouts(self, state: ClusterState) -> dict[str, float]:
        """Per pool, the keep-alive policy's timeout, learnt again each 50 idle periods."""
        boots = {p.name: p.boot_time_s for p in state.pools}
        for pool, periods in state.idle_periods.items():
            ended = state.idle_periods_ended.get(pool, 0)
            if pool in self._timeouts and ended - self._periods_seen.get(pool, 0) < 50:
                continue
            self._periods_seen[pool] = ended
            reused = [x for x in periods if x is not None]
            self._timeouts[pool] = best_idle_timeout_s(
                reused, len(periods) - len(reused), boots.get(pool, 0.0),
                state.config.idle_timeout_s,
            )  # fmt: skip
        return dict(self._timeouts)

    def _demands(
        self, state: ClusterState, unavailable: frozenset[str]
    ) -> tuple[list[Demand], dict[int, CapacityClass]]:
        """What the policy is asked to place, and the deadline jobs' new capacity classes."""
        demands = []
        capacity: dict[int, CapacityClass] = {}
        spot_gpus = [
            p.gpus
            for p in state.pools
            if p.capacity is CapacityClass.SPOT and p.name not in unavailable
        ]
        for job in state.pending:
            if job.deadline_s is None:
                demands.append(job.to_demand())
                continue
            run = self.rule(job, state, any(g >= job.bundles[0] for g in spot_gpus))
            chosen = CapacityClass.ON_DEMAND if run is Run.ON_DEMAND else CapacityClass.SPOT
            if chosen is not job.capacity:
                capacity[job.index] = chosen
            # Waiting is for spot that cannot be had now: asked for as spot, as the live
            # scaler asks, it grows no pool (none is available to it) and takes only spot
            # room already free.
            demands.append(job.to_demand(chosen))
        return demands, capacity

    def _view(self, node: SimNode, state: ClusterState) -> NodeView:
        """The node as the live scaler sees it now (`policy.node_views`). A busy node past
        the settle time looks the same at every tick until its room changes, when the
        simulation drops the view, so that one is kept; an idle node's idle time and a young
        node's age change by the tick, so theirs are not."""
        pool = node.pool
        room = self._rooms.get((pool.name, node.free_gpus))
        if room is None:
            used = pool.gpus - node.free_gpus
            room = self._rooms[pool.name, node.free_gpus] = Room.model_construct(
                gpus=node.free_gpus,
                cpus=pool.cpus - used * CPUS_PER_GPU,
                memory_gb=pool.memory_gb,
                gpu_type=pool.gpu_type,
            )
        age_s = state.now_s - node.launched_s
        view = NodeView.model_construct(
            name=node.name,
            pool=pool.name,
            ready=node.ready,
            free=room,
            idle_s=0.0 if node.idle_since_s is None else state.now_s - node.idle_since_s,
            age_s=age_s,
        )
        if node.idle_since_s is None and age_s >= state.config.settle_s:
            node.view = view
        return view


def smallest_pool_for(
    bundle_gpus: int, pools: Sequence[PoolSpec], *, on_demand: bool = False
) -> PoolSpec | None:
    """The cheapest spot pool whose node holds the bundle (on-demand if there is no spot, or
    if asked)."""
    order = (
        (CapacityClass.ON_DEMAND,) if on_demand else (CapacityClass.SPOT, CapacityClass.ON_DEMAND)
    )
    for capacity in order:
        fits = [p for p in pools if p.capacity is capacity and p.gpus >= bundle_gpus]
        if fits:
            return min(fits, key=lambda p: (p.price_per_hour_usd, p.name))
    return None


NAIVE_INTERVAL_S = 10.0
"""The Kubernetes cluster autoscaler's default `--scan-interval`: the naive policy stands
for an autoscaler that adds nodes for pending pods, as that one does."""


class Naive:
    """A fixed batch per queued job: one new node per bundle of every attempt it has not yet
    launched for, ignoring free room and booting nodes; idle nodes go after the timeout."""

    name = "naive"
    watches_queue = True
    told_advice = False
    places_jobs = False
    interval_s = NAIVE_INTERVAL_S

    def __init__(self) -> None:
        self._served: dict[tuple[int, int], float] = {}
        """Attempts launched for, and when."""
        self._fell_back: set[tuple[int, int]] = set()
        """Attempts launched for again, on on-demand, after their spot never came."""

    def decide(self, state: ClusterState) -> Decision:
        launch: dict[str, int] = {}
        for job in state.pending:
            key = (job.index, job.attempt)
            served_s = self._served.get(key)
            # Launched for and still waiting past the fallback time (its spot nodes never
            # came: a stock-out): once more, on on-demand.
            fall_back = (
                served_s is not None
                and key not in self._fell_back
                and state.now_s - served_s >= state.config.any_fallback_after_s
            )
            if served_s is not None and not fall_back:
                continue
            if fall_back:
                self._fell_back.add(key)
            else:
                self._served[key] = state.now_s
            for bundle in job.bundles:
                pool = smallest_pool_for(bundle, state.pools, on_demand=fall_back)
                if pool is not None:
                    launch[pool.name] = launch.get(pool.name, 0) + 1
        release = idle_expired(state, state.config.idle_timeout_s)
        return Decision(launch=launch, release=tuple(n.name for n in release))


class Static:
    """A fixed pool sized to the trace's mean demand, never released; a preempted node is
    replaced."""

    name = "static"
    watches_queue = False
    told_advice = False
    places_jobs = False
    interval_s = NAIVE_INTERVAL_S

    def __init__(self, pool: str, nodes: int) -> None:
        self.pool = pool
        self.nodes = nodes

    @classmethod
    def for_demand(
        cls, pools: Sequence[PoolSpec], mean_gpus: float, largest_job_bundles: int
    ) -> Static:
        gpu_pools = [p for p in pools if p.gpus > 0]
        spot = [p for p in gpu_pools if p.capacity is CapacityClass.SPOT] or gpu_pools
        pool = min(spot, key=lambda p: (-p.gpus, p.price_per_hour_usd, p.name))
        return cls(pool.name, max(math.ceil(mean_gpus / pool.gpus), largest_job_bundles, 1))

    def decide(self, state: ClusterState) -> Decision:
        have = sum(1 for n in state.nodes if n.pool.name == self.pool)
        return Decision(launch={self.pool: self.nodes - have} if have < self.nodes else {})


RAY_UPSCALING_SPEED = 1.0
"""Ray's default `upscaling_speed`."""
RAY_UPSCALING_INITIAL_NUM_NODES = 5
"""Ray's `AUTOSCALER_UPSCALING_INITIAL_NUM_NODES`: pending nodes a type may always have."""
RAY_IDLE_TIMEOUT_S = 300.0
"""Ray's default `idle_timeout_minutes` (5)."""


class RayAutoscaler:
    """Ray's autoscaler (v1) decision, called from the installed ray package: the bin-pack
    residual of the queued bundles over free room on live and booting nodes, `get_nodes_for`
    with the default utilisation scorer, then Ray's per-type launch limit
    (pending ≤ max(5, upscaling_speed * running)); idle nodes go after 5 minutes. Ray knows
    no prices: node types are listed spot first, which is Ray's best case, as its scorer keeps
    the first of equally scored types."""

    name = "ray"
    watches_queue = True
    told_advice = False
    places_jobs = False
    interval_s: float

    def __init__(self) -> None:
        # Ray is imported here, not at module import: it takes a second and only this
        # policy needs it.
        from ray.autoscaler._private.constants import (  # noqa: PLC0415
            AUTOSCALER_UPDATE_INTERVAL_S,
        )
        from ray.autoscaler._private.node_provider_availability_tracker import (  # noqa: PLC0415
            NodeAvailabilitySummary,
        )
        from ray.autoscaler._private.resource_demand_scheduler import (  # noqa: PLC0415
            _default_utilization_scorer,
            get_bin_pack_residual,
            get_nodes_for,
        )

        self.interval_s = float(AUTOSCALER_UPDATE_INTERVAL_S)
        """How often Ray's autoscaler updates, from the installed package (5 s)."""
        self._residual: Callable[..., tuple[list[Any], list[Any]]] = get_bin_pack_residual
        self._nodes_for: Callable[..., tuple[dict[str, int], list[Any]]] = get_nodes_for
        self._scorer = functools.partial(
            _default_utilization_scorer,
            node_availability_summary=NodeAvailabilitySummary(node_availabilities={}),
        )

    def decide(self, state: ClusterState) -> Decision:
        release = idle_expired(state, RAY_IDLE_TIMEOUT_S)
        if not state.pending:
            return Decision(release=tuple(n.name for n in release))
        pools = sorted(state.pools, key=lambda p: p.capacity is not CapacityClass.SPOT)
        node_types: dict[str, Any] = {
            p.name: {
                "resources": {"GPU": p.gpus, "CPU": p.cpus},
                "min_workers": p.min_nodes,
                "max_workers": p.max_nodes,
            }
            for p in pools
        }
        node_types["head"] = {"resources": {"CPU": 0}, "max_workers": 0}
        gone = {n.name for n in release}
        live = [n for n in state.nodes if n.name not in gone]
        # Ray's bin packing tries every node for every bundle. A node with fewer free GPUs
        # than the smallest bundle asks holds none of them, now or after others are packed,
        # so it is left out: the residual is the same, found without scanning a thousand
        # busy nodes per bundle.
        smallest = min(b for job in state.pending for b in job.bundles)
        free = [
            {"GPU": float(n.free_gpus), "CPU": n.pool.cpus - (n.pool.gpus - n.free_gpus)}
            for n in live
            if n.free_gpus >= smallest
        ]
        existing = {p.name: 0 for p in pools} | {"head": 1}
        running = dict.fromkeys(existing, 0)
        booting = dict.fromkeys(existing, 0)
        for node in live:
            existing[node.pool.name] += 1
            (running if node.ready else booting)[node.pool.name] += 1
        requests = [
            {"GPU": float(b), "CPU": b * CPUS_PER_GPU} for job in state.pending for b in job.bundles
        ]
        residual, _ = self._residual(free, requests)
        max_to_add = sum(p.max_nodes for p in pools) + 1 - sum(existing.values())
        wanted, _ = self._nodes_for(
            node_types, existing, "head", max_to_add, residual, self._scorer
        )
        launch = {}
        for pool, count in wanted.items():
            allowed = max(
                RAY_UPSCALING_INITIAL_NUM_NODES,
                int(RAY_UPSCALING_SPEED * max(running[pool], 1)),
            )
            if min(count, allowed - booting[pool]) > 0:
                launch[pool] = min(count, allowed - booting[pool])
        return Decision(launch=launch, release=tuple(n.name for n in release))
