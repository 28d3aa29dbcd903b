"""Replays a GPU job trace through a discrete-event simulation of a cluster whose pools are
sized by a scaling policy (ours, `policy.plan`, unchanged; or a baseline), and reports cost,
utilisation and queue wait. No NATS, no Ray processes, no clock: deterministic given a seed.

    python -m services.scaler.simulation.replay --trace philly.csv --policy spotrain,ray [--json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
import tomllib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.policy.decision import placed_grace_s
from services.scaler.policy.keepalive import IDLE_PERIODS_KEPT
from services.scaler.simulation.baselines import (
    Naive,
    RayAutoscaler,
    Spotrain,
    Static,
    boot_overhead_s,
    deadline_wakes,
    uniform_progress_rule,
)
from services.scaler.simulation.bounds import reuse_bound_usd
from services.scaler.simulation.cluster import (
    CPUS_PER_GPU,
    ClusterState,
    SimJob,
    SimNode,
    SimPolicy,
)
from services.scaler.simulation.market import SpotMarket, markets
from services.scaler.simulation.traces import SpotTrace, TraceJob, read_trace, with_deadlines
from shared.events.types import CapacityClass
from shared.policy.deadline import SpotAdvice

POLICIES = ("spotrain", "naive", "static", "ray", "uniform-progress")
FORECAST = "spotrain-forecast"
"""Ours, told each market's forecast (`Simulation._advice`): asked for by name only."""
FORECAST_ACCURACY = 0.8

# GKE-like A100 pools. Prices are approximate us-central1 list prices, illustrative only:
# an A100 40GB on a2-highgpu on-demand at about $3.67 per GPU-hour, spot at about 30% of
# that ($1.10); a node costs its GPU count times the per-GPU price. Boot: 120 s from the
# launch request to the node being in Ray (GPU nodes with drivers take minutes on GKE).
DEFAULT_POOLS_TOML = """
[scaler]
budget_per_hour_usd = 1000000
idle_timeout_s = 300

[[pool]]
name = "a100-spot-1g"
capacity = "spot"
gpus = 1
cpus = 12
price_per_hour_usd = 1.10
boot_time_s = 120
max_nodes = 4000

[[pool]]
name = "a100-spot-2g"
capacity = "spot"
gpus = 2
cpus = 24
price_per_hour_usd = 2.20
boot_time_s = 120
max_nodes = 2000

[[pool]]
name = "a100-spot-4g"
capacity = "spot"
gpus = 4
cpus = 48
price_per_hour_usd = 4.40
boot_time_s = 120
max_nodes = 1000

[[pool]]
name = "a100-spot-8g"
capacity = "spot"
gpus = 8
cpus = 96
price_per_hour_usd = 8.80
boot_time_s = 120
max_nodes = 1000

[[pool]]
name = "a100-od-1g"
capacity = "on-demand"
gpus = 1
cpus = 12
price_per_hour_usd = 3.67
boot_time_s = 120
max_nodes = 4000

[[pool]]
name = "a100-od-8g"
capacity = "on-demand"
gpus = 8
cpus = 96
price_per_hour_usd = 29.39
boot_time_s = 120
max_nodes = 1000
"""

# Each policy decides as often as the system it stands for does live (`SimPolicy.interval_s`):
# spotrain every pass of its scaler (2 s), Ray at its autoscaler's update interval (5 s), the
# naive one at the Kubernetes cluster autoscaler's scan interval (10 s); `--interval-s` puts
# them all on one. The 129-day trace is not stepped: a tick happens only when something
# changed that a policy could act on (queued work, a node ready or lost) or a time-based
# rule falls due (idle timeout, settle time, on-demand fallback).


def load_pools(path: Path | None = None) -> tuple[list[PoolSpec], ScalerConfig]:
    """`[[pool]]` tables (the format of pools.local.toml) and an optional `[scaler]` table of
    `ScalerConfig` fields; without a file, the GKE-like default above."""
    data = tomllib.loads(DEFAULT_POOLS_TOML if path is None else path.read_text())
    pools = TypeAdapter(list[PoolSpec]).validate_python(data.get("pool", []), strict=False)
    for pool in pools:
        if pool.cpus < pool.gpus * CPUS_PER_GPU:
            raise ValueError(f"pool {pool.name}: needs at least one CPU per GPU")
    config = ScalerConfig.model_validate(
        {"budget_per_hour_usd": 1e9, "max_launch_per_pool": 1000} | data.get("scaler", {}),
        strict=False,
    )
    return pools, config


def split_bundles(gpus: int, pools: Sequence[PoolSpec]) -> tuple[int, ...]:
    """A job bigger than the largest node becomes bundles of that node's GPU count."""
    largest = max((p.gpus for p in pools), default=0)
    if gpus <= largest:
        return (gpus,)
    whole, rest = divmod(gpus, largest)
    return (largest,) * whole + ((rest,) if rest else ())


def fits_ever(bundles: tuple[int, ...], pools: Sequence[PoolSpec]) -> bool:
    """Whether the pools at their maximum size could hold the job at all."""
    slots = sorted(
        (p.gpus for p in pools if p.gpus > 0 for _ in range(min(p.max_nodes, len(bundles)))),
        reverse=True,
    )
    if len(slots) < len(bundles):
        return False
    # Largest bundle on the largest node first: bundles never exceed the largest node.
    return all(b <= s for b, s in zip(bundles, slots, strict=False))


