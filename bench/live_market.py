"""Does the live platform do what the simulator predicts? Five deadline jobs on a local stack
of their own, whose spot pool follows a real market trace at a speed-up (`spotrain up
--spot-market`), side by side with the simulator (`spotrain simulate deadline`'s model and
the same deadline policy, `shared.policy.deadline`) on the same market, from the moment each job
was submitted, with the same work, deadline, restart overhead and prices.

The market is a stretch of a real 1-node availability trace (AWS us-west-2a V100, 10-minute
ticks; see ../shared/traces/README.md); each tick with capacity has room for every job at
once, so that the jobs share one market without competing for it (the simulator runs one
job at a time). The live jobs train for real (`examples/train_digits.py`) on real `ray
start` nodes; a stock-out fails growth, a drop in the trace takes nodes back with a notice.

Cost is the bill: every node-second of the run's pools at their prices (the jobs' own share
and the nodes' boot and idle time), as the ledger has it; the simulator's is its
instance-hours at the same prices, each start paying the restart overhead. Moves are the
times a job's next start is on another kind of capacity (`spotrain demo --market`'s count).

    python bench/live_market.py [--jobs 5] [--speedup 20] [--from-tick 94] [--steps 240]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

from services.scaler.simulation.deadline import DeadlineJob, Outcome, Spotrain, run_online
from services.scaler.simulation.traces import SpotTrace, read_spot_trace
from shared.cli.market_demo import capacity_moves
from shared.client import SpotrainClient
from shared.events.types import CapacityClass
from shared.jobs import JobRecord, JobState
from shared.localstack import stack
from shared.localstack.market import MARKET_FILE, MarketConfig, load_markets
from shared.localstack.settings import isolated_stack
from shared.messaging import BusSettings
from shared.policy.cost.report import GroupBy, cost_rows
from shared.spot_traces import SpotMarketOption

ROOT = Path(__file__).parents[1]
TRACE = ROOT.parent / "shared/traces/spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json"
CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]
POOL = "gpu-spot"
SPOT_PRICE, ON_DEMAND_PRICE = 0.34, 0.85
STEP_S = 0.5
REVIEW_S = 5.0
"""The checkpointer's move review: the live platform's decisions come this often, and so do
the simulator's."""
POOLS = """
[[pool]]
name = "gpu-spot"
capacity = "spot"
gpus = 2
cpus = 2
price_per_hour_usd = {spot}
boot_time_s = 15
max_nodes = {nodes}

[[pool]]
name = "gpu-on-demand"
capacity = "on-demand"
gpus = 2
cpus = 2
price_per_hour_usd = {on_demand}
boot_time_s = 15
max_nodes = {nodes}
"""


@dataclass(frozen=True)
class Pair:
    """One job, as it ran and as the simulator saw it run."""

    record: JobRecord
    live_moves: int
    live_met: bool
    live_job_usd: Fraction
    simulated: Outcome

    @property
    def simulated_usd(self) -> float:
        return self.simulated.cost_od_hours * ON_DEMAND_PRICE


def cli(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"spotrain {' '.join(args)} failed: {result.stderr or result.stdout}")
    return result.stdout


def market_file(source: Path, from_tick: int, ticks: int, room: int, into: Path) -> Path:
    """The stretch of the trace the run follows, each tick with capacity made room for
    `room` nodes."""
    trace = read_spot_trace(source)
    counts = [room if c > 0 else 0 for c in trace.counts[from_tick : from_tick + ticks]]
    if len(counts) < ticks:
        raise SystemExit(f"{source.name} has no {ticks} ticks from tick {from_tick}")
    origin = f"{source.name}, ticks {from_tick}-{from_tick + ticks - 1}, capacity x{room}"
    into.write_text(
        json.dumps({"metadata": {"gap_seconds": trace.gap_s, "source": origin}, "data": counts})
    )
    return into


def submit(env: dict[str, str], workdir: Path, args: argparse.Namespace) -> str:
    work_s = args.steps * STEP_S
    deadline = datetime.now(UTC) + timedelta(seconds=work_s * (1 + args.slack_share))
    return cli(
        env, "submit", "train_digits.py", "--workdir", str(workdir), "--gpus", "2", "--any",
        "--deadline", deadline.isoformat(), "--estimate", f"{work_s:.0f}s",
        "--experiment", "live-market", "--max-restarts", "8",
        "--", f"--steps={args.steps}", f"--step-delay-s={STEP_S - 0.01}", "--report-every=5",
        "--checkpoint-every=10",
    ).split()[-1]  # fmt: skip


