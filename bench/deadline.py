"""One job with a deadline on every real spot trace of ../shared/traces/spot, head to head:
spotrain's deadline policy, alone and told a capacity advice modelled from the trace's own
next hour (right 80% of the time: `spotrain-forecast`), against the paper's Uniform
Progress, greedy, all on-demand, and two yardsticks: the offline optimum, and the least
expected cost knowing the lengths of the run's own windows and gaps but not their order
(`renewal-optimal`, `simulation/renewal.py`: the most that learning a market's distribution
can give) (`spotrain simulate deadline`'s model).

For (work, deadline) = (24 h, 48 h), (48 h, 52 h), (48 h, 72 h), (12 h, 14 h), a restart
overhead of 0.2 h and spot at 0.3 of on-demand: at least 20 start offsets per trace, spread
evenly over the ticks where the deadline still falls inside the trace. Per policy: mean and
worst cost ÷ optimal and the share of deadlines met, per trace family and over all; the
runs where Uniform Progress cost more than all on-demand; then one `name: value` line per
figure.

    python bench/deadline.py [--offsets 20] [--traces DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from services.scaler.simulation.deadline import (
    FORECAST,
    POLICIES,
    RENEWAL,
    DeadlineJob,
    check,
    run,
)
from services.scaler.simulation.traces import SpotTrace, read_spot_trace

CASES = ((24.0, 48.0), (48.0, 52.0), (48.0, 72.0), (12.0, 14.0))
OVERHEAD_H = 0.2
SPOT_PRICE_RATIO = 0.3
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "spot"
NAMES = (*POLICIES[:1], FORECAST, *POLICIES[1:-1], RENEWAL, POLICIES[-1])
"""The platform's policy, then the same told a capacity advice modelled from the trace's
next hour (right 80% of the time), then the others, then the two yardsticks."""


def offsets(trace: SpotTrace, deadline_h: float, count: int) -> list[int]:
    """`count` start ticks spread evenly over those whose deadline falls inside the trace."""
    last = len(trace.counts) - int(deadline_h * 3600 / trace.gap_s + 0.999999)
    if last < 0:
        return []
    if last < count:
        return list(range(last + 1))
    if count == 1:
        return [0]
    return sorted({round(i * last / (count - 1)) for i in range(count)})


def _one_trace(
    job: tuple[Path, Path, int],
) -> tuple[str, list[dict[str, tuple[float, bool]]]]:
    """Every case and offset of one trace: per run, each policy's cost and whether it met."""
    path, root, count = job
    trace = read_spot_trace(path)
    family = str(path.parent.relative_to(root))
    results: list[dict[str, tuple[float, bool]]] = []
    if max(trace.counts) == 0:
        return family, results  # never any spot: nothing to compare
    for work_h, deadline_h in CASES:
        case = DeadlineJob(work_h, deadline_h, OVERHEAD_H, SPOT_PRICE_RATIO)
        for start in offsets(trace, deadline_h, count):
            check(trace, start, case)
            outcomes = {name: run(name, trace, start, case) for name in NAMES}
            results.append({n: (o.cost_od_hours, o.met_deadline) for n, o in outcomes.items()})
    print(f"  {path.relative_to(root)} done", file=sys.stderr)
    return family, results


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--offsets", type=int, default=20)
    p.add_argument("--traces", type=Path, default=TRACES)
    args = p.parse_args()
    files = sorted(args.traces.rglob("*.json"))
    if not files:
        print(f"no traces under {args.traces}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    # (family, policy) -> ratios to optimal, and deadlines met; one trace per worker.
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    met: dict[tuple[str, str], list[bool]] = defaultdict(list)
    up_over_od: dict[str, int] = defaultdict(int)
    runs: dict[str, int] = defaultdict(int)
    jobs = [(path, args.traces, args.offsets) for path in files]
    with multiprocessing.Pool(min(len(jobs), os.cpu_count() or 1)) as pool:
        for family, outcomes_by_run in pool.imap_unordered(_one_trace, jobs):
            for outcomes in outcomes_by_run:
                best = outcomes["optimal"][0]
                runs[family] += 1
                up_over_od[family] += outcomes["uniform-progress"][0] > outcomes["on-demand"][0]
                for name, (cost, deadline_met) in outcomes.items():
                    for key in ((family, name), ("all", name)):
                        met[key].append(deadline_met)
                        ratios[key].append(cost / best)
    families = [*sorted({f for f, _ in ratios if f != "all"}), "all"]
    header = f"{'family':<34}" + "".join(f"{n:>18}" for n in NAMES)
    print("mean cost ÷ optimal (worst), deadlines met")
    print(header)
    for family in families:
        cells = []
        for name in NAMES:
            values = ratios[family, name]
            share = sum(met[family, name]) / len(met[family, name])
            cells.append(f"{statistics.fmean(values):.3f} ({max(values):.2f}) {share:.0%}")
        print(f"{family:<34}" + "".join(f"{c:>18}" for c in cells))
    print()
    print("runs where uniform-progress cost more than all on-demand:")
    for family in families[:-1]:
        print(f"  {family:<34} {up_over_od[family]} of {runs[family]}")
    beaten = [
        f
        for f in families[:-1]
        if statistics.fmean(ratios[f, "spotrain"])
        >= min(
            statistics.fmean(ratios[f, "uniform-progress"]), statistics.fmean(ratios[f, "greedy"])
        )
    ]
    print(f"families where spotrain is not cheaper than both: {beaten or 'none'}")
    print(f"runs: {sum(runs.values())}, {time.perf_counter() - started:.0f} s")
    print()
    for name in NAMES:
        label = name.replace("-", "_")
        values = ratios["all", name]
        share = 100 * sum(met["all", name]) / len(met["all", name])
        print(f"deadline_met_pct_{label}: {share:.1f}")
        print(f"deadline_cost_over_optimal_mean_{label}: {statistics.fmean(values):.4f}")
        print(f"deadline_cost_over_optimal_worst_{label}: {max(values):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
