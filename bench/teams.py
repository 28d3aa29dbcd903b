"""Teams on one cluster: the Philly trace's first jobs shared by five teams whose spot
guarantees sum to the cluster (30/25/20/15/10 %), each allowed to borrow as much again,
a fifth of the jobs high priority. The platform's fair share (shared.policy.fairshare) with
checkpoint-first preemption, side by side in the same run with kill-and-restart (the
victim loses what it did since its last periodic checkpoint) and with no preemption of
running work (the baseline a queue without reclaim gives).

Per team: GPU-hours over the guarantee's, borrowed GPU-hours, GPU-hours lost, preemptions.
Then quota violations (checked independently of the policy after every step), GPU-hours
lost per mode, the p95 wait of high-priority jobs.

Then, on a local stack of its own (real NATS, real Ray nodes, examples/train_digits.py), a
team that may hold one job's GPUs: a low-priority job runs, a high-priority one of the team
arrives. Checkpoint-first preemption beside no preemption (a minimum runtime no job
reaches: the high-priority job waits for the low one to end): seconds from the request to
the high-priority job running, and the steps the victim lost. The live baseline is not a
kill: Ray's stop sends SIGTERM, on which the training contract checkpoints too, so
kill-and-restart is the simulation's. One `name: value` line per figure.

    python bench/teams.py [--limit 3000] [--gpus 400] [--no-live]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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
from shared.client import SpotrainClient, current_user
from shared.jobs import JobRecord, JobState
from shared.localstack import stack
from shared.localstack.nodes import kill_node
from shared.localstack.processes import ProcessRecord
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly.csv"
CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]
LOW_STEPS, STEP_S, CHECKPOINT_EVERY = 240, 0.15, 20


@dataclass(frozen=True)
class LivePreemption:
    mode: str
    preemption_s: float
    """From the high-priority request to that job running on Ray."""
    victim_steps_lost: int
    victim_cause: str


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"spotrain {' '.join(args)} failed: {done.stderr or done.stdout}")
    return done.stdout


async def until(client: SpotrainClient, job_id: str, ok: object, timeout_s: float) -> JobRecord:
    deadline = time.monotonic() + timeout_s
    while True:
        record = await client.job(job_id)
        if record is not None and ok(record):  # type: ignore[operator]
            return record
        if time.monotonic() > deadline:
            raise SystemExit(f"{job_id} did not get there in {timeout_s:.0f}s: {record}")
        await asyncio.sleep(0.2)


def one_preemption(
    settings: LocalStackSettings, env: dict[str, str], workdir: Path, mode: str
) -> LivePreemption:
    bus = BusSettings(nats_url=settings.nats_url)
    submit = [*("submit", "train_digits.py", "--workdir", str(workdir), "--gpus", "2", "--spot")]
    low = cli(
        env, *submit, "--priority", "2", "--experiment", f"victim-{mode}",
        "--", f"--steps={LOW_STEPS}", f"--step-delay-s={STEP_S}", "--report-every=1",
        f"--checkpoint-every={CHECKPOINT_EVERY}",
    ).split()[-1]  # fmt: skip
    print(f"{mode}: low-priority job {low}", flush=True)

    async def story() -> LivePreemption:
        async with await SpotrainClient.connect(bus) as client:
            # Past its minimum runtime, and halfway between two checkpoints: what a kill
            # loses on average.
            half = CHECKPOINT_EVERY // 2
            await until(
                client, low,
                lambda r: (a := r.current) is not None and (a.step or 0) >= 2 * CHECKPOINT_EVERY
                and (a.step or 0) % CHECKPOINT_EVERY >= half, 180,
            )  # fmt: skip
            asked = time.monotonic()
            high = cli(
                env, *submit, "--priority", "9", "--experiment", f"priority-{mode}",
                "--", "--steps=20", "--step-delay-s=0.05",
            ).split()[-1]  # fmt: skip
            await until(client, high, lambda r: r.state is JobState.RUNNING, 180)
            took = time.monotonic() - asked
            victim = await until(client, low, lambda r: not r.is_active, 300)
            await until(client, high, lambda r: not r.is_active, 120)
            lost = victim.attempts[0]
            resumed = victim.attempts[1] if len(victim.attempts) > 1 else None
            steps_lost = (lost.step or 0) - resumed.from_step if resumed is not None else 0
            return LivePreemption(
                mode=mode,
                preemption_s=took,
                victim_steps_lost=max(steps_lost, 0),
                victim_cause=lost.cause.value if lost.cause else "not preempted",
            )

    return asyncio.run(story())


def restart_submitter(settings: LocalStackSettings, min_runtime_s: float) -> None:
    record = ProcessRecord(**json.loads((settings.run_dir / "submitter.json").read_text()))
    kill_node(record)
    # The stack was started from this process: reap the killed child, or it lingers as a
    # zombie that `up` takes for a running submitter.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(record.pid, 0)
    os.environ["SPOTRAIN_MIN_RUNTIME_BEFORE_PREEMPTION_S"] = f"{min_runtime_s:g}"
    for _ in range(40):  # until the killed process has let go of its port
        try:
            stack.up(settings)
        except stack.StackError:
            time.sleep(0.5)
            continue
        return
    stack.up(settings)


def live() -> list[LivePreemption]:
    with tempfile.TemporaryDirectory() as home:
        settings = isolated_stack(Path(home) / "stack")
        teams = Path(home) / "teams.toml"
        teams.write_text(
            f'[teams.lab]\nmembers = ["{current_user()}"]\n'
            "[teams.lab.quota.spot]\nguaranteed_gpus = 2\n"
        )
        env = {
            **os.environ,
            "SPOTRAIN_NATS_URL": settings.nats_url,
            "SPOTRAIN_LOCAL_HOME": str(settings.home),
            "SPOTRAIN_TEAMS_FILE": str(teams),
            "SPOTRAIN_MIN_RUNTIME_BEFORE_PREEMPTION_S": "2",
            "SPOTRAIN_SUBMITTER_GIVE_WAY_GRACE_S": "60",
        }
        os.environ.update(env)  # the stack's services inherit it
        workdir = Path(home) / "project"
        workdir.mkdir()
        shutil.copy(ROOT / "examples/train_digits.py", workdir)
        try:
            stack.up(settings)
            runs = [one_preemption(settings, env, workdir, "checkpoint-first")]
            # The baseline: no job runs long enough to be preempted.
            restart_submitter(settings, min_runtime_s=1e9)
            runs.append(one_preemption(settings, env, workdir, "none"))
        except SystemExit:
            for name in ("submitter", "scaler", "checkpointer"):
                log = settings.log_dir / f"{name}.log"
                lines = log.read_text().splitlines()[-15:] if log.exists() else []
                print(f"--- {name}.log, last lines", *lines, sep="\n", file=sys.stderr)
            raise
        finally:
            stack.down(settings)
    return runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--limit", type=int, default=3000)
    p.add_argument("--gpus", type=int, default=400)
    p.add_argument("--no-live", action="store_true", help="the simulation only")
    p.add_argument("--live-only", action="store_true", help="the local stack's part only")
    args = p.parse_args()
    if args.live_only:
        report_live(live())
        return 0
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
    if args.no_live:
        return 0
    report_live(live())
    return 0


def report_live(runs: list[LivePreemption]) -> None:
    print()
    print(f"{'preemption':<18} {'request to running (s)':>22} {'steps lost':>11} victim")
    for run in runs:
        print(
            f"{run.mode:<18} {run.preemption_s:>22.1f} {run.victim_steps_lost:>11d} "
            f"{run.victim_cause}"
        )
    first_live, waited = runs
    print(f"priority_preemption_s: {first_live.preemption_s:.1f}")
    print(f"priority_victim_steps_lost: {first_live.victim_steps_lost}")
    print(f"priority_wait_s_no_preemption: {waited.preemption_s:.1f}")


if __name__ == "__main__":
    sys.exit(main())
