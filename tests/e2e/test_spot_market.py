"""A local spot market (`spotrain up --spot-market`): a spot job's node is taken back with a
notice when the trace's count drops, growth fails while the market is stocked out, and the
job resumes on spot once capacity returns. Real `ray start` nodes, the real services."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.client import SpotrainClient
from shared.events import decode, subjects_for
from shared.events.data import (
    JobResumed,
    NodeLaunched,
    NodePreempting,
    PoolResizeFailed,
)
from shared.jobs import JobState
from shared.localstack.market import MARKET_FILE, MarketConfig
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.e2e.stack import spotrain, stack_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TICK_S = 3.0
"""Wall seconds per trace tick: a 60 s gap at a speed-up of 20."""
HELD_TICKS, DRY_TICKS = 20, 10
"""One node can be held for the first 60 s of the market, none for the next 30 s."""


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "stack"
    yield home
    spotrain({**os.environ, "SPOTRAIN_LOCAL_HOME": str(home)}, "down")


WATCHED = (NodeLaunched, NodePreempting, PoolResizeFailed, JobResumed)


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


def test_a_spot_job_rides_a_stock_out_and_resumes_when_capacity_returns(
    home: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "market.json"
    counts = [1] * HELD_TICKS + [0] * DRY_TICKS + [1] * 60
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": counts}))
    env = {
        **stack_env(home),
        "SPOTRAIN_SCALER_CAPACITY_RETRY_AFTER_S": "3",
        "SPOTRAIN_SCALER_SETTLE_S": "0",
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
    (workdir / "sleep.py").write_text("import time\ntime.sleep(600)\n")
    submitted = spotrain(
        env, "submit", "sleep.py", "--workdir", str(workdir), "--gpus", "2", "--spot",
        "--max-restarts", "3",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[-1]
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])

    async def story() -> None:
        bus = await JetStreamBus.connect(settings, name="test")
        async with await SpotrainClient.connect(settings) as client:
            launched = await wait_for(
                bus, "first launch", lambda e: isinstance(e.data, NodeLaunched),
                until=dry_from,
            )  # fmt: skip
            first = launched.data.node
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
            second = await wait_for(
                bus, "relaunch", lambda e: isinstance(e.data, NodeLaunched)
                and e.data.node != first, until=wet_from + timedelta(seconds=60),
            )  # fmt: skip
            assert second.data.launched_at >= wet_from - timedelta(seconds=3)
            assert second.data.capacity.value == "spot"
            deadline = time.monotonic() + 60
            while True:
                record = await client.job(job_id)
                assert record is not None
                if record.state is JobState.RUNNING and len(record.attempts) >= 2:
                    break
                assert time.monotonic() < deadline, record
                await asyncio.sleep(0.5)
            assert record.current is not None
            assert record.current.nodes == (second.data.node,)
        await bus.close()

    asyncio.run(story())
