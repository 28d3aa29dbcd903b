"""`spotrain submit --workers` against a real NATS JetStream whose pools report is seeded as
the scaler writes it: a gang that no pool could ever hold is refused in one line, before
anything is uploaded or published."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.events.types import CapacityClass
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.pools import STATUS_KEY, PoolsStatus, PoolStatus, pools_bucket
from shared.workspace import workspaces_bucket
from tests.cli import ENTRY

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "examples"


def spot_pool(max_nodes: int) -> PoolStatus:
    return PoolStatus(
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        price_per_hour_usd=0.72,
        nodes=0,
        ready=0,
        gpus_total=0,
        gpus_free=0,
        pending_jobs=0,
        pending_gpus=0,
        target=0,
        min_nodes=0,
        max_nodes=max_nodes,
        gpus_per_node=1,
    )


async def test_a_gang_no_pool_could_ever_hold_is_refused_before_the_upload(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    """Issue 18, bad input: MIN larger than any pool can ever hold."""
    js = jetstream_bus.client.jetstream()
    pools = await js.create_key_value(bucket=pools_bucket(jetstream_bus.prefix))
    status = PoolsStatus(
        updated_at=datetime.now(UTC),
        budget_per_hour_usd=10.0,
        cost_per_hour_usd=0.0,
        pools=(spot_pool(4),),
        blocked_jobs=0,
    )
    await pools.put(STATUS_KEY, status.model_dump_json().encode())
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", ENTRY, "submit", "train_ray_train.py", "--workdir", str(EXAMPLES),
         "--gpus", "1", "--spot", "--workers", "5..8"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "SPOTRAIN_NATS_URL": bus_settings.nats_url,
            "SPOTRAIN_SUBJECT_PREFIX": bus_settings.subject_prefix,
        },
        timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "spotrain: error: 5 workers of 1 GPU(s) can never run together: the spot pools hold "
        "at most 4 at their max_nodes"
    ]
    assert await jetstream_bus.read(f"{jetstream_bus.prefix}.job.>") == [], "nothing published"
    buckets = [name async for name in _stream_names(jetstream_bus)]
    assert f"OBJ_{workspaces_bucket(jetstream_bus.prefix)}" not in buckets, "nothing uploaded"


async def _stream_names(bus: JetStreamBus) -> AsyncIterator[str]:
    for info in await bus.client.jetstream().streams_info():
        yield str(info.config.name)
