"""The scaler's policy replayed on a job trace (Microsoft's Philly, 111,549 jobs over 129
days, by default) beside three baselines: naive, static and Ray's autoscaler bin-packing.
Prints the table, then `name: value` lines and whether each of the issue's targets is met.

Then a bursty trace of short jobs: Philly's 1-GPU jobs under an hour over its first 20
days (24,129 jobs arriving in bursts), where the idle tail after each job and the boot
before it dominate; spotrain (its idle timeout learnt per pool, `policy.keepalive`) beside
naive and Ray, with `bursty_*` lines.

Then the trace families drawn from published distributions (`simulation/families.py`:
Philly, Alibaba PAI and SenseTime Helios job shapes; steady, diurnal and weekly arrivals with
a Monday surge and sweeps), each with `<family>_cost_over_lower_bound_<policy>`,
`_cost_over_reuse_bound_`, `_utilisation_`, `_wait_p95_s_`, and the floor no keep-alive can
go under (`<family>_reuse_bound_over_lower_bound`: every start pays a boot unless a GPU
freed within a boot before).

    python bench/scaler_trace.py [--trace FILE] [--limit N] [--policy all]
        [--preemption-rate-per-hour X] [--seed S] [--plots DIR] [--bursty-only]
        [--families-only]
"""

from __future__ import annotations

import sys
from pathlib import Path

from services.scaler.simulation.families import FAMILIES, describe, generate
from services.scaler.simulation.replay import (
    load_pools,
    parser,
    print_table,
    run_policies,
    simulate,
    write_plots,
)
from services.scaler.simulation.traces import TraceJob, read_trace

PHILLY = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "philly.csv"


BURSTY_DAYS = 20


def bursty_trace(philly: Path) -> list[TraceJob]:
    """Philly's 1-GPU jobs under an hour, over the first days of the trace."""
    short = [j for j in read_trace(philly) if j.gpus == 1 and j.duration_s < 3600]
    start = short[0].arrival_s
    return [j for j in short if j.arrival_s < start + BURSTY_DAYS * 86400]


def bursty() -> None:
    trace = bursty_trace(PHILLY)
    pools, config = load_pools(None)
    results = [simulate(trace, name, pools, config) for name in ("spotrain", "naive", "ray")]
    print(f"bursty: {len(trace)} short 1-GPU jobs over {BURSTY_DAYS} days")
    print_table(results)
    for r in results:
        print(f"bursty_cost_over_lower_bound_{r.policy}: {r.cost_over_lower_bound}")
        print(f"bursty_cost_over_reuse_bound_{r.policy}: {r.cost_over_reuse_bound}")
        print(f"bursty_utilisation_{r.policy}: {r.utilisation}")
        print(f"bursty_wait_p95_s_{r.policy}: {r.wait_p95_s}")
        print(f"bursty_wait_p50_s_{r.policy}: {r.wait_p50_s}")
    ours, others = results[0], results[1:]
    targets = {
        "bursty_target_cost_le_1.15x_lower_bound": ours.cost_over_lower_bound <= 1.15,
        "bursty_target_utilisation_ge_90pct": ours.utilisation >= 0.90,
        "bursty_target_cheaper_than_naive_and_ray": all(ours.cost_usd < o.cost_usd for o in others),
        "bursty_target_p95_wait_no_worse": all(ours.wait_p95_s <= o.wait_p95_s for o in others),
    }
    for name, met in targets.items():
        print(f"{name}: {'met' if met else 'NOT met'}")


def families() -> None:
    """Every family under spotrain, naive and Ray, with the issue's targets per family."""
    pools, config = load_pools(None)
    for chosen in FAMILIES:
        trace = generate(chosen)
        shape = describe(trace)
        results = [simulate(trace, name, pools, config) for name in ("spotrain", "naive", "ray")]
        print(
            f"{chosen.name}: {len(trace)} jobs over {chosen.days} days "
            f"(median {shape['duration_p50_s']:.0f} s, {shape['one_gpu_share']:.0%} on 1 GPU, "
            f"{shape['mean_busy_gpus']:.0f} GPUs busy on average)"
        )
        print_table(results)
        ours, others = results[0], results[1:]
        floor = ours.reuse_bound_usd / ours.lower_bound_usd
        print(f"{chosen.name}_reuse_bound_over_lower_bound: {floor:.4f}")
        for r in results:
            print(f"{chosen.name}_cost_over_lower_bound_{r.policy}: {r.cost_over_lower_bound}")
            print(f"{chosen.name}_cost_over_reuse_bound_{r.policy}: {r.cost_over_reuse_bound}")
            print(f"{chosen.name}_utilisation_{r.policy}: {r.utilisation}")
            print(f"{chosen.name}_wait_p95_s_{r.policy}: {r.wait_p95_s:.1f}")
        targets = {
            "cost_le_1.15x_lower_bound": ours.cost_over_lower_bound <= 1.15,
            "utilisation_ge_90pct": ours.utilisation >= 0.90,
            "p95_wait_no_worse": all(ours.wait_p95_s <= o.wait_p95_s for o in others),
        }
        for name, met in targets.items():
            print(f"{chosen.name}_target_{name}: {'met' if met else 'NOT met'}")


def main() -> None:
    argv = sys.argv[1:]
    if "--bursty-only" in argv:
        bursty()
        return
    if "--families-only" in argv:
        families()
        return
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
    bursty()
    families()


if __name__ == "__main__":
    main()