@dataclass
class Result:
    """One policy's figures; the first seven keys are the issue's JSON."""

    policy: str
    cost_usd: float
    cost_over_lower_bound: float
    utilisation: float
    wait_p50_s: float
    wait_p95_s: float
    wait_max_s: float
    nodes_launched: int
    saving_vs_on_demand: float | None
    lower_bound_usd: float
    jobs: int
    jobs_unfinished: int
    jobs_unschedulable: int
    preempted_nodes: int
    requeued_attempts: int
    lost_gpu_hours: float
    simulated_days: float
    wall_s: float
    stockouts: int = 0
    """Launches that failed for want of spot capacity."""
    deadline_jobs: int = 0
    deadlines_refused: int = 0
    """Deadlines not even on-demand from the job's arrival could meet: refused."""
    deadline_misses: int = 0
    """Jobs with a deadline that ended after it, or never."""
    reuse_bound_usd: float = 0.0
    """What a keep-alive that knows the arrivals would pay (`bounds.reuse_bound_usd`)."""
    cost_over_reuse_bound: float = math.nan
    series: list[tuple[float, int, int]] = field(default_factory=list, repr=False)
    """(time s, provisioned GPUs, busy GPUs), sampled for the plot."""

    def figures(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "series"}


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _replayable(trace: Sequence[TraceJob], pools: Sequence[PoolSpec]) -> tuple[list[SimJob], int]:
    """The trace's jobs that the pools could ever hold, as simulated jobs; and how many
    deadlines were refused, as the platform refuses at submission a deadline that even
    on-demand from the start (a node's boot, then the run) cannot meet: those jobs run
    without one."""
    jobs: list[SimJob] = []
    refused = 0
    boot_s = boot_overhead_s(pools)
    for job in trace:
        bundles = split_bundles(job.gpus, pools)
        if job.gpus <= 0 or not fits_ever(bundles, pools):
            continue
        deadline_s = job.deadline_s
        if deadline_s is not None and deadline_s < job.arrival_s + boot_s + job.duration_s:
            deadline_s = None
            refused += 1
        jobs.append(
            SimJob(
                index=len(jobs),
                job_id=job.job_id,
                arrival_s=job.arrival_s,
                gpus=job.gpus,
                duration_s=job.duration_s,
                bundles=bundles,
                queued_s=job.arrival_s,
                deadline_s=deadline_s,
            )
        )
    return jobs, refused


# Event kinds; at one instant completions free room before boots and losses are handled.
_DONE, _READY = 0, 1
_IDLE, _SETTLE, _FALLBACK, _DEADLINE = 0, 1, 2, 3
MAX_GPUS_PER_NODE = 16


