"""The scaler on the local stack with real Ray: a pool grows by exactly what queued demand
needs, shrinks when its nodes are idle, and holds demand that would break the budget."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.scaler.adapters.ray_cluster import RayClusterObserver
from shared.events import decode, new_event
from shared.events.data import JobCancelRequested
from shared.events.types import Bundle, CapacityClass
from shared.localstack import stack
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.policy.pool_knowledge import PoolsKnowledge
from tests.async_helpers import eventually
from tests.events import NOW, job_requested

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

IDLE_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackSettings]:
    settings = isolated_stack(tmp_path_factory.mktemp("stack"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPOTRAIN_SCALER_IDLE_TIMEOUT_S", str(IDLE_TIMEOUT_S))
        # Two gpu-spot nodes ($0.34/h each) fit the budget; three do not.
        env.setenv("SPOTRAIN_SCALER_BUDGET_PER_HOUR_USD", "0.8")
        stack.up(settings)
    try:
        yield settings
    finally:
        stack.down(settings)


@pytest.fixture
async def bus(cluster: LocalStackSettings) -> AsyncIterator[JetStreamBus]:
    bus = await JetStreamBus.connect(BusSettings(nats_url=cluster.nats_url), name="test")
    yield bus
    await bus.close()


def nodes(cluster: LocalStackSettings) -> list[str]:
    return sorted(path.stem for path in cluster.node_dir.glob("*.json"))


async def events(bus: JetStreamBus, kind: str) -> list[Any]:
    return [decode(m.data).data for m in await bus.read(f"{bus.prefix}.{kind}")]


async def spotrain(cluster: LocalStackSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", "from shared.cli.entry import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SPOTRAIN_NATS_URL": cluster.nats_url, "COLUMNS": "200"},
        check=False,
    )


async def test_a_two_gpu_job_adds_exactly_one_node_which_goes_when_idle(
    cluster: LocalStackSettings, bus: JetStreamBus, tmp_path: Path
) -> None:
    assert nodes(cluster) == []
    go = tmp_path / "go"
    script = (
        f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)\nprint('trained')"
    )
    request = job_requested(
        "job-two-gpus",
        entrypoint=("python", "-c", script),
        worker=Bundle(gpus=2, cpus=1),
        capacity=CapacityClass.SPOT,
    )
    await bus.publish(request)

    async def succeeded() -> bool:
        return any(
            getattr(e, "job_id", None) == "job-two-gpus" for e in await events(bus, "job.succeeded")
        )

    peak: set[str] = set()

    async def done_while_counting() -> bool:
        peak.update(nodes(cluster))
        return await succeeded()

    async def at_work() -> bool:
        peak.update(nodes(cluster))
        return any(
            getattr(e, "job_id", None) == "job-two-gpus" for e in await events(bus, "job.started")
        )

    await eventually(at_work, timeout_s=90, interval_s=0.25)
    # A node at work is not Ray's to let go as idle, whatever a scaler thought it saw.
    refusal = await RayClusterObserver(cluster.gcs_address).drain_idle("gpu-spot-1")
    assert refusal is not None
    assert "no longer idle" in refusal
    go.touch()
    await eventually(done_while_counting, timeout_s=90, interval_s=0.25)
    assert peak == {"gpu-spot-1"}, "exactly one node of the spot pool"
    resized = [e for e in await events(bus, "pool.resized") if e.pool == "gpu-spot"]
    assert [e.size for e in resized][:1] == [1]

    started = time.monotonic()
    await eventually(lambda: nodes(cluster) == [], timeout_s=IDLE_TIMEOUT_S + 30, interval_s=0.5)
    assert time.monotonic() - started >= IDLE_TIMEOUT_S - 1, "not released before the timeout"
    assert [e.size for e in await events(bus, "pool.resized") if e.pool == "gpu-spot"][-1] == 0

    # What the scaler learnt of the pool is on the bus, and the simulator starts from it.
    learnt = await spotrain(cluster, "pools", "--learnt")
    assert learnt.returncode == 0, learnt.stderr
    record = PoolsKnowledge.model_validate_json(learnt.stdout).pools["gpu-spot"]
    assert record.node_hours > 0, "the node it held"
    assert record.taken_back == 0, "released, not taken back"
    trace = tmp_path / "market.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 40}))
    simulated = await spotrain(
        cluster, "simulate", "deadline", "--spot-trace", str(trace), "--hours", "2",
        "--deadline", "4", "--learnt", "gpu-spot", "--policy", "spotrain", "--json",
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr
    assert json.loads(simulated.stdout)[0]["met_deadline"] is True
    unknown = await spotrain(
        cluster, "simulate", "deadline", "--spot-trace", str(trace), "--hours", "2",
        "--deadline", "4", "--learnt", "gpu-nowhere",
    )  # fmt: skip
    assert unknown.returncode == 2
    assert "the stack knows no such pool (pools: " in unknown.stderr


async def test_a_job_over_the_budget_is_held_with_the_reason(
    cluster: LocalStackSettings, bus: JetStreamBus
) -> None:
    request = job_requested(
        "job-too-dear",
        entrypoint=("python", "-c", "print(1)"),
        worker=Bundle(gpus=2, cpus=1),
        num_workers=3,
        capacity=CapacityClass.SPOT,
    )
    await bus.publish(request)

    async def held() -> bool:
        return any(
            "job-too-dear: over-budget" in e.message
            for e in await events(bus, "pool.resize_failed")
        )

    try:
        await eventually(held, timeout_s=30, interval_s=0.25)
    except AssertionError as error:
        # A CI run once saw no hold within 30 s and left nothing to read: say what was seen.
        seen = [e.message for e in await events(bus, "pool.resize_failed")]
        log = (cluster.log_dir / "scaler.log").read_text().splitlines()[-30:]
        raise AssertionError(
            f"{error}; resize failures: {seen}; nodes: {nodes(cluster)}; scaler log:\n"
            + "\n".join(log)
        ) from None
    assert nodes(cluster) == [], "a job that cannot be placed whole takes nothing"
    [failure] = [e for e in await events(bus, "pool.resize_failed") if "job-too-dear" in e.message]
    assert "over the budget of $0.80/h" in failure.message
    shown = await spotrain(cluster, "pools")
    assert shown.returncode == 0, shown.stderr
    assert "gpu-spot" in shown.stdout
    assert "1 job(s) held" in shown.stdout
    cancel = JobCancelRequested(job_id="job-too-dear", requested_by="alice")
    await bus.publish(new_event(cancel, source="t", time=NOW))
