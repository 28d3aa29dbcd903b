"""`spotrain cost`, `ls` and `show` on events stored in a real NATS JetStream, against the
figures worked out by hand in tests/unit/test_cost_ledger.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from shared.client import SpotrainClient
from shared.cost import GroupBy, cost_rows
from shared.events.data import JobRequested
from shared.events.types import Bundle
from shared.jobs import JobRecord, JobState, jobs_bucket
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.cli import ENTRY as SPOTRAIN
from tests.unit.test_cost_ledger import Story

pytestmark = pytest.mark.integration


@pytest.fixture
async def story(jetstream_bus: JetStreamBus) -> Story:
    """The hand-computed story, told to the bus, ending a few minutes ago."""
    told = Story(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1))
    await jetstream_bus.publish_many(told.events())
    js = jetstream_bus.client.jetstream()
    jobs = await js.create_key_value(bucket=jobs_bucket(jetstream_bus.prefix))
    request = JobRequested(
        job_id="job-a",
        owner="alice",
        experiment="exp-1",
        entrypoint=("python", "train.py"),
        worker=Bundle(gpus=1),
    )
    record = JobRecord(
        request=request,
        request_event_id="r-1",
        state=JobState.SUCCEEDED,
        accepted_at=told.t(0),
        updated_at=told.t(1360),
    )
    await jobs.put("job-a", record.model_dump_json().encode())
    return told


def spotrain(settings: BusSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "COLUMNS": "200",
        "SPOTRAIN_NATS_URL": settings.nats_url,
        "SPOTRAIN_SUBJECT_PREFIX": settings.subject_prefix,
    }
    return subprocess.run(
        [sys.executable, "-c", SPOTRAIN, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def cost_json(settings: BusSettings, *args: str) -> list[dict[str, object]]:
    result = spotrain(settings, "cost", "--json", *args)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


async def test_cost_by_job_matches_the_hand_computation(
    story: Story, bus_settings: BusSettings
) -> None:
    assert cost_json(bus_settings) == [
        {
            "job": "job-a",
            "idle": False,
            "cost_usd": 0.21,
            "gpu_hours": 0.333333,
            "waste_usd": 0.02,
            "saving_vs_on_demand_usd": 0.09,
        },
        {
            "job": "job-b",
            "idle": False,
            "cost_usd": 0.02,
            "gpu_hours": 0.055556,
            "waste_usd": 0.0,
            "saving_vs_on_demand_usd": 0.03,
        },
        {
            "job": None,
            "idle": True,
            "pool": "gpu-on-demand",
            "cost_usd": 0.295,
            "gpu_hours": 0.327778,
            "waste_usd": 0.0,
            "saving_vs_on_demand_usd": 0.0,
        },
        {
            "job": None,
            "idle": True,
            "pool": "gpu-spot",
            "cost_usd": 0.06,
            "gpu_hours": 0.166667,
            "waste_usd": 0.0,
            "saving_vs_on_demand_usd": 0.09,
        },
    ]


async def test_cost_by_pool_for_one_experiment_and_since(
    story: Story, bus_settings: BusSettings
) -> None:
    by_pool = {r["pool"]: r["cost_usd"] for r in cost_json(bus_settings, "--by", "pool")}
    assert by_pool == {"gpu-spot": 0.14, "gpu-on-demand": 0.445}
    owners = cost_json(bus_settings, "--by", "owner", "--experiment", "exp-1")
    assert [(r["owner"], r["cost_usd"], r["waste_usd"]) for r in owners] == [("alice", 0.21, 0.02)]
    since = cost_json(bus_settings, "--since", story.t(1000).isoformat())
    assert [(r["job"], r["cost_usd"]) for r in since] == [("job-a", 0.09), (None, 0.21)]


async def test_the_table_ends_with_the_bill(story: Story, bus_settings: BusSettings) -> None:
    result = spotrain(bus_settings, "cost", "--by", "experiment")
    assert result.returncode == 0, result.stderr
    [total] = [line for line in result.stdout.splitlines() if "total" in line]
    cells = [cell.strip() for cell in total.split("│") if cell.strip()]
    assert cells == ["total", "$0.5850", "0.88", "$0.0200", "$0.2100"]
    assert "exp-1" in result.stdout
    assert "(idle gpu-spot)" in result.stdout


async def test_ls_and_show_carry_the_cost_so_far(story: Story, bus_settings: BusSettings) -> None:
    listed = spotrain(bus_settings, "ls", "--all")
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if "job-a" in line]
    assert "$0.2100" in row
    shown = spotrain(bus_settings, "show", "job-a")
    assert shown.returncode == 0, shown.stderr
    assert (
        "cost so far: $0.2100, 0.33 GPU-hours, $0.0200 of it lost to preemptions, "
        "$0.0900 saved against on-demand" in shown.stdout
    )


async def test_the_sdk_reads_the_same_figures(story: Story, bus_settings: BusSettings) -> None:
    async with await SpotrainClient.connect(bus_settings) as client:
        ledger = await client.costs()
    assert ledger.attribution.cost_usd == pytest.approx(0.585)
    assert [row.key for row in cost_rows(ledger, GroupBy.JOB)][:2] == ["job-a", "job-b"]