class Simulation:
    """The cluster over time. Jobs run when all their bundles are on ready nodes (best fit,
    queue order with backfill, as Ray places placement groups); nodes cost from launch to
    release; a lost spot node kills every job with a bundle on it, which queues again and
    goes on from its last checkpoint (from the start without checkpoints; all of its work
    kept when the loss came with the pool's notice); the work lost is counted. A spot pool
    may follow a market (`market.SpotMarket`): it never holds more nodes than the market's
    count, a launch past it fails (a stock-out), and a drop takes nodes back."""

    def __init__(
        self,
        trace: Sequence[TraceJob],
        policy: SimPolicy,
        pools: Sequence[PoolSpec],
        config: ScalerConfig,
        *,
        seed: int = 0,
        preemption_rate_per_hour: float = 0.0,
        preemption_group: int = 4,
        interval_s: float | None = None,
        markets: Mapping[str, tuple[SpotTrace, int]] | None = None,
        spot_notice: bool = False,
        checkpoint_every_s: float | None = None,
    ) -> None:
        """`interval_s`: decide on this grid rather than at the policy's own interval."""
        self.policy = policy
        self.pools = list(pools)
        self.by_name = {p.name: p for p in pools}
        self.config = config
        self.rng = random.Random(seed)  # noqa: S311  # a reproducible simulation, not a secret
        # Its own: telling a policy the forecast changes nothing else of the replay.
        self.advice_rng = random.Random(seed + 1)  # noqa: S311
        self.rate_per_s = preemption_rate_per_hour / 3600.0
        self.group = max(1, preemption_group)
        self.interval_s = policy.interval_s if interval_s is None else interval_s
        self.jobs, self.deadlines_refused = _replayable(trace, pools)
        self.unschedulable = len(trace) - len(self.jobs)
        self.now_s = self.jobs[0].arrival_s if self.jobs else 0.0
        self._follow(markets or {}, spot_notice=spot_notice, checkpoint_every_s=checkpoint_every_s)
        self.nodes: dict[str, SimNode] = {}
        self.sizes: dict[str, int] = dict.fromkeys(self.by_name, 0)
        """Nodes per pool, booting ones included."""
        self.idle: dict[str, SimNode] = {}
        """Ready nodes running nothing: what the idle rules look at, without a scan of every
        node at every decision."""
        self.free: list[dict[str, SimNode]] = [{} for _ in range(MAX_GPUS_PER_NODE + 1)]
        """Ready nodes by free GPUs, for best-fit placement without a scan."""
        self.queues: dict[tuple[tuple[int, ...], CapacityClass], list[tuple[float, int]]] = {}
        """Queued attempts by bundle shape and capacity class, each a heap of (queued at, job
        index). A job whose class changes is pushed into its new queue; its entry in the old
        one is stale, and skipped (`_queued`)."""
        self.pending = 0
        self.events: list[tuple[float, int, int, Any]] = []
        self.alarms: list[tuple[float, int, Any]] = []
        """When a time-based rule may fall due, each checked before it wakes a decision: an
        idle timeout (of a node still idle since then), a settle end, an on-demand fallback
        (of an attempt still queued)."""
        self.seq = 0
        self.launched = 0
        self.preempted = 0
        self.requeued = 0
        self.lost_gpu_s = 0.0
        self.cost_usd = 0.0
        self.provisioned_gpu_s = 0.0
        self.busy_gpu_s = 0.0
        self.node_gpus = 0
        self.busy_gpus = 0
        self.spot_nodes = 0
        self.next_preempt_s = math.inf
        self.dirty = False
        """Something a pending job's placement depends on changed since the last decision."""
        self.force = True
        """Decide at the next tick whatever is queued: at the start (minimum sizes) and after
        a loss (a fixed pool replaces its nodes)."""
        self.held: dict[int, list[SimNode]] = {}
        self.last_decision_s = -math.inf
        self.series: list[tuple[float, int, int]] = []
        span = (max((j.arrival_s + j.duration_s for j in self.jobs), default=0.0)) - self.now_s
        self.sample_every_s = max(span / 4000.0, 1.0)
        self._seq = 0

    def _follow(
        self,
        markets: Mapping[str, tuple[SpotTrace, int]],
        *,
        spot_notice: bool,
        checkpoint_every_s: float | None,
    ) -> None:
        """Spot pools that follow a market, and what a loss costs a job."""
        self.markets = {
            pool: SpotMarket.of(pool, trace, offset, self.now_s)
            for pool, (trace, offset) in markets.items()
        }
        self.market_changes = {p: m.next_change_s(self.now_s) for p, m in self.markets.items()}
        """Per market, when its count next changes."""
        self.spot_notice = spot_notice
        self.checkpoint_every_s = checkpoint_every_s
        self.stockouts = 0
        self.stocked_out_s: dict[str, float] = {}
        self.taken_back: dict[str, int] = dict.fromkeys(self.markets, 0)
        self.node_hours: dict[str, float] = {}
        self.idle_starts: dict[str, deque[float]] = {}
        """Per pool, when its nodes went idle, for the periods no work has ended yet."""
        self.idle_periods: dict[str, deque[float | None]] = {}
        """Per pool, the latest idle periods: work came for the node after so many seconds,
        or None when none came within the configured timeout."""
        self.idle_periods_ended: dict[str, int] = {}
        self.idle_timeouts: dict[str, float] = {}
        """Per pool, the idle timeout the policy last said it uses."""

    # -- bookkeeping -------------------------------------------------------------------

    def _push(self, at_s: float, kind: int, what: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at_s, self.seq, kind, what))

    def _alarm(self, at_s: float, kind: int, what: Any) -> None:
        self.seq += 1
        heapq.heappush(self.alarms, (at_s, self.seq, (kind, what)))

    def _alarm_live(self, kind: int, what: Any) -> bool:
        if kind == _IDLE:
            node, since_s = what
            return node.name in self.nodes and node.idle_since_s == since_s
        if kind in (_FALLBACK, _DEADLINE):
            job, attempt = what
            return job.attempt == attempt and job.started_s is None and not job.done
        return self.pending > 0  # a settle end matters only to queued work

    def _advance(self, to_s: float) -> None:
        dt = to_s - self.now_s
        if dt > 0:
            self.provisioned_gpu_s += self.node_gpus * dt
            self.busy_gpu_s += self.busy_gpus * dt
            self.now_s = to_s

    def _sample(self) -> None:
        if not self.series or self.now_s - self.series[-1][0] >= self.sample_every_s:
            self.series.append((self.now_s, self.node_gpus, self.busy_gpus))

    def _spot_changed(self, delta: int) -> None:
        self.spot_nodes += delta
        rate = self.rate_per_s * self.spot_nodes / self.group
        # Losses are memoryless, so redrawing the next one whenever the count changes is exact.
        self.next_preempt_s = self.now_s + self.rng.expovariate(rate) if rate > 0 else math.inf

    def _set_free(self, node: SimNode, gpus: int) -> None:
        if node.ready:
            self.free[node.free_gpus].pop(node.name, None)
            self.free[gpus][node.name] = node
        node.free_gpus = gpus
        node.view = None
        empty = gpus == node.pool.gpus
        if empty and node.idle_since_s is None:
            node.idle_since_s = self.now_s
            self.idle[node.name] = node
            self._alarm(self.now_s + self.config.idle_timeout_s, _IDLE, (node, self.now_s))
            learnt_s = self.idle_timeouts.get(node.pool.name)
            if learnt_s is not None and learnt_s < self.config.idle_timeout_s:
                self._alarm(self.now_s + learnt_s, _IDLE, (node, self.now_s))
            if node.placed_s is not None:
                # The live scaler keeps a node it placed on a while, however idle.
                grace_end_s = node.placed_s + placed_grace_s(self.config)
                if grace_end_s > self.now_s:
                    self._alarm(grace_end_s, _IDLE, (node, self.now_s))
            self.idle_starts.setdefault(node.pool.name, deque()).append(self.now_s)
        elif not empty:
            if node.idle_since_s is not None:
                self._demand_came(node.pool.name)
            node.idle_since_s = None
            self.idle.pop(node.name, None)

    # -- nodes -------------------------------------------------------------------------

    def _launch(self, pool: PoolSpec) -> bool:
        """Launch a node, unless its market has none to give (a stock-out)."""
        market = self.markets.get(pool.name)
        if market is not None and self.sizes[pool.name] >= market.count_at(self.now_s):
            self.stockouts += 1
            self.stocked_out_s[pool.name] = self.now_s
            self.dirty = True  # the live scaler decides again at its next pass, knowing
            return False
        self._seq += 1
        node = SimNode(
            name=f"{pool.name}-{self._seq}",
            pool=pool,
            launched_s=self.now_s,
            ready_s=self.now_s + pool.boot_time_s,
            free_gpus=pool.gpus,
        )
        self.nodes[node.name] = node
        self.sizes[pool.name] += 1
        self.launched += 1
        self.node_gpus += pool.gpus
        self._push(node.ready_s, _READY, node)
        self._alarm(self.now_s + self.config.settle_s, _SETTLE, None)
        self._demand_came(pool.name)
        if pool.capacity is CapacityClass.SPOT:
            self._spot_changed(+1)
        return True

    def _demand_came(self, pool: str) -> None:
        """Work came for a node of the pool (an idle one was taken, or one was launched):
        it ends the oldest idle period still open there, as if that node had been kept.
        What the keep-alive policy learns from, for every node and whatever the timeout
        was: how long after going idle a node would have been needed, if at all."""
        starts = self.idle_starts.get(pool)
        if not starts:
            return
        periods = self.idle_periods.setdefault(pool, deque(maxlen=IDLE_PERIODS_KEPT))
        longest_s = self.config.idle_timeout_s
        while starts and self.now_s - starts[0] > longest_s:
            starts.popleft()
            periods.append(None)  # no work for it within the longest timeout
            self.idle_periods_ended[pool] = self.idle_periods_ended.get(pool, 0) + 1
        if starts:
            periods.append(self.now_s - starts.popleft())
            self.idle_periods_ended[pool] = self.idle_periods_ended.get(pool, 0) + 1

    def _remove(self, node: SimNode) -> None:
        del self.nodes[node.name]
        self.sizes[node.pool.name] -= 1
        self.idle.pop(node.name, None)
        if node.ready:
            self.free[node.free_gpus].pop(node.name, None)
        self.node_gpus -= node.pool.gpus
        lived_h = (self.now_s - node.launched_s) / 3600
        self.cost_usd += lived_h * node.pool.price_per_hour_usd
        self.node_hours[node.pool.name] = self.node_hours.get(node.pool.name, 0.0) + lived_h
        if node.pool.capacity is CapacityClass.SPOT:
            self._spot_changed(-1)

    def _ready(self, node: SimNode) -> None:
        if node.name not in self.nodes:
            return  # lost or released while booting
        node.ready = True
        node.idle_since_s = None
        self.idle.pop(node.name, None)
        self._set_free(node, node.free_gpus)
        self.dirty = True

    def _preempt(self) -> None:
        spot = [n for n in self.nodes.values() if n.pool.capacity is CapacityClass.SPOT]
        if not spot:
            return
        pool = self.rng.choice(spot).pool  # a pool chosen in proportion to its nodes
        members = [n for n in spot if n.pool is pool]
        for node in self.rng.sample(members, min(self.group, len(members))):
            self._lose(node, notice=False)
        self.force = True

    def _lose(self, node: SimNode, *, notice: bool) -> None:
        for index in list(node.jobs):
            self._kill(self.jobs[index], notice=notice)
        self._remove(node)
        self.preempted += 1

    def _market_moves(self, at_s: float) -> None:
        """Each market whose count changed by now: nodes past the count are taken back."""
        for pool, change_s in self.market_changes.items():
            if change_s > at_s:
                continue
            market = self.markets[pool]
            self.market_changes[pool] = market.next_change_s(at_s)
            members = [n for n in self.nodes.values() if n.pool.name == pool]
            excess = len(members) - market.count_at(at_s)
            if excess > 0:
                for node in self.rng.sample(members, excess):
                    self._lose(node, notice=self.spot_notice)
                self.taken_back[pool] += excess
                self.force = True
            else:
                self.dirty = True  # room to grow again

    # -- jobs --------------------------------------------------------------------------

    def _enqueue(self, job: SimJob) -> None:
        key = (job.bundles, job.capacity)
        heapq.heappush(self.queues.setdefault(key, []), (job.queued_s, job.index))
        self.pending += 1
        self._alarm(job.queued_s + self.config.any_fallback_after_s, _FALLBACK, (job, job.attempt))
        if job.deadline_s is not None:
            # A deadline policy's answer changes when the job's slack falls to its reserve
            # and when only on-demand can still make it: each is a moment to decide.
            for wake_s in deadline_wakes(job, self.now_s, self._restart_overhead_s()):
                self._alarm(wake_s, _DEADLINE, (job, job.attempt))
        self.dirty = True

    def _try_start(self, job: SimJob) -> bool:
        taken: list[tuple[SimNode, int]] = []
        for bundle in job.bundles:
            node = self._free_node(bundle, job.capacity)
            if node is None:
                for held, gpus in reversed(taken):
                    self._set_free(held, held.free_gpus + gpus)
                return False
            self._set_free(node, node.free_gpus - bundle)
            taken.append((node, bundle))
        self._start(job, taken)
        return True

    def _start_placed(self, job: SimJob, names: tuple[str, ...]) -> None:
        """Start a queued attempt on the nodes its policy placed it on (one per bundle,
        largest first), if every one is still up with that room."""
        bundles = sorted(job.bundles, reverse=True)
        if job.started_s is not None or job.done or len(names) != len(bundles):
            return
        need: dict[str, int] = {}
        for bundle, name in zip(bundles, names, strict=True):
            need[name] = need.get(name, 0) + bundle
        nodes = [self.nodes.get(name) for name in need]
        if any(n is None or not n.ready or n.free_gpus < need[n.name] for n in nodes):
            return
        taken = [(n, need[n.name]) for n in nodes if n is not None]
        for node, gpus in taken:
            node.placed_s = self.now_s
            self._set_free(node, node.free_gpus - gpus)
        self._start(job, taken)
        self.pending -= 1
        key = (job.bundles, job.capacity)
        self._drop_stale(key, self.queues[key])

    def _start(self, job: SimJob, taken: list[tuple[SimNode, int]]) -> None:
        """The attempt runs on the room taken on these nodes."""
        for node, gpus in taken:
            node.jobs[job.index] = node.jobs.get(job.index, 0) + gpus
        self.held[job.index] = list(dict.fromkeys(node for node, _ in taken))
        job.started_s = self.now_s
        job.waited_s += self.now_s - job.queued_s
        self.busy_gpus += job.gpus
        self._push(self.now_s + job.remaining_s, _DONE, (job, job.attempt))

    def _free_node(self, gpus: int, capacity: CapacityClass) -> SimNode | None:
        """The ready node with the fewest free GPUs that has `gpus` free, of the capacity
        class the job may use."""
        for bucket in self.free[gpus : MAX_GPUS_PER_NODE + 1]:
            if not bucket:
                continue
            if capacity is CapacityClass.ANY:
                return next(iter(bucket.values()))
            for node in bucket.values():
                if node.pool.capacity is capacity:
                    return node
        return None

    def _place(self) -> None:
        """Start queued attempts in queue order; a shape that does not fit is skipped for
        the rest of the pass, so smaller ones behind it may start (backfill)."""
        heads = []
        for key, queue in self.queues.items():
            self._drop_stale(key, queue)
            if queue:
                heads.append((queue[0], key))
        heapq.heapify(heads)
        while heads:
            (_, index), key = heapq.heappop(heads)
            if not self._try_start(self.jobs[index]):
                continue
            queue = self.queues[key]
            heapq.heappop(queue)
            self.pending -= 1
            self._drop_stale(key, queue)
            if queue:
                heapq.heappush(heads, (queue[0], key))

    def _queued(self, entry: tuple[float, int], key: tuple[tuple[int, ...], CapacityClass]) -> bool:
        """Whether a queue entry is its job's current one."""
        job = self.jobs[entry[1]]
        return (
            job.started_s is None
            and not job.done
            and job.capacity is key[1]
            and job.queued_s == entry[0]
        )

    def _drop_stale(
        self, key: tuple[tuple[int, ...], CapacityClass], queue: list[tuple[float, int]]
    ) -> None:
        while queue and not self._queued(queue[0], key):
            heapq.heappop(queue)

    def _pin(self, job: SimJob, capacity: CapacityClass) -> None:
        """A queued job may from now run only on this capacity class."""
        if job.capacity is capacity or job.started_s is not None or job.done:
            return
        job.capacity = capacity
        key = (job.bundles, capacity)
        heapq.heappush(self.queues.setdefault(key, []), (job.queued_s, job.index))

    def _release_job(self, job: SimJob) -> None:
        for node in self.held.pop(job.index, []):
            gpus = node.jobs.pop(job.index, 0)
            if gpus:
                self._set_free(node, node.free_gpus + gpus)
        self.busy_gpus -= job.gpus

    def _finish(self, job: SimJob, attempt: int) -> None:
        if job.attempt != attempt or job.done:
            return  # an attempt that was killed
        self._release_job(job)
        job.done = True
        job.finished_s = self.now_s
        self.dirty = True

    def _kill(self, job: SimJob, *, notice: bool) -> None:
        assert job.started_s is not None
        ran_s = self.now_s - job.started_s
        if notice:
            kept_s = ran_s  # checkpointed on the notice
        elif self.checkpoint_every_s:
            kept_s = math.floor(ran_s / self.checkpoint_every_s) * self.checkpoint_every_s
        else:
            kept_s = 0.0
        job.saved_s += kept_s
        self.lost_gpu_s += (ran_s - kept_s) * job.gpus
        self._release_job(job)
        job.attempt += 1
        job.started_s = None
        job.queued_s = self.now_s
        self.requeued += 1
        self._enqueue(job)

    # -- the loop ----------------------------------------------------------------------

    def _restart_overhead_s(self) -> float:
        """What a start may cost a job: a node's boot, and, when a loss comes without
        notice, the work since its last checkpoint (an interval at most)."""
        lost_s = 0.0 if self.spot_notice else (self.checkpoint_every_s or 0.0)
        return boot_overhead_s(self.pools) + lost_s

    def _pending_jobs(self) -> list[SimJob]:
        entries = sorted(e for key, q in self.queues.items() for e in q if self._queued(e, key))
        return [self.jobs[i] for _, i in entries]

    def _advice(self) -> dict[str, SpotAdvice]:
        """Each market's forecast now, as Compute Engine's capacity advice gives it and
        modelled from the market's own next hour, right `FORECAST_ACCURACY` of the time:
        obtainable while the market lets one more node be held; an uptime of 60 min when
        what it lets be held now stays for the hour, else 10 min."""
        found = {}
        for pool, market in self.markets.items():
            count = market.count_at(self.now_s)
            held = self.sizes[pool]
            kept = max(1, min(count, held + 1))
            gap_s = market.trace.gap_s
            ticks = max(1, math.ceil(3600 / gap_s))
            stays = all(market.count_at(self.now_s + k * gap_s) >= kept for k in range(ticks + 1))
            if self.advice_rng.random() >= FORECAST_ACCURACY:
                stays = not stays
            found[pool] = SpotAdvice(
                obtainability=1.0 if count > held else 0.0, uptime_h=1.0 if stays else 10 / 60
            )
        return found

    def _decide(self) -> None:
        self.dirty = self.force = False
        self.last_decision_s = self.now_s
        state = ClusterState(
            now_s=self.now_s,
            pools=self.pools,
            config=self.config,
            nodes=list(self.nodes.values()),
            idle=list(self.idle.values()),
            sizes=dict(self.sizes),
            pending=self._pending_jobs(),
            stocked_out_s=dict(self.stocked_out_s),
            taken_back=dict(self.taken_back),
            advice=self._advice() if self.policy.told_advice else {},
            node_hours=dict(self.node_hours),
            idle_periods=self.idle_periods,
            idle_periods_ended=dict(self.idle_periods_ended),
            restart_overhead_s=self._restart_overhead_s(),
            decision_interval_s=self.interval_s,
        )
        decision = self.policy.decide(state)
        for index, capacity in decision.capacity.items():
            self._pin(self.jobs[index], capacity)
        for index, names in decision.placements.items():
            self._start_placed(self.jobs[index], names)
        self.idle_timeouts = decision.idle_timeouts
        for name in decision.release:
            node = self.nodes.get(name)
            if node is not None and node.ready and not node.jobs:
                self._remove(node)
        for pool_name, count in sorted(decision.launch.items()):
            pool = self.by_name[pool_name]
            have = self.sizes[pool.name]
            for _ in range(max(0, min(count, pool.max_nodes - have))):
                if not self._launch(pool):
                    break

    def _next_decision_s(self) -> float:
        if not self.policy.watches_queue:
            return self.now_s if self.force else math.inf
        while self.alarms and (
            self.alarms[0][0] <= self.last_decision_s or not self._alarm_live(*self.alarms[0][2])
        ):
            heapq.heappop(self.alarms)
        due = self.alarms[0][0] if self.alarms else math.inf
        if self.force or (self.dirty and self.pending):
            due = self.now_s
        if due == math.inf:
            return due
        return max(math.ceil(due / self.interval_s) * self.interval_s, self.now_s)

    def run(self) -> None:
        arrivals = 0
        done = 0
        total = len(self.jobs)
        # A job a policy never gets placed (a market that never has room for it) would keep
        # a market-driven replay going for ever: it stops a week past when the last job
        # would have ended twice over, and what is left counts as unfinished.
        horizon_s = max((j.arrival_s + 2 * j.duration_s for j in self.jobs), default=0.0)
        horizon_s += 7 * 86400
        while True:
            unfinished = done < total and (not self.markets or self.now_s < horizon_s)
            next_arrival = self.jobs[arrivals].arrival_s if arrivals < total else math.inf
            next_event = self.events[0][0] if self.events else math.inf
            next_decision = self._next_decision_s()
            next_loss = self.next_preempt_s if unfinished else math.inf
            next_move = min(self.market_changes.values(), default=math.inf)
            at_s = min(next_arrival, next_event, next_decision, next_loss,
                       next_move if unfinished else math.inf)  # fmt: skip
            if at_s == math.inf:
                break
            self._advance(at_s)
            while arrivals < total and self.jobs[arrivals].arrival_s <= at_s:
                self._enqueue(self.jobs[arrivals])
                arrivals += 1
            while self.events and self.events[0][0] <= at_s:
                _, _, kind, what = heapq.heappop(self.events)
                if kind == _DONE:
                    job, attempt = what
                    before = job.done
                    self._finish(job, attempt)
                    done += job.done and not before
                elif kind == _READY:
                    self._ready(what)
            if next_move <= at_s:
                self._market_moves(at_s)
            if next_loss <= at_s:
                self._preempt()
                if self.next_preempt_s <= at_s:  # no count change redrew it
                    self._spot_changed(0)
            if self.pending and not self.policy.places_jobs:
                self._place()
            if next_decision <= at_s:
                self._decide()
            self._sample()
        for node in list(self.nodes.values()):
            self._remove(node)

    def result(self, wall_s: float) -> Result:
        gpu_pools = [p for p in self.pools if p.gpus > 0]
        cheapest = min(p.price_per_hour_usd / p.gpus for p in gpu_pools)
        on_demand = [
            p.price_per_hour_usd / p.gpus
            for p in gpu_pools
            if p.capacity is CapacityClass.ON_DEMAND
        ]
        work_gpu_s = sum(j.gpus * j.duration_s for j in self.jobs)
        lower = work_gpu_s * cheapest / 3600
        reuse = reuse_bound_usd(
            ((j.arrival_s, j.duration_s, j.gpus) for j in self.jobs),
            cheapest / 3600,
            min(p.boot_time_s for p in gpu_pools),
        )
        od_cost = self.provisioned_gpu_s * min(on_demand) / 3600 if on_demand else None
        waits = [j.waited_s for j in self.jobs if j.done]
        start = self.jobs[0].arrival_s if self.jobs else 0.0
        return Result(
            policy=self.policy.name,
            cost_usd=round(self.cost_usd, 2),
            cost_over_lower_bound=round(self.cost_usd / lower, 4) if lower else math.nan,
            utilisation=round(self.busy_gpu_s / self.provisioned_gpu_s, 4)
            if self.provisioned_gpu_s
            else 0.0,
            wait_p50_s=_percentile(waits, 0.50),
            wait_p95_s=_percentile(waits, 0.95),
            wait_max_s=max(waits, default=0.0),
            nodes_launched=self.launched,
            saving_vs_on_demand=round(1 - self.cost_usd / od_cost, 4) if od_cost else None,
            lower_bound_usd=round(lower, 2),
            reuse_bound_usd=round(reuse, 2),
            cost_over_reuse_bound=round(self.cost_usd / reuse, 4) if reuse else math.nan,
            jobs=len(self.jobs),
            jobs_unfinished=sum(1 for j in self.jobs if not j.done),
            jobs_unschedulable=self.unschedulable,
            preempted_nodes=self.preempted,
            requeued_attempts=self.requeued,
            lost_gpu_hours=round(self.lost_gpu_s / 3600, 2),
            simulated_days=round((self.now_s - start) / 86400, 2),
            wall_s=round(wall_s, 2),
            stockouts=self.stockouts,
            deadline_jobs=sum(1 for j in self.jobs if j.deadline_s is not None),
            deadlines_refused=self.deadlines_refused,
            deadline_misses=sum(
                1
                for j in self.jobs
                if j.deadline_s is not None
                and (j.finished_s is None or j.finished_s > j.deadline_s + 1e-6)
            ),
            series=self.series,
        )


