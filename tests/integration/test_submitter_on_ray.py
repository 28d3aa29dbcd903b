"""The submitter as `spotrain up` runs it, against real NATS and a real Ray cluster with a
worker node declaring GPUs: requests become Ray jobs, and their ends become events."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.checkpoints import latest_checkpoint
from shared.events import decode, new_event
from shared.events.data import JobCancelRequested
from shared.events.types import Bundle, CapacityClass
from shared.localstack import stack
from shared.localstack.processes import ProcessRecord, stop_session
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.async_helpers import eventually
from tests.events import NOW, job_requested

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackSettings]:
    """The local stack, shared by the module; its scaler starts the nodes jobs need."""
    settings = isolated_stack(tmp_path_factory.mktemp("stack"))
    with pytest.MonkeyPatch.context() as env:
        # Nodes stay between tests, and a second one may come soon after the first.
        env.setenv("SPOTRAIN_SCALER_IDLE_TIMEOUT_S", "300")
        env.setenv("SPOTRAIN_SCALER_SETTLE_S", "8")
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
    kinds = await wait_for(bus, "job-ok", "succeeded", timeout_s=90)
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


EXAMPLES = Path(__file__).parents[2] / "examples"


def cli(
    cluster: LocalStackSettings, *args: str, cwd: Path = EXAMPLES
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPOTRAIN_NATS_URL": cluster.nats_url,
        "SPOTRAIN_RAY_ADDRESS": cluster.dashboard_url,
    }
    return subprocess.run(
        [sys.executable, "-c", "from shared.cli.entry import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=180,
        check=False,
    )


async def test_the_cli_trains_the_digits_example_with_progress_and_checkpoints(
    cluster: LocalStackSettings, bus: JetStreamBus
) -> None:
    submitted = await asyncio.to_thread(
        cli, cluster, "submit", "train_digits.py", "--spot", "--experiment", "digits",
        "--job-id", "digits-1", "--wait", "--", "--steps", "120", "--step-delay-s", "0.02",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip().splitlines()[-1] == "digits-1"

    logs = await asyncio.to_thread(cli, cluster, "logs", "digits-1")
    assert "attempt 1: starting at step 0" in logs.stdout
    assert "final accuracy" in logs.stdout

    progress = [data for kind, data in await job_events(bus, "digits-1") if kind == "progress"]
    assert progress, "training progress reached the bus"
    assert progress[-1].step > progress[0].step
    assert "loss" in progress[-1].metrics
    latest = latest_checkpoint((cluster.checkpoint_dir / "digits-1").as_uri())
    assert latest is not None
    assert latest.step == 120

    listing = await asyncio.to_thread(cli, cluster, "ls", "--all")
    assert "digits-1" in listing.stdout
    assert "succeeded" in listing.stdout
    # A finished job's events stay on the bus for anyone to follow or inspect.
    watched = await asyncio.to_thread(cli, cluster, "watch", "digits-1")
    assert watched.returncode == 0, watched.stderr
    assert "succeeded" in watched.stdout
    shown = await asyncio.to_thread(cli, cluster, "show", "digits-1", "--events")
    assert "state: succeeded" in shown.stdout
    assert "  #1 succeeded on " in shown.stdout
    assert "job.progress" in shown.stdout
    described = await asyncio.to_thread(cli, cluster, "show", "digits-1", "-o", "json")
    assert json.loads(described.stdout)["state"] == "succeeded"


async def test_the_cli_says_why_a_job_did_not_run(
    cluster: LocalStackSettings, tmp_path: Path
) -> None:
    (tmp_path / "broken.py").write_text("raise SystemExit('diverged')\n")
    over = await asyncio.to_thread(
        cli, cluster, "submit", "broken.py", "--gpus", "12", cwd=tmp_path
    )
    assert over.returncode == 1
    assert over.stderr.strip() == (
        "spotrain: error: rejected: the job asks for 12 GPUs; the limit per job is 8"
    )
    failed = await asyncio.to_thread(
        cli, cluster, "submit", "broken.py", "--spot", "--wait", cwd=tmp_path
    )
    assert failed.returncode == 1
    assert "failed" in failed.stderr


async def test_the_cli_cancels_a_running_job(cluster: LocalStackSettings, tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(120)\n")
    submitted = await asyncio.to_thread(
        cli, cluster, "submit", "slow.py", "--spot", "--job-id", "slow-1", cwd=tmp_path
    )
    assert submitted.returncode == 0, submitted.stderr
    cancelled = await asyncio.to_thread(cli, cluster, "cancel", "slow-1")
    assert cancelled.returncode == 0, cancelled.stderr
    unknown = await asyncio.to_thread(cli, cluster, "cancel", "no-such-job")
    assert unknown.stderr.strip() == "spotrain: error: no job no-such-job"
