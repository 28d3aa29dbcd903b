"""`spotrain demo --market`: a deadline job rides a stock-out of the local spot market
(`spotrain up --spot-market`). On spot until the market runs dry, its node is taken back
with a notice; its deadline cannot wait for spot, so it goes on on-demand; once the market
has capacity again the platform asks for spot room, and moves it back to spot from its
checkpoint. It ends before its deadline, for less than on-demand would have cost.

It prints the story with timings, then one `name: value` line per figure.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

from rich.console import Console

from shared.cli.console import CliError
from shared.cli.demo import SCRIPT, Story, connect_to_stack, submit_accepted, within
from shared.client import SpotrainClient
from shared.events import new_event_id
from shared.events.data import (
    JobFailed,
    JobMoveRequested,
    JobRequested,
    JobResumed,
    JobStarted,
)
from shared.events.types import Bundle, CapacityClass
from shared.jobs import JobRecord, JobState
from shared.localstack.market import (
    MARKET_FILE,
    LocalMarket,
    MarketConfig,
    StockOut,
    load_markets,
    next_stock_out,
)
from shared.localstack.settings import LocalStackSettings
from shared.policy.cost.report import GroupBy, cost_rows

POOL = "gpu-spot"
STEP_S = 0.5
BOOT_S = 10.0
"""About how long a local spot node takes to launch and start the job."""
WORK_LEFT_AT_STOCK_OUT_S = 200.0
SLACK_AT_STOCK_OUT_S = 44.0
"""What the deadline leaves to spare when the market runs dry. Below the reserve the
deadline policy keeps (a fifth of the work left, and a restart: 50 s), so the job cannot
wait for spot and takes on-demand; above the three restarts (about 10 s each here) that
going back to spot, and to on-demand again were spot to go, would cost: so it goes back."""
MIN_ON_SPOT_S = 20.0
"""The least time on spot before the stock-out, for a first stretch worth the name."""
START_HINT = "spotrain down && spotrain up --spot-market gpu-spot=examples/spot-stock-out.json,20"


@dataclass(frozen=True)
class RidePlan:
    """The job that rides a stock-out: how long it trains and by when it must end."""

    stock_out: StockOut
    steps: int
    deadline: datetime

    @property
    def work_s(self) -> float:
        return self.steps * STEP_S


def plan_ride(market: LocalMarket, now: datetime) -> RidePlan | None:
    """A job that reaches the market's next stock-out after some time on spot, with
    `WORK_LEFT_AT_STOCK_OUT_S` left then and a deadline `SLACK_AT_STOCK_OUT_S` beyond that;
    None if the trace has no stock-out soon, or one too long to come back from before the
    job ends. Pure."""
    stock_out = next_stock_out(
        market, now + timedelta(seconds=BOOT_S + MIN_ON_SPOT_S), within_s=600
    )
    if stock_out is None:
        return None
    dry_s = (stock_out.wet_from - stock_out.dry_from).total_seconds()
    if dry_s > WORK_LEFT_AT_STOCK_OUT_S / 2:
        return None
    on_spot_s = (stock_out.dry_from - now).total_seconds() - BOOT_S
    steps = math.ceil((on_spot_s + WORK_LEFT_AT_STOCK_OUT_S) / STEP_S)
    deadline = stock_out.dry_from + timedelta(
        seconds=WORK_LEFT_AT_STOCK_OUT_S + SLACK_AT_STOCK_OUT_S
    )
    return RidePlan(stock_out=stock_out, steps=steps, deadline=deadline)


@dataclass(frozen=True)
class RideFigures:
    deadline_met: bool
    capacity_moves: int
    cost_over_on_demand: float
    steps_lost: int


def capacity_moves(record: JobRecord, capacity_of_pool: dict[str, CapacityClass]) -> int:
    """How many times the job's attempts changed capacity class, attempt to attempt."""
    classes = [capacity_of_pool.get(a.pool) for a in record.attempts if a.pool is not None]
    return sum(1 for a, b in itertools.pairwise(classes) if a != b)


