"""The submitter as `spotrain up` runs it, against real NATS and a real Ray cluster with a
worker node declaring GPUs: requests become Ray jobs, and their ends become events."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.events import decode, new_event
from shared.events.data import JobCancelRequested
from shared.events.types import Bundle, CapacityClass
from shared.localstack import stack
from shared.localstack.ports import free_port, free_port_below, free_port_block
from shared.localstack.processes import ProcessRecord, is_running, stop_session
from shared.localstack.ray_nodes import NodePorts, NodeShape, start_worker
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.resources import RESOURCE_PER_NODE, capacity_resource
from tests.async_helpers import eventually
from tests.events import NOW, job_requested

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackSettings]:
    """The local stack plus one spot worker node with two GPUs, shared by the module."""
    settings = LocalStackSettings(
        home=tmp_path_factory.mktemp("stack"),
        nats_port=free_port(),
        nats_monitor_port=free_port(),
        ray_gcs_port=free_port_below(10_000),
        ray_dashboard_port=free_port_below(10_000),
        ray_client_port=free_port_below(10_000),
        ray_head_port_base=free_port_block(64),
        service_port_base=free_port(),
    )
    stack.up(settings)
    spot = capacity_resource(CapacityClass.SPOT)
    assert spot is not None
    worker = start_worker(
        "gpu-spot-1",
        settings.gcs_address,
        NodeShape(num_cpus=2, num_gpus=2, resources={spot: RESOURCE_PER_NODE}),
        NodePorts(free_port_block(64)),
        log_dir=settings.log_dir,
        env=os.environ,
    )
    try:
        _wait_for_line(Path(worker.log), "Ray runtime started", worker)
        yield settings
    finally:
        stop_session(worker.pid, grace_s=2)
        stack.down(settings)


def _wait_for_line(path: Path, text: str, record: ProcessRecord, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        assert is_running(record), path.read_text(errors="replace")[-2000:]
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} after {timeout_s}s")


@pytest.fixture
async def bus(cluster: LocalStackSettings) -> AsyncIterator[JetStreamBus]:
    bus = await JetStreamBus.connect(BusSettings(nats_url=cluster.nats_url), name="test")
    yield bus
    await bus.close()


async def job_events(bus: JetStreamBus, job_id: str) -> list[tuple[str, Any]]:
    events = [decode(m.data) for m in await bus.read(f"{bus.prefix}.job.>")]
    return [(e.type.split(".")[2], e.data) for e in events if e.subject == job_id]


async def wait_for(bus: JetStreamBus, job_id: str, kind: str, timeout_s: float = 60) -> list[str]:
    async def arrived() -> bool:
        return kind in [k for k, _ in await job_events(bus, job_id)]

    await eventually(arrived, timeout_s=timeout_s, interval_s=0.25)
    return [k for k, _ in await job_events(bus, job_id)]


def ray_logs(cluster: LocalStackSettings, submission_id: str) -> str:
    url = f"{cluster.dashboard_url}/api/jobs/{submission_id}/logs"
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310  # local dashboard
        return str(json.load(response)["logs"])


def ray_submissions(cluster: LocalStackSettings) -> list[str]:
    with urllib.request.urlopen(f"{cluster.dashboard_url}/api/jobs/", timeout=10) as response:  # noqa: S310
        return [job["submission_id"] for job in json.load(response)]


SPOT_GPU = {"worker": Bundle(gpus=1, cpus=1), "capacity": CapacityClass.SPOT}


async def test_a_request_runs_on_the_gpu_node_and_succeeds(
    cluster: LocalStackSettings, bus: JetStreamBus
) -> None:
    script = (
        "import os; "
        "print('trained', os.environ['SPOTRAIN_JOB_ID'], os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    await bus.publish(job_requested("job-ok", entrypoint=("python", "-c", script), **SPOT_GPU))
    kinds = await wait_for(bus, "job-ok", "succeeded")
    assert kinds == ["requested", "accepted", "queued", "started", "succeeded"]
    assert "trained job-ok 0" in ray_logs(cluster, "job-ok-1")


async def test_a_failing_script_fails_the_job_as_the_users_error(
    cluster: LocalStackSettings, bus: JetStreamBus
) -> None:
    script = "raise SystemExit('bad learning rate')"
    await bus.publish(job_requested("job-bad", entrypoint=("python", "-c", script), **SPOT_GPU))
    await wait_for(bus, "job-bad", "failed")
    [failed] = [data for kind, data in await job_events(bus, "job-bad") if kind == "failed"]
    assert "exit code 1" in failed.message or "bad learning rate" in failed.message


async def test_a_request_over_the_quota_is_rejected(bus: JetStreamBus) -> None:
    await bus.publish(job_requested("job-huge", worker=Bundle(gpus=8), num_workers=2))
    await wait_for(bus, "job-huge", "rejected")
    [rejected] = [data for kind, data in await job_events(bus, "job-huge") if kind == "rejected"]
    assert rejected.detail == "the job asks for 16 GPUs; the limit per job is 8"


async def test_a_duplicated_request_runs_one_ray_job(
    cluster: LocalStackSettings, bus: JetStreamBus
) -> None:
    request = job_requested("job-twice", entrypoint=("python", "-c", "print(1)"), **SPOT_GPU)
    await bus.publish(request)
    # The same request again, as a client retrying with a fresh envelope would send it.
    await bus.publish(request.model_copy(update={"id": "retry-of-job-twice"}))
    kinds = await wait_for(bus, "job-twice", "succeeded")
    assert kinds.count("requested") == 2
    assert kinds.count("started") == 1
    assert [s for s in ray_submissions(cluster) if s.startswith("job-twice")] == ["job-twice-1"]


async def test_cancel_stops_a_running_job(cluster: LocalStackSettings, bus: JetStreamBus) -> None:
    script = "import time; time.sleep(120)"
    await bus.publish(job_requested("job-long", entrypoint=("python", "-c", script), **SPOT_GPU))
    await wait_for(bus, "job-long", "started")
    cancel = JobCancelRequested(job_id="job-long", requested_by="alice")
    await bus.publish(new_event(cancel, source="tests", time=NOW))
    kinds = await wait_for(bus, "job-long", "cancelled", timeout_s=60)
    assert "failed" not in kinds


async def test_a_submitter_killed_mid_job_picks_the_job_up_again(
    cluster: LocalStackSettings, bus: JetStreamBus
) -> None:
    script = "import time; time.sleep(6); print('finished once')"
    await bus.publish(
        job_requested("job-survivor", entrypoint=("python", "-c", script), **SPOT_GPU)
    )
    await wait_for(bus, "job-survivor", "started")
    record = ProcessRecord.load(cluster.run_dir / "submitter.json")
    assert record is not None
    stop_session(record.pid, grace_s=0)  # SIGKILL: no chance to finish anything
    await asyncio.sleep(1)
    await asyncio.to_thread(stack.up, cluster)  # starts only what is down: the submitter
    kinds = await wait_for(bus, "job-survivor", "succeeded", timeout_s=90)
    assert kinds == ["requested", "accepted", "queued", "started", "succeeded"]
    assert [s for s in ray_submissions(cluster) if s.startswith("job-survivor")] == [
        "job-survivor-1"
    ]
    assert "finished once" in ray_logs(cluster, "job-survivor-1")