async def follow(bus: BusSettings, ids: list[str], timeout_s: float) -> list[JobRecord]:
    """The jobs' records once none is active."""
    until = time.monotonic() + timeout_s
    async with await SpotrainClient.connect(bus) as client:
        while True:
            records = [await client.job(job_id) for job_id in ids]
            done = [r for r in records if r is not None and not r.is_active]
            if len(done) == len(ids):
                return done
            if time.monotonic() > until:
                raise SystemExit(f"jobs still active after {timeout_s:.0f}s: {records}")
            await asyncio.sleep(2)


async def bill(bus: BusSettings) -> tuple[dict[str, Fraction], Fraction, dict[str, CapacityClass]]:
    """Each job's own cost, the whole bill, and each pool's capacity class."""
    async with await SpotrainClient.connect(bus) as client:
        ledger = await client.costs()
        pools = await client.pools()
    by_job = {
        r.key: r.cost_usd
        for r in cost_rows(ledger, GroupBy.JOB, "live-market")
        if r.key is not None and r.idle_pool is None
    }
    capacity = {p.pool: p.capacity for p in pools.pools} if pools else {}
    return by_job, ledger.attribution.cost_usd, capacity


def simulate(record: JobRecord, trace: SpotTrace, started: datetime, overhead_s: float) -> Outcome:
    """The simulator on the live market, in wall time, from the job's submission."""
    request = record.request
    submitted = record.attempts[0].submitted_at
    assert request.deadline is not None
    assert request.estimate_s is not None
    job = DeadlineJob(
        work_h=request.estimate_s / 3600,
        deadline_h=(request.deadline - submitted).total_seconds() / 3600,
        overhead_h=overhead_s / 3600,
        spot_price_ratio=SPOT_PRICE / ON_DEMAND_PRICE,
    )
    start_tick = round((submitted - started).total_seconds() / trace.gap_s)
    return run_online(Spotrain(job), trace, start_tick, job)


def wall_trace(config: MarketConfig, seconds: float) -> SpotTrace:
    """The market as the local provider follows it, one tick per decision."""
    market = load_markets(config)[POOL]
    ticks = int(seconds / REVIEW_S) + 1
    counts = tuple(
        market.available(config.started_at + timedelta(seconds=i * REVIEW_S)) for i in range(ticks)
    )
    return SpotTrace("live", int(REVIEW_S), counts)


def run(args: argparse.Namespace) -> tuple[list[Pair], Fraction]:
    """The jobs as they ran and as simulated, and the run's whole bill."""
    with tempfile.TemporaryDirectory() as home:
        settings = isolated_stack(Path(home) / "stack")
        pools = Path(home) / "pools.toml"
        pools.write_text(POOLS.format(spot=SPOT_PRICE, on_demand=ON_DEMAND_PRICE, nodes=args.jobs))
        env = {
            **os.environ,
            "SPOTRAIN_NATS_URL": settings.nats_url,
            "SPOTRAIN_LOCAL_HOME": str(settings.home),
            "SPOTRAIN_SCALER_POOLS_FILE": str(pools),
            "SPOTRAIN_SCALER_SETTLE_S": "0",
            "SPOTRAIN_SCALER_IDLE_TIMEOUT_S": "5",
            "SPOTRAIN_CHECKPOINTER_MOVE_REVIEW_INTERVAL_S": f"{REVIEW_S:g}",
            "SPOTRAIN_CHECKPOINTER_RESTART_OVERHEAD_S": f"{args.overhead_s:g}",
        }
        os.environ.update(env)  # the stack's services inherit it
        bus = BusSettings(nats_url=settings.nats_url)
        workdir = Path(home) / "project"
        workdir.mkdir()
        shutil.copy(ROOT / "examples/train_digits.py", workdir)
        span_s = args.stagger_s * args.jobs + args.steps * STEP_S * (1 + args.slack_share) + 120
        gap_s = read_spot_trace(args.trace).gap_s
        ticks = int(span_s * args.speedup / gap_s) + 2
        market = market_file(args.trace, args.from_tick, ticks, args.jobs, Path(home) / "m.json")
        try:
            stack.up(settings, markets=[SpotMarketOption(POOL, market, args.speedup)])
            config = MarketConfig.model_validate_json((settings.run_dir / MARKET_FILE).read_text())
            print(
                f"market: {json.loads(market.read_text())['metadata']['source']}, x{args.speedup:g}"
            )
            ids = []
            for n in range(args.jobs):
                ids.append(submit(env, workdir, args))
                print(f"{datetime.now(UTC):%H:%M:%S} submitted {ids[-1]}")
                if n < args.jobs - 1:
                    time.sleep(args.stagger_s)
            records = asyncio.run(follow(bus, ids, span_s * 2))
            time.sleep(10)  # the last nodes' release, past the idle timeout
            by_job, total, capacity = asyncio.run(bill(bus))
            trace = wall_trace(config, span_s * 2)
        finally:
            stack.down(settings)
    pairs = []
    for record in sorted(records, key=lambda r: r.attempts[0].submitted_at):
        last = record.current
        assert record.request.deadline is not None
        pairs.append(
            Pair(
                record=record,
                live_moves=capacity_moves(record, capacity),
                live_met=record.state is JobState.SUCCEEDED
                and last is not None
                and last.ended_at is not None
                and last.ended_at <= record.request.deadline,
                live_job_usd=by_job.get(record.job_id, Fraction(0)),
                simulated=simulate(record, trace, config.started_at, args.overhead_s),
            )
        )
    return pairs, total