def make_policy(
    name: str, trace: Sequence[TraceJob], pools: Sequence[PoolSpec], config: ScalerConfig
) -> SimPolicy:
    every_s = config.pass_interval_s
    if name == "spotrain":
        return Spotrain(interval_s=every_s)
    if name == FORECAST:
        return Spotrain(name=FORECAST, told_advice=True, interval_s=every_s)
    if name == "uniform-progress":
        return Spotrain(uniform_progress_rule, name="uniform-progress", interval_s=every_s)
    if name == "naive":
        return Naive()
    if name == "ray":
        return RayAutoscaler()
    if name == "static":
        start = min((j.arrival_s for j in trace), default=0.0)
        end = max((j.arrival_s + j.duration_s for j in trace), default=0.0)
        mean = sum(j.gpus * j.duration_s for j in trace) / max(end - start, 1.0)
        bundles = max((len(split_bundles(j.gpus, pools)) for j in trace), default=1)
        return Static.for_demand(pools, mean, bundles)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


def simulate(
    trace: Sequence[TraceJob],
    policy: str,
    pools: Sequence[PoolSpec],
    config: ScalerConfig,
    *,
    seed: int = 0,
    preemption_rate_per_hour: float = 0.0,
    preemption_group: int = 4,
    interval_s: float | None = None,
    markets: Mapping[str, tuple[SpotTrace, int]] | None = None,
    spot_notice: bool = False,
    checkpoint_every_s: float | None = None,
) -> Result:
    """Replay the trace under one policy and return its figures."""
    started = time.perf_counter()
    sim = Simulation(
        trace,
        make_policy(policy, trace, pools, config),
        pools,
        config,
        seed=seed,
        preemption_rate_per_hour=preemption_rate_per_hour,
        preemption_group=preemption_group,
        interval_s=interval_s,
        markets=markets,
        spot_notice=spot_notice,
        checkpoint_every_s=checkpoint_every_s,
    )
    sim.run()
    return sim.result(time.perf_counter() - started)


