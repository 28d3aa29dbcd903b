"""A deadline job rides a local spot market's stock-out (`spotrain up --spot-market`): on
spot, its node is taken back with a notice when the trace's count drops; growth fails while
the market is dry, and the deadline policy sends it to on-demand; once capacity returns the
platform asks for spot room, moves the job back to spot from its checkpoint, and the job
ends before its deadline for less than on-demand would have cost. Real `ray start` nodes,
real training (`examples/train_digits.py`), the real services."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.client import SpotrainClient
from shared.events import decode, subjects_for
from shared.events.data import (
    InterruptionCause,
    JobMoveRequested,
    JobResumed,
    MoveReason,
    NodeLaunched,
    NodePreempting,
    PoolResizeFailed,
)
from shared.jobs import AttemptState, JobState
from shared.localstack.market import MARKET_FILE, MarketConfig
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.e2e.stack import spotrain, stack_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

EXAMPLES = Path(__file__).parents[2] / "examples"
TICK_S = 3.0
"""Wall seconds per trace tick: a 60 s gap at a speed-up of 20."""
HELD_TICKS, DRY_TICKS = 15, 10
"""One node can be held for the first 45 s of the market, none for the next 30 s."""
STEPS, STEP_S = 380, 0.5
"""About 190 s of training on uninterrupted capacity."""
SLACK_AT_STOCK_OUT_S = 40
"""What the deadline leaves to spare when the market runs dry: below the reserve the
deadline policy keeps (a fifth of the work left, and a restart), so the job cannot wait
for spot and takes on-demand; above the three restarts that going back to spot and, were
spot to go again, to on-demand would cost, so it goes back once spot returns."""
BOOT_S = 9
"""About how long a spot node takes to launch and start the job on the local stack."""

POOLS = """
[[pool]]
name = "gpu-spot"
capacity = "spot"
gpus = 2
cpus = 2
price_per_hour_usd = 0.34
boot_time_s = 15
max_nodes = 2