def error_pct(live: float, simulated: float) -> float:
    return abs(live - simulated) / simulated * 100 if simulated else float("inf")


def report(pairs: list[Pair], bill_usd: Fraction, args: argparse.Namespace) -> None:
    print(f"\n{'job':<14}{'attempts':>9}{'live $':>10}{'sim $':>10}{'live moves':>12}"
          f"{'sim moves':>11}{'live met':>10}{'sim met':>9}")  # fmt: skip
    for p in pairs:
        pools = ",".join(a.pool or "-" for a in p.record.attempts)
        print(f"{p.record.job_id:<14}{len(p.record.attempts):>9}{float(p.live_job_usd):>10.5f}"
              f"{p.simulated_usd:>10.5f}{p.live_moves:>12}{p.simulated.moves:>11}"
              f"{p.live_met!s:>10}{p.simulated.met_deadline!s:>9}  {pools}")  # fmt: skip
    live_cost = float(bill_usd)
    jobs_cost = float(sum((p.live_job_usd for p in pairs), Fraction(0)))
    simulated_cost = sum(p.simulated_usd for p in pairs)
    live_moves = sum(p.live_moves for p in pairs)
    simulated_moves = sum(p.simulated.moves for p in pairs)
    on_demand = len(pairs) * (args.steps * STEP_S + args.overhead_s) / 3600 * ON_DEMAND_PRICE
    print(f"\nthe bill, live: ${live_cost:.5f} (the jobs' own share ${jobs_cost:.5f}, the "
          f"rest boot and idle); simulated ${simulated_cost:.5f}; "
          f"all on on-demand ${on_demand:.5f}")  # fmt: skip
    print(f"live_market_cost_usd: {live_cost:.5f}")
    print(f"simulated_market_cost_usd: {simulated_cost:.5f}")
    print(f"live_market_cost_error_pct: {error_pct(live_cost, simulated_cost):.1f}")
    print(f"live_market_moves: {live_moves}")
    print(f"simulated_market_moves: {simulated_moves}")
    print(f"live_market_moves_error_pct: {error_pct(live_moves, simulated_moves):.1f}")
    print(f"live_market_deadlines_met: {sum(p.live_met for p in pairs)}/{len(pairs)}")
    simulated_met = sum(p.simulated.met_deadline for p in pairs)
    print(f"simulated_market_deadlines_met: {simulated_met}/{len(pairs)}")
    print(f"on_demand_cost_usd: {on_demand:.5f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--from-tick", type=int, default=94)
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--stagger-s", type=float, default=40.0)
    parser.add_argument("--steps", type=int, default=240, help="of 0.5 s each")
    parser.add_argument("--slack-share", type=float, default=0.5, help="deadline = work x (1+S)")
    parser.add_argument("--overhead-s", type=float, default=12.0, help="a restart, as measured")
    args = parser.parse_args()
    report(*run(args), args)


if __name__ == "__main__":
    main()