def print_table(results: Sequence[Result]) -> None:
    from rich.console import Console  # noqa: PLC0415  # only the table needs rich
    from rich.table import Table  # noqa: PLC0415

    table = Table(title="trace replay")
    columns: list[tuple[str, Callable[[Result], str]]] = [
        ("policy", lambda r: r.policy),
        ("cost $", lambda r: f"{r.cost_usd:,.0f}"),
        ("cost ÷ lower bound", lambda r: f"{r.cost_over_lower_bound:.3f}"),
        ("utilisation", lambda r: f"{r.utilisation:.1%}"),
        ("wait p50 s", lambda r: f"{r.wait_p50_s:.0f}"),
        ("wait p95 s", lambda r: f"{r.wait_p95_s:.0f}"),
        ("wait max s", lambda r: f"{r.wait_max_s:.0f}"),
        ("nodes launched", lambda r: f"{r.nodes_launched:,}"),
        (
            "saving vs on-demand",
            lambda r: "-" if r.saving_vs_on_demand is None else f"{r.saving_vs_on_demand:.1%}",
        ),
        ("preempted", lambda r: f"{r.preempted_nodes:,}"),
        ("stock-outs", lambda r: f"{r.stockouts:,}"),
        ("lost GPU-h", lambda r: f"{r.lost_gpu_hours:,.0f}"),
        ("deadlines missed", lambda r: f"{r.deadline_misses:,} of {r.deadline_jobs:,}"),
        ("unfinished", lambda r: f"{r.jobs_unfinished:,}"),
        ("wall s", lambda r: f"{r.wall_s:.1f}"),
    ]
    for title, _ in columns:
        table.add_column(title, justify="left" if title == "policy" else "right")
    for r in results:
        table.add_row(*(cell(r) for _, cell in columns))
    Console(width=max(Console().width, 200)).print(table)


