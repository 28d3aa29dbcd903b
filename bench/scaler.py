"""How long one scaling decision takes for a big cluster, beside Ray's own autoscaler
bin-packing on the same demand.

A deterministic snapshot: --nodes existing nodes over six pools (half of them partly busy)
and --jobs pending jobs of 1-8 GPUs, some multi-node. Ours: `services.scaler.policy.plan`.
Baseline: what Ray's autoscaler does per update, from the installed ray package:
`get_bin_pack_residual` over the free room, then `get_nodes_for` with its default
utilisation scorer, which takes minutes at full size, so the head-to-head runs at
--ray-scale of it (a tenth by default). Medians of --rounds. Ends with `name: value` lines.

    python bench/scaler.py [--jobs 10000] [--nodes 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import (
    _default_utilization_scorer,
    get_bin_pack_residual,
    get_nodes_for,
)

from services.scaler.model import Demand, NodeView, PoolSpec, ScalerConfig
from services.scaler.policy import plan
from shared.events.types import Bundle, CapacityClass

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def snapshot(jobs: int, nodes: int) -> tuple[list[PoolSpec], list[NodeView], list[Demand]]:
    rng = random.Random(7)  # noqa: S311  # a reproducible workload, not a secret
    pools = [
        PoolSpec(
            name=f"{kind}-{gpus}g",
            capacity=CapacityClass.SPOT if kind == "spot" else CapacityClass.ON_DEMAND,
            gpus=gpus,
            cpus=8.0 * gpus,
            price_per_hour_usd=gpus * (0.35 if kind == "spot" else 1.0),
            max_nodes=100_000,
        )
        for kind in ("spot", "od")
        for gpus in (1, 4, 8)
    ]
    views = []
    for i in range(nodes):
        pool = pools[i % len(pools)]
        busy = rng.randint(0, pool.gpus) if i % 2 else 0
        free = pool.shape.model_copy(
            update={"gpus": pool.gpus - busy, "cpus": pool.cpus - 8 * busy}
        )
        views.append(NodeView(name=f"n{i}", pool=pool.name, ready=True, free=free, idle_s=5.0))
    demands = [
        Demand(
            job_id=f"job-{i}",
            attempt=1,
            bundles=(Bundle(gpus=(g := rng.choice([1, 1, 1, 2, 4, 8])), cpus=float(4 * g)),)
            * rng.choice([1, 1, 1, 2, 4]),
            capacity=rng.choice(list(CapacityClass)),
            priority=rng.randint(0, 9),
            queued_at=NOW - timedelta(seconds=rng.randint(0, 3600)),
        )
        for i in range(jobs)
    ]
    return pools, views, demands


def ours(pools: list[PoolSpec], views: list[NodeView], demands: list[Demand]) -> float:
    config = ScalerConfig(budget_per_hour_usd=1e9, max_launch_per_pool=1_000_000)
    started = time.perf_counter()
    plan(pools, views, demands, config, NOW)
    return time.perf_counter() - started


def rays(pools: list[PoolSpec], views: list[NodeView], demands: list[Demand]) -> float:
    node_types: dict[str, Any] = {
        p.name: {"resources": {"GPU": p.gpus, "CPU": p.cpus}, "max_workers": p.max_nodes}
        for p in pools
    }
    node_types["head"] = {"resources": {"CPU": 0}, "max_workers": 0}
    free = [{"GPU": float(v.free.gpus), "CPU": v.free.cpus} for v in views]
    existing = {p.name: sum(1 for v in views if v.pool == p.name) for p in pools} | {"head": 1}
    requests = [{"GPU": float(b.gpus), "CPU": b.cpus} for d in demands for b in d.bundles]
    scorer = functools.partial(
        _default_utilization_scorer,
        node_availability_summary=NodeAvailabilitySummary(node_availabilities={}),
    )
    started = time.perf_counter()
    residual, _ = get_bin_pack_residual(free, requests)
    get_nodes_for(node_types, existing, "head", 1_000_000, residual, scorer)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--ray-scale",
        type=float,
        default=0.1,
        help="Ray's bin packing takes minutes at full size: compare head to head at this share",
    )
    args = parser.parse_args()
    pools, views, demands = snapshot(args.jobs, args.nodes)
    ours_s = [ours(pools, views, demands) for _ in range(args.rounds)]
    print(f"ours at {args.jobs} jobs: {', '.join(f'{t * 1000:.0f} ms' for t in ours_s)}")
    small_jobs, small_nodes = int(args.jobs * args.ray_scale), int(args.nodes * args.ray_scale)
    pools, views, demands = snapshot(small_jobs, small_nodes)
    ours_small = [ours(pools, views, demands) for _ in range(args.rounds)]
    ray_small = [rays(pools, views, demands) for _ in range(max(1, args.rounds // 2))]
    ours_ms, ray_ms = statistics.median(ours_small) * 1000, statistics.median(ray_small) * 1000
    print(f"at {small_jobs} jobs: ours {ours_ms:.0f} ms, ray {ray_ms:.0f} ms")
    print(f"jobs: {args.jobs}")
    print(f"nodes: {args.nodes}")
    print(f"decision_ms_median: {statistics.median(ours_s) * 1000:.1f}")
    print(f"small_jobs: {small_jobs}")
    print(f"small_decision_ms_median: {statistics.median(ours_small) * 1000:.1f}")
    print(f"small_ray_bin_packing_ms_median: {statistics.median(ray_small) * 1000:.1f}")


if __name__ == "__main__":
    main()
