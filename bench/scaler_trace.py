"""The scaler's policy replayed on a job trace (Microsoft's Philly, 111,549 jobs over 129
days, by default) beside three baselines: naive, static and Ray's autoscaler bin-packing.
Prints the table, then `name: value` lines and whether each of the issue's targets is met.

    python bench/scaler_trace.py [--trace FILE] [--limit N] [--policy all]
        [--preemption-rate-per-hour X] [--seed S] [--plots DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from services.scaler.simulation.replay import (
    load_pools,
    parser,
    print_table,
    run_policies,
    write_plots,
)

PHILLY = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "philly.csv"


def main() -> None:
    argv = sys.argv[1:]
    if "--trace" not in argv:
        argv = ["--trace", str(PHILLY), *argv]
    if "--policy" not in argv:
        argv = ["--policy", "all", *argv]
    args = parser().parse_args(argv)
    results = run_policies(args)
    print_table(results)
    if args.plots is not None:
        write_plots(results, args.plots)
    for r in results:
        for key, value in r.figures().items():
            if key != "policy":
                print(f"{r.policy}_{key}: {value}")
    ours = next((r for r in results if r.policy == "spotrain"), None)
    ray = next((r for r in results if r.policy == "ray"), None)
    if ours is None:
        return
    pools, _ = load_pools(args.pools)
    boot_s = max(p.boot_time_s for p in pools if p.gpus > 0)
    targets = {
        "target_utilisation_ge_90pct": ours.utilisation >= 0.90,
        "target_cost_le_1.15x_lower_bound": ours.cost_over_lower_bound <= 1.15,
        f"target_wait_p95_le_boot_plus_120s_({boot_s + 120:.0f}s)": ours.wait_p95_s <= boot_s + 120,
    }
    if ray is not None:
        targets["target_cheaper_than_ray_at_no_worse_p95_wait"] = (
            ours.cost_usd < ray.cost_usd and ours.wait_p95_s <= ray.wait_p95_s
        )
    for name, met in targets.items():
        print(f"{name}: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