def write_plots(results: Sequence[Result], folder: Path) -> list[Path]:
    """One PNG per policy: GPUs provisioned and busy over simulated days."""
    import matplotlib as mpl  # noqa: PLC0415  # plots are optional: the dev extra has it

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        if not r.series:
            continue
        start = r.series[0][0]
        days = [(t - start) / 86400 for t, _, _ in r.series]
        fig, ax = plt.subplots(figsize=(12, 4))
        ax.step(days, [p for _, p, _ in r.series], where="post", label="provisioned GPUs")
        ax.step(days, [b for _, _, b in r.series], where="post", label="busy GPUs")
        ax.set_xlabel("days")
        ax.set_ylabel("GPUs")
        ax.set_title(
            f"{r.policy}: utilisation {r.utilisation:.1%}, "
            f"cost ÷ lower bound {r.cost_over_lower_bound:.2f}"
        )
        ax.legend(loc="upper right")
        path = folder / f"{r.policy}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spotrain simulate", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument("--trace", type=Path, required=True, help="CSV in the Philly trace format")
    p.add_argument(
        "--policy",
        default="spotrain",
        help=f"comma-separated, any of: {','.join(POLICIES)} (or 'all')",
    )
    p.add_argument("--pools", type=Path, help="TOML of [[pool]] tables and optional [scaler]")
    p.add_argument("--json", action="store_true", help="one JSON object per policy")
    p.add_argument("--plots", type=Path, help="folder for PNGs of provisioned vs busy GPUs")
    p.add_argument("--limit", type=int, help="replay only the first N jobs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preemption-rate-per-hour", type=float, default=0.0,
                   help="spot node losses per node-hour (0 = none)")  # fmt: skip
    p.add_argument("--preemption-group", type=int, default=4,
                   help="nodes of one pool lost together")  # fmt: skip
    p.add_argument("--interval-s", type=float,
                   help="one decision grid for all (default: each its live one)")  # fmt: skip
    p.add_argument("--spot-trace", action="append", default=[], metavar="POOL=FILE[@OFFSET]",
                   help="a spot pool follows a market trace from OFFSET (repeatable)")  # fmt: skip
    p.add_argument("--spot-notice", action="store_true",
                   help="market preemptions come with notice: jobs lose no work")  # fmt: skip
    p.add_argument("--checkpoint-every-s", type=float,
                   help="jobs checkpoint this often; a loss keeps the work up to it")  # fmt: skip
    p.add_argument("--deadline-slack", metavar="LO..HI",
                   help="a share of jobs get deadline = arrival + slack x duration")  # fmt: skip
    p.add_argument("--deadline-share", type=float, default=1 / 3,
                   help="the share of jobs with a deadline (with --deadline-slack)")  # fmt: skip
    return p


