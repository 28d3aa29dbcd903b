"""The scaler's metrics: pools, queue and budget from each reconcile pass, resize decisions
and node lifetimes as they happen, and cost accrued from the cost meter. Names and meaning:
docs/metrics.md."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter

from services.scaler.model import Demand, PoolSpec, Reason
from shared.events.data import ReleaseReason
from shared.policy.cost import CostRow, Ledger
from shared.pools import PoolsStatus
from shared.runtime.metrics import GaugeSpec, register_snapshot

POOL = ("pool", "capacity")

POOL_NODES = GaugeSpec("spotrain_pool_nodes", "Nodes in the pool, booting or ready.", POOL)
POOL_NODES_READY = GaugeSpec("spotrain_pool_nodes_ready", "Nodes registered in Ray.", POOL)
POOL_TARGET = GaugeSpec(
    "spotrain_pool_target_nodes", "The pool size the last reconcile pass decided.", POOL
)
POOL_MAX = GaugeSpec("spotrain_pool_max_nodes", "The pool's configured ceiling.", POOL)
POOL_GPUS = GaugeSpec("spotrain_pool_gpus", "GPUs provisioned in the pool.", POOL)
POOL_GPUS_ALLOCATED = GaugeSpec(
    "spotrain_pool_gpus_allocated", "GPUs of the pool that Ray has handed to jobs.", POOL
)
POOL_PENDING_JOBS = GaugeSpec(
    "spotrain_pool_pending_jobs", "Queued attempts this pool could serve.", POOL
)
POOL_PENDING_GPUS = GaugeSpec(
    "spotrain_pool_pending_gpus", "GPUs of the queued attempts this pool could serve.", POOL
)
POOL_PRICE = GaugeSpec("spotrain_pool_price_per_hour_usd", "A node's price per hour.", POOL)
QUEUE_JOBS = GaugeSpec("spotrain_queue_jobs", "Attempts waiting for capacity.")
QUEUE_GPUS = GaugeSpec("spotrain_queue_gpus", "GPUs of the attempts waiting for capacity.")
BLOCKED_JOBS = GaugeSpec(
    "spotrain_blocked_jobs", "Attempts no pool can serve now (budget, ceiling, shape)."
)
COST_PER_HOUR = GaugeSpec("spotrain_cost_per_hour_usd", "What the nodes up now cost per hour.")
BUDGET_PER_HOUR = GaugeSpec("spotrain_budget_per_hour_usd", "The configured budget per hour.")

PASS_SPECS = (
    POOL_NODES,
    POOL_NODES_READY,
    POOL_TARGET,
    POOL_MAX,
    POOL_GPUS,
    POOL_GPUS_ALLOCATED,
    POOL_PENDING_JOBS,
    POOL_PENDING_GPUS,
    POOL_PRICE,
    QUEUE_JOBS,
    QUEUE_GPUS,
    BLOCKED_JOBS,
    COST_PER_HOUR,
    BUDGET_PER_HOUR,
)

SPENT = ("experiment", "pool")
COST = GaugeSpec("spotrain_cost_usd", "Cost accrued since the first event on the bus.", SPENT)
WASTE = GaugeSpec("spotrain_waste_usd", "The part of the cost lost to preemptions.", SPENT)
SAVING = GaugeSpec(
    "spotrain_saving_vs_on_demand_usd", "What on-demand capacity would have cost more.", SPENT
)
GPU_HOURS = GaugeSpec("spotrain_gpu_hours", "GPU-hours held.", SPENT)
COST_SPECS = (COST, WASTE, SAVING, GPU_HOURS)

IDLE = "(idle)"
NO_EXPERIMENT = "(none)"

RESIZES = Counter(
    "spotrain_pool_resizes_total",
    "Resizes the scaler asked of the provider, by pool, direction and reason.",
    ["pool", "direction", "reason"],
)
PLACEMENTS = Counter(
    "spotrain_placements_total",
    "Queued attempts placed on nodes' room and handed to the submitter, by pool.",
    ["pool"],
)
RESIZE_FAILURES = Counter(
    "spotrain_pool_resize_failures_total", "Resizes the provider refused.", ["pool"]
)
NODES_LAUNCHED = Counter(
    "spotrain_nodes_launched_total", "Nodes that began to be billed.", ["pool", "capacity"]
)
NODES_RELEASED = Counter(
    "spotrain_nodes_released_total", "Nodes that stopped being billed.", ["pool", "reason"]
)

PASS = register_snapshot(PASS_SPECS)
COSTS = register_snapshot(COST_SPECS)

Samples = dict[GaugeSpec, list[tuple[Sequence[str], float]]]


def declare_pools(pools: Sequence[PoolSpec]) -> None:
    """Every pool's counters from 0 at start, so that "no failure yet" reads as 0, not as a
    missing series (which `increase()` and alerts cannot tell from a scrape gap)."""
    for pool in pools:
        RESIZE_FAILURES.labels(pool.name)
        NODES_LAUNCHED.labels(pool.name, pool.capacity.value)
        for released in ReleaseReason:
            NODES_RELEASED.labels(pool.name, released.value)
        for direction, reason in (
            ("up", Reason.PENDING_DEMAND),
            ("up", Reason.BELOW_MIN),
            ("down", Reason.IDLE),
        ):
            RESIZES.labels(pool.name, direction, reason.value)


def pass_samples(status: PoolsStatus, demands: Sequence[Demand]) -> Samples:
    """What one reconcile pass saw. A demand several pools could serve counts once in the
    queue, and in each of those pools' pending figures."""
    samples: Samples = {spec: [] for spec in PASS_SPECS}
    for pool in status.pools:
        labels = (pool.pool, pool.capacity.value)
        for spec, value in (
            (POOL_NODES, pool.nodes),
            (POOL_NODES_READY, pool.ready),
            (POOL_TARGET, pool.target),
            (POOL_MAX, pool.max_nodes),
            (POOL_GPUS, pool.gpus_total),
            (POOL_GPUS_ALLOCATED, max(pool.gpus_total - pool.gpus_free, 0)),
            (POOL_PENDING_JOBS, pool.pending_jobs),
            (POOL_PENDING_GPUS, pool.pending_gpus),
            (POOL_PRICE, pool.price_per_hour_usd),
        ):
            samples[spec].append((labels, float(value)))
    samples[QUEUE_JOBS].append(((), float(len(demands))))
    samples[QUEUE_GPUS].append(((), float(sum(b.gpus for d in demands for b in d.bundles))))
    samples[BLOCKED_JOBS].append(((), float(status.blocked_jobs)))
    samples[COST_PER_HOUR].append(((), status.cost_per_hour_usd))
    samples[BUDGET_PER_HOUR].append(((), status.budget_per_hour_usd))
    return samples


def cost_samples(ledger: Ledger) -> Samples:
    """Cost accrued by experiment and pool, attributed as `spotrain cost` does; idle
    capacity is an experiment of its own, so a pool's figures add up to its bill."""
    experiment_of = {
        job_id: info.experiment or NO_EXPERIMENT for job_id, info in ledger.inputs.jobs.items()
    }
    rows: dict[tuple[str, str], CostRow] = {}
    for charge in ledger.attribution.charges:
        if charge.job_id is None:
            experiment = IDLE
        else:
            experiment = experiment_of.get(charge.job_id, NO_EXPERIMENT)
        key = (experiment, charge.pool)
        rows[key] = rows.get(key, CostRow(key=experiment)).plus(charge)
    samples: Samples = {spec: [] for spec in COST_SPECS}
    for labels, row in sorted(rows.items()):
        samples[COST].append((labels, float(row.cost_usd)))
        samples[WASTE].append((labels, float(row.waste_usd)))
        samples[SAVING].append((labels, float(row.saving_vs_on_demand_usd)))
        samples[GPU_HOURS].append((labels, float(row.gpu_hours)))
    return samples
