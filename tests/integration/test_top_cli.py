"""`spotrain top` against a real NATS JetStream: the scaler's pools report, a job record and
its progress seeded on the bus, read back by the command in its own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.scaler.adapters.kv_demand import KvDemandStore
from services.submitter.adapters.kv_job_store import KvJobStore
from shared.cli.top import NO_SCALER, connected_reader
from shared.events import Event, new_event
from shared.events.data import JobProgress, JobRequested
from shared.events.types import Bundle, CapacityClass
from shared.jobs import Attempt, AttemptState, JobRecord, JobState, jobs_bucket
from shared.localstack.nats_server import NatsServer
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.natsauth import Role, write_nats_config
from shared.pools import STATUS_KEY, PoolsStatus, PoolStatus, pools_bucket
from tests.cli import ENTRY

pytestmark = pytest.mark.integration


def seeded_status(now: datetime) -> PoolsStatus:
    """A spot pool, half of its GPUs in use."""
    pool = PoolStatus(
        pool="gpu-spot-seeded",
        capacity=CapacityClass.SPOT,
        price_per_hour_usd=0.72,
        nodes=2,
        ready=2,
        gpus_total=4,
        gpus_free=2,
        pending_jobs=0,
        pending_gpus=0,
        target=2,
        min_nodes=0,
        max_nodes=4,
    )
    return PoolsStatus(
        updated_at=now,
        budget_per_hour_usd=10.0,
        cost_per_hour_usd=1.44,
        pools=(pool,),
        blocked_jobs=0,
    )


def seeded_job(now: datetime) -> JobRecord:
    """A running job at step 40."""
    request = JobRequested(
        job_id="job-seeded",
        owner="alice",
        experiment="exp-1",
        entrypoint=("python", "train.py"),
        worker=Bundle(gpus=2),
    )
    running = Attempt(
        number=1,
        submission_id="job-seeded-1",
        state=AttemptState.RUNNING,
        submitted_at=now - timedelta(minutes=5),
        step=40,
        total_steps=100,
        metrics={"loss": 0.5},
    )
    return JobRecord(
        request=request,
        request_event_id="r-1",
        state=JobState.RUNNING,
        accepted_at=now - timedelta(minutes=5),
        updated_at=now,
        attempts=(running,),
    )


def seeded_progress(now: datetime) -> Event[JobProgress]:
    """The job's report of where it is: step 40 of 100."""
    progress = JobProgress(
        job_id="job-seeded", attempt=1, step=40, total_steps=100, metrics={"loss": 0.5}
    )
    return new_event(progress, source="tests", time=now)


@pytest.fixture
async def seeded(jetstream_bus: JetStreamBus) -> None:
    """What the scaler and the submitter would have written: the pools, a job, its progress."""
    now = datetime.now(UTC)
    js = jetstream_bus.client.jetstream()
    pools = await js.create_key_value(bucket=pools_bucket(jetstream_bus.prefix))
    await pools.put(STATUS_KEY, seeded_status(now).model_dump_json().encode())
    jobs = await js.create_key_value(bucket=jobs_bucket(jetstream_bus.prefix))
    await jobs.put("job-seeded", seeded_job(now).model_dump_json().encode())
    await jetstream_bus.publish(seeded_progress(now))


def command(*args: str) -> list[str]:
    return [sys.executable, "-c", ENTRY, "top", *args]


def environment(settings: BusSettings) -> dict[str, str]:
    return {
        **os.environ,
        "COLUMNS": "200",
        "SPOTRAIN_NATS_URL": settings.nats_url,
        "SPOTRAIN_SUBJECT_PREFIX": settings.subject_prefix,
    }


def plain_row(text: str, first: str) -> list[str]:
    """The cells of the one plain-table row whose first cell is `first` (cells are two or
    more spaces apart)."""
    rows = [cells for line in text.splitlines() if (cells := re.split(r" {2,}", line.strip()))]
    [found] = [cells for cells in rows if cells[0] == first]
    return found


def once(settings: BusSettings) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command("--once"),
        capture_output=True,
        text=True,
        env=environment(settings),
        timeout=60,
        check=False,
    )


@pytest.mark.usefixtures("seeded")
def test_once_prints_the_seeded_pool_and_job(bus_settings: BusSettings) -> None:
    result = once(bus_settings)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "GPUs allocated 2/4 (50%)" in result.stdout
    # Piped: plain columns, as ls prints them, no box drawing.
    assert not set("│┃━─┏└") & set(result.stdout)
    assert plain_row(result.stdout, "gpu-spot-seeded")[:4] == [
        "gpu-spot-seeded", "spot", "2/2", "2/4",
    ]  # fmt: skip
    assert plain_row(result.stdout, "job-seeded") == [
        "job-seeded", "alice", "exp-1", "running", "1", "40/100", "loss 0.5", "0", "-",
    ]  # fmt: skip


def test_once_before_the_scaler_reports_says_so(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    result = once(bus_settings)
    assert result.returncode == 0, result.stderr
    assert NO_SCALER in result.stdout
    assert "no jobs" in result.stdout


@pytest.mark.usefixtures("seeded")
def test_live_refreshes_until_ctrl_c_and_then_exits_quietly(bus_settings: BusSettings) -> None:
    """Piped, each refresh prints a frame under the last; Ctrl-C ends it with exit 0."""
    with subprocess.Popen(
        command("--interval", "0.5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(bus_settings),
    ) as process:
        assert process.stdout is not None
        seen: list[str] = []
        while sum(line.startswith("spotrain top") for line in seen) < 2:
            line = process.stdout.readline()
            assert line, "the command ended before its second frame"
            seen.append(line)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert stderr == ""
    assert sum("job-seeded" in line for line in seen) == 1  # one frame drawn in full


async def test_the_cli_role_may_read_all_that_top_shows(tmp_path: Path) -> None:
    """On a secure bus, the CLI's user reads the pools, the jobs, the costs and the progress
    reports; each written by the role that writes them in production."""
    config = write_nats_config(tmp_path / "auth", prefix="spotrain")
    server = NatsServer(tmp_path / "store", config_file=config.server_config)
    server.start()

    def settings(role: Role) -> BusSettings:
        fields = {k.removeprefix("SPOTRAIN_").lower(): v for k, v in config.env(role).items()}
        return BusSettings.model_validate({**fields, "nats_url": server.url})

    now = datetime.now(UTC)
    try:
        async with AsyncExitStack() as stack:
            submitter = await JetStreamBus.connect(settings(Role.SUBMITTER), name="submitter")
            stack.push_async_callback(submitter.close)
            await submitter.ensure_stream()
            jobs = await KvJobStore.open(submitter, jobs_bucket("spotrain"))
            await jobs.create(seeded_job(now))
            await submitter.publish(seeded_progress(now))
            scaler = await JetStreamBus.connect(settings(Role.SCALER), name="scaler")
            stack.push_async_callback(scaler.close)
            board = await KvDemandStore.open(scaler, pools_bucket("spotrain"))
            await board.publish_status(seeded_status(now))

            async with connected_reader(settings(Role.CLI)) as reader:
                snapshot = await reader.read()
    finally:
        server.stop()
    assert snapshot.pools == seeded_status(now)
    assert [job.job_id for job in snapshot.jobs] == ["job-seeded"]
    [job] = snapshot.jobs
    assert job.current is not None
    assert job.current.total_steps == 100