[[pool]]
name = "gpu-on-demand"
capacity = "on-demand"
gpus = 2
cpus = 2
price_per_hour_usd = 0.85
boot_time_s = 15
max_nodes = 1
"""


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "stack"
    yield home
    spotrain({**os.environ, "SPOTRAIN_LOCAL_HOME": str(home)}, "down")


WATCHED = (NodeLaunched, NodePreempting, PoolResizeFailed, JobResumed, JobMoveRequested)


async def wait_for(bus: JetStreamBus, what: str, found: Any, *, until: datetime) -> Any:
    """The first stored event of the watched kinds that `found` accepts, by `until`."""
    subjects = subjects_for(WATCHED, bus.prefix)
    while True:
        stored = [m for subject in subjects for m in await bus.read(subject)]
        for message in sorted(stored, key=lambda m: m.seq):
            event = decode(message.data)
            if found(event):
                return event
        assert datetime.now(UTC) < until, f"no {what} by {until:%H:%M:%S}"
        await asyncio.sleep(0.5)


def test_a_deadline_job_rides_a_stock_out_spot_on_demand_and_back_to_spot(
    home: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "market.json"
    counts = [1] * HELD_TICKS + [0] * DRY_TICKS + [1] * 100
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": counts}))
    pools = tmp_path / "pools.toml"
    pools.write_text(POOLS)
    env = {
        **stack_env(home),
        "SPOTRAIN_SCALER_POOLS_FILE": str(pools),
        "SPOTRAIN_SCALER_SETTLE_S": "0",
        "SPOTRAIN_CHECKPOINTER_MOVE_REVIEW_INTERVAL_S": "2",
        "SPOTRAIN_CHECKPOINTER_RESTART_OVERHEAD_S": "10",
    }
    up = spotrain(env, "up", "--spot-market", f"gpu-spot={trace},{60 / TICK_S:g}")
    assert up.returncode == 0, up.stderr + up.stdout
    assert "gpu-spot follows market.json at x20" in up.stderr
    config = MarketConfig.model_validate_json(
        (LocalStackSettings(home=home).run_dir / MARKET_FILE).read_text()
    )
    dry_from = config.started_at + timedelta(seconds=HELD_TICKS * TICK_S)
    wet_from = dry_from + timedelta(seconds=DRY_TICKS * TICK_S)

    workdir = tmp_path / "project"
    workdir.mkdir()
    shutil.copy(EXAMPLES / "train_digits.py", workdir)
    work_s = STEPS * STEP_S
    # On spot from about BOOT_S after submission until the market runs dry.
    on_spot_s = (dry_from - datetime.now(UTC)).total_seconds() - BOOT_S
    deadline = dry_from + timedelta(seconds=work_s - on_spot_s + SLACK_AT_STOCK_OUT_S)
    experiment = "market-ride"
    submitted = spotrain(
        env, "submit", "train_digits.py", "--workdir", str(workdir), "--gpus", "2", "--any",
        "--deadline", deadline.isoformat(), "--estimate", f"{work_s:.0f}s",
        "--experiment", experiment, "--max-restarts", "3",
        "--", f"--steps={STEPS}", f"--step-delay-s={STEP_S - 0.01}", "--report-every=5",
        "--checkpoint-every=10",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[-1]
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])

    async def story() -> None:
        # Closed however the story ends: a connection left open fails a later test.
        async with contextlib.AsyncExitStack() as closing:
            bus = await JetStreamBus.connect(settings, name="test")
            closing.push_async_callback(bus.close)
            client = await closing.enter_async_context(await SpotrainClient.connect(settings))
            launched = await wait_for(
                bus, "first launch", lambda e: isinstance(e.data, NodeLaunched),
                until=dry_from,
            )  # fmt: skip
            first = launched.data.node
            assert launched.data.capacity.value == "spot", "spot first: the deadline allows it"
            notice = await wait_for(
                bus, "notice", lambda e: isinstance(e.data, NodePreempting)
                and e.data.node == first, until=dry_from + timedelta(seconds=40),
            )  # fmt: skip
            assert notice.time >= dry_from - timedelta(seconds=3), "noticed before the drop"
            stocked_out = await wait_for(
                bus, "stock-out", lambda e: isinstance(e.data, PoolResizeFailed)
                and "ZONE_RESOURCE_POOL_EXHAUSTED" in e.data.message,
                until=wet_from + timedelta(seconds=10),
            )  # fmt: skip
            assert stocked_out.data.pool == "gpu-spot"
            # The deadline cannot wait for spot: its next attempt runs on on-demand.
            while True:
                record = await client.job(job_id)
                assert record is not None
                # Past the platform's queue and Ray's start: where it runs is known then.
                if len(record.attempts) >= 2 and record.attempts[1].state not in (
                    AttemptState.QUEUED,
                    AttemptState.SUBMITTED,
                ):
                    break
                assert datetime.now(UTC) < wet_from + timedelta(seconds=20), record
                await asyncio.sleep(0.5)
            assert record.attempts[1].pool == "gpu-on-demand", record
            assert record.attempts[0].cause is InterruptionCause.PREEMPTED
            # Make before break: spot room asked for, a spot node launched once the market
            # has one again, and only then the move.
            wanted = await wait_for(
                bus, "move request", lambda e: isinstance(e.data, JobMoveRequested),
                until=wet_from + timedelta(seconds=60),
            )  # fmt: skip
            assert (wanted.data.attempt, wanted.data.capacity.value) == (2, "spot")
            second = await wait_for(
                bus, "relaunch", lambda e: isinstance(e.data, NodeLaunched)
                and e.data.capacity.value == "spot" and e.data.node != first,
                until=wet_from + timedelta(seconds=60),
            )  # fmt: skip
            assert second.data.launched_at >= wet_from - timedelta(seconds=3)
            moved = await wait_for(
                bus, "move", lambda e: isinstance(e.data, JobResumed)
                and e.data.moved is MoveReason.SPOT_RETURNED,
                until=wet_from + timedelta(seconds=90),
            )  # fmt: skip
            assert moved.time >= second.time
            assert moved.data.attempt == 3
            assert moved.data.steps_lost <= 5, "it checkpointed when asked to move"
            while (record := await client.job(job_id)) is not None and record.is_active:
                assert datetime.now(UTC) < deadline + timedelta(seconds=60), record
                await asyncio.sleep(1)
        assert record is not None
        assert record.state is JobState.SUCCEEDED, record
        last = record.attempts[-1]
        assert last.ended_at is not None
        assert last.ended_at <= deadline, f"ended {last.ended_at}, deadline {deadline}"
        assert last.nodes == (second.data.node,), "it ended on spot"
        assert [a.cause for a in record.attempts] == [
            InterruptionCause.PREEMPTED,
            InterruptionCause.MOVED,
            None,
        ]
        assert record.interruptions == 1, "a move spends no restart"

    asyncio.run(story())
    costs = spotrain(env, "cost", "--experiment", experiment, "--json")
    assert costs.returncode == 0, costs.stderr
    [row] = json.loads(costs.stdout)
    assert row["cost_usd"] > 0, row
    assert row["saving_vs_on_demand_usd"] > 0, f"dearer than on-demand: {row}"
