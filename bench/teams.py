"""Teams on one cluster: the Philly trace's first jobs shared by five teams whose spot
guarantees sum to the cluster (30/25/20/15/10 %), each allowed to borrow as much again,
a fifth of the jobs high priority. The platform's fair share (shared.fairshare) with
checkpoint-first preemption, side by side in the same run with kill-and-restart (the
victim loses what it did since its last periodic checkpoint) and with no preemption of
running work (the baseline a queue without reclaim gives).

Per team: GPU-hours over the guarantee's, borrowed GPU-hours, GPU-hours lost, preemptions.
Then quota violations (checked independently of the policy after every step), GPU-hours
lost per mode, the p95 wait of high-priority jobs; one `name: value` line per figure.

    python bench/teams.py [--limit 3000] [--gpus 400] [--trace ../shared/traces/philly.csv]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from services.scaler.simulation.teams import (
    WEIGHTS,
    Knobs,
    Preemption,
    assign_teams,
    print_table,
    simulate_teams,
    split_cluster,
)
from services.scaler.simulation.traces import read_trace

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "philly.csv"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--limit", type=int, default=3000)
    p.add_argument("--gpus", type=int, default=400)
    args = p.parse_args()
    trace = read_trace(args.trace, limit=args.limit)
    teams = split_cluster(args.gpus, WEIGHTS, borrow=1.0)
    jobs = assign_teams(trace, len(WEIGHTS))
    knobs = Knobs()
    print(
        f"{len(jobs)} jobs of {args.trace.name}, {args.gpus} GPUs shared by {len(WEIGHTS)} "
        f"teams; periodic checkpoint every {knobs.checkpoint_interval_s:.0f} s, a "
        f"checkpoint-first stop costs half a {knobs.step_s:.0f} s step and a "
        f"{knobs.checkpoint_write_s:.0f} s write, minimum runtime {knobs.min_runtime_s:.0f} s"
    )
    outcomes = []
    for mode in (Preemption.CHECKPOINT_FIRST, Preemption.KILL, Preemption.NONE):
        began = time.perf_counter()
        outcomes.append(simulate_teams(jobs, teams, mode, knobs))
        print(f"  {mode.value}: simulated in {time.perf_counter() - began:.1f} s")
    print_table(outcomes)
    first, kill, none = outcomes
    ratio = first.lost_gpu_hours / kill.lost_gpu_hours if kill.lost_gpu_hours else 0.0
    print(f"checkpoint-first loses {ratio:.2%} of what kill-and-restart loses (goal: <= 1%)")
    print(f"teams_quota_violations: {first.quota_violations}")
    print(f"teams_quota_violations_kill: {kill.quota_violations}")
    print(f"teams_lost_gpu_hours_checkpoint_first: {first.lost_gpu_hours:.2f}")
    print(f"teams_lost_gpu_hours_kill: {kill.lost_gpu_hours:.2f}")
    print(f"teams_lost_ratio_pct: {ratio * 100:.2f}")
    print(f"teams_high_priority_wait_p95_h: {first.high_priority_wait_p95_s / 3600:.3f}")
    print(
        f"teams_high_priority_wait_p95_h_no_preemption: {none.high_priority_wait_p95_s / 3600:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