def parse_slack(value: str) -> tuple[float, float]:
    """`LO..HI` (or one number) → the slack range; each at least 1 (the job's own length)."""
    low, sep, high = value.partition("..")
    try:
        lo, hi = float(low), float(high if sep else low)
    except ValueError:
        raise ValueError(f"--deadline-slack {value!r}: expected LO..HI, e.g. 1.2..3") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"--deadline-slack {value!r}: need 1 <= LO <= HI (a job takes 1x)")
    return lo, hi


def run_policies(args: argparse.Namespace) -> list[Result]:
    names = POLICIES if args.policy == "all" else tuple(args.policy.split(","))
    for name in names:
        if name not in (*POLICIES, FORECAST):
            choices = ", ".join((*POLICIES, FORECAST))
            raise ValueError(f"unknown policy {name!r}; choose from {choices}")
    trace = read_trace(args.trace, args.limit)
    pools, config = load_pools(args.pools)
    followed = markets(args.spot_trace, pools)
    if args.deadline_slack is not None:
        if not 0 <= args.deadline_share <= 1:
            raise ValueError(f"--deadline-share must be in [0, 1], not {args.deadline_share:g}")
        low, high = parse_slack(args.deadline_slack)
        trace = with_deadlines(trace, args.deadline_share, low, high, seed=args.seed)
    return [
        simulate(
            trace,
            name,
            pools,
            config,
            seed=args.seed,
            preemption_rate_per_hour=args.preemption_rate_per_hour,
            preemption_group=args.preemption_group,
            interval_s=args.interval_s,
            markets=followed,
            spot_notice=args.spot_notice,
            checkpoint_every_s=args.checkpoint_every_s,
        )
        for name in names
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        results = run_policies(args)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as error:
        # A bad file or value is the user's to fix: one line, no traceback.
        print(f"spotrain simulate: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{"policy": r.policy} | r.figures() for r in results], indent=2))
    else:
        print_table(results)
    if args.plots is not None:
        for path in write_plots(results, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