async def run_market_demo(out: Console, *, workdir: Path, timeout_s: float) -> RideFigures:
    if not (workdir / SCRIPT).is_file():
        msg = f"{workdir / SCRIPT} not found; run the demo from the project root or pass --workdir"
        raise CliError(msg)
    settings = LocalStackSettings()
    market = _market(settings)
    now = datetime.now(UTC)
    plan = plan_ride(market, now)
    if plan is None:
        msg = f"the {POOL} market has no stock-out the demo can ride soon; start it with: "
        raise CliError(msg + START_HINT)
    async with await connect_to_stack(START_HINT) as client:
        job_id = f"market-{new_event_id()[:8]}"
        request = JobRequested(
            job_id=job_id,
            owner="demo",
            experiment="market-demo",
            entrypoint=(
                "python",
                SCRIPT,
                f"--steps={plan.steps}",
                f"--step-delay-s={STEP_S - 0.01}",
                "--report-every=5",
                "--checkpoint-every=10",
            ),
            working_dir=await client.upload_workspace(workdir, owner="demo"),
            worker=Bundle(gpus=2, cpus=1),
            capacity=CapacityClass.ANY,
            deadline=plan.deadline,
            estimate_s=math.ceil(plan.work_s),
        )
        story = Story(out)
        await submit_accepted(client, request)
        dry_in = (plan.stock_out.dry_from - now).total_seconds()
        dry_for = (plan.stock_out.wet_from - plan.stock_out.dry_from).total_seconds()
        story.say(
            f"submitted {job_id}: {plan.steps} steps (~{plan.work_s:.0f}s), any capacity, "
            f"deadline in {(plan.deadline - now).total_seconds():.0f}s; the {POOL} market runs "
            f"dry in {dry_in:.0f}s for {dry_for:.0f}s"
        )
        await within(_follow(client, job_id, story), job_id, timeout_s)
        record = await client.job(job_id)
        status = await client.pools()
        ledger = await client.costs()
    if record is None or status is None:
        raise CliError(f"{job_id} is not on record")
    last = record.current
    rows = [r for r in cost_rows(ledger, GroupBy.JOB, "market-demo") if r.key == job_id]
    on_demand = sum((r.on_demand_usd for r in rows), Fraction(0))
    cost = sum((r.cost_usd for r in rows), Fraction(0))
    figures = RideFigures(
        deadline_met=record.state is JobState.SUCCEEDED
        and last is not None
        and last.ended_at is not None
        and last.ended_at <= plan.deadline,
        capacity_moves=capacity_moves(record, {p.pool: p.capacity for p in status.pools}),
        cost_over_on_demand=float(cost / on_demand) if on_demand else math.nan,
        steps_lost=sum(resumed.steps_lost for resumed, _ in story.resumes),
    )
    out.print(f"market_deadline_met: {str(figures.deadline_met).lower()}")
    out.print(f"market_capacity_moves: {figures.capacity_moves}")
    out.print(f"market_cost_over_on_demand: {figures.cost_over_on_demand:.3f}")
    out.print(f"market_steps_lost: {figures.steps_lost}")
    return figures


def _market(settings: LocalStackSettings) -> LocalMarket:
    path = settings.run_dir / MARKET_FILE
    try:
        config = MarketConfig.model_validate_json(path.read_text())
    except OSError:
        raise CliError(f"the stack has no spot market; start it with one: {START_HINT}") from None
    markets = load_markets(config)
    if POOL not in markets:
        raise CliError(f"the stack's spot market is not {POOL}'s; start it with: {START_HINT}")
    return markets[POOL]


async def _follow(client: SpotrainClient, job_id: str, story: Story) -> None:
    async with contextlib.aclosing(client.follow(job_id)) as events:
        async for event in events:
            data = event.data
            match data:
                case JobStarted(attempt=attempt, pool=pool):
                    story.say(f"attempt {attempt} started on {pool or 'a node'}")
                case JobMoveRequested(capacity=capacity, reason=reason):
                    story.say(f"{reason.value}: spot room asked for, to move to {capacity.value}")
                case JobResumed(moved=moved) if moved is not None:
                    story.resumes.append((data, event.time))
                    story.say(
                        f"moved ({moved.value}) as attempt {data.attempt} to {data.capacity.value}"
                        f" from step {data.from_step} ({data.steps_lost} steps lost)"
                    )
                case JobFailed(message=message):
                    raise CliError(f"{job_id} failed: {message.strip().splitlines()[-1]}")
                case _:
                    story.tell(event)
