"""`spotrain cost`, `ls` and `show` on events stored in a real NATS JetStream, against the
figures worked out by hand in tests/unit/test_cost_ledger.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import pytest

from shared.client import SpotrainClient
from shared.events.data import InterruptionCause, JobRequested
from shared.events.types import Bundle, CapacityClass
from shared.jobs import Attempt, AttemptState, JobRecord, JobState, jobs_bucket
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.policy.cost import GroupBy, cost_rows
from shared.policy.cost.billing_export import ledger_by_node_day
from shared.pools import SIGHTINGS_KEY, NodeSightings, pools_bucket
from tests.billing_exports import BilledNode, as_csv, as_json_lines
from tests.billing_exports import rows as billing_rows
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
        attempts=(
            Attempt(
                number=1,
                submission_id="job-a-1",
                state=AttemptState.LOST,
                submitted_at=told.t(1),
                started_at=told.t(100),
                ended_at=told.t(700),
                step=60,
                nodes=("spot-1",),
                cause=InterruptionCause.PREEMPTED,
            ),
            Attempt(
                number=2,
                submission_id="job-a-2",
                state=AttemptState.SUCCEEDED,
                submitted_at=told.t(705),
                started_at=told.t(760),
                ended_at=told.t(1360),
                step=100,
                total_steps=100,
                nodes=("od-1",),
                capacity=CapacityClass.ON_DEMAND,
                pool="od",
                from_step=40,
            ),
        ),
    )
    await jobs.put("job-a", record.model_dump_json().encode())
    return told


def spotrain(
    settings: BusSettings, *args: str, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "COLUMNS": str(columns),
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
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["EXPERIMENT", "COST", "GPU", "HOURS", "WASTE", "SAVING"]
    [total] = [line for line in lines if line.startswith("total ")]
    assert total.split() == ["total", "$0.5850", "0.88", "$0.0200", "$0.2100"]
    assert lines.index(total) == len(lines) - 2, "the bill's total, then the window it covers"
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
        "cost so far: $0.2100, 0.33 GPU-hours, $0.0200 of it lost to preemptions\n"
        "saved: $0.0900 against on-demand\n" in shown.stdout
    )
    # Described attempt by attempt: where each ran, why it ended, the steps a restart went
    # back, and its share of the bill, the shares summing to the job's.
    [first] = [line for line in shown.stdout.splitlines() if "#1 " in line]
    [second] = [line for line in shown.stdout.splitlines() if "#2 " in line]
    assert "#1 lost on spot-1" in first
    assert "ended by preempted, 20 steps lost" in first
    assert "#2 succeeded on od-1 (od, on-demand)" in second
    assert "from step 40" in second
    shares = [Fraction(line.rsplit("$", 1)[1]) for line in (first, second)]
    assert sum(shares) == Fraction("0.21")
    assert "progress: step 100/100" in shown.stdout
    record = json.loads(spotrain(bus_settings, "show", "job-a", "-o", "json").stdout)
    assert record["state"] == "succeeded"
    assert [a["number"] for a in record["attempts"]] == [1, 2]


async def test_ls_fits_80_columns_and_says_all_with_wide_or_json(
    story: Story, bus_settings: BusSettings
) -> None:
    narrow = spotrain(bus_settings, "ls", "--all", columns=80)
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert lines[0].split()[:3] == ["JOB", "STATE", "COST"]
    assert "…" not in narrow.stdout
    assert all(len(line) <= 80 for line in lines)
    wide = spotrain(bus_settings, "ls", "--all", "-o", "wide", columns=80)
    assert wide.stdout.splitlines()[0].split() == [
        "JOB", "STATE", "COST", "GPUS", "AGE", "ATTEMPT", "CAPACITY", "EXPERIMENT", "OWNER",
    ]  # fmt: skip
    as_json = spotrain(bus_settings, "ls", "--all", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)
    assert row["job"] == "job-a"
    assert row["cost_usd"] == pytest.approx(0.21)
    assert row["attempt"] == 2
    # None of the jobs is mine: a line that says so, not a lone header; [] for a script.
    mine = spotrain(bus_settings, "ls", columns=80)
    assert mine.returncode == 0, mine.stderr
    assert mine.stdout == ""
    assert mine.stderr.strip() == (
        "no jobs of yours (--all for everyone's); submit one: spotrain submit train.py"
    )
    assert json.loads(spotrain(bus_settings, "ls", "-o", "json").stdout) == []
    tiny = spotrain(bus_settings, "ls", columns=30)
    assert tiny.returncode == 2
    assert tiny.stderr.strip() == (
        "spotrain: error: the terminal is 30 columns wide; tables need 40 (or use -o json)"
    )
    # A job whose attempt ran to its end has no node to preempt: one line, nothing killed.
    preempted = spotrain(bus_settings, "preempt", "--job", "job-a")
    assert preempted.returncode == 2
    assert preempted.stderr.strip() == (
        "spotrain: error: job-a has no running attempt on a node (succeeded)"
    )


async def test_the_sdk_reads_the_same_figures(story: Story, bus_settings: BusSettings) -> None:
    async with await SpotrainClient.connect(bus_settings) as client:
        ledger = await client.costs()
    assert ledger.attribution.cost_usd == pytest.approx(0.585)
    assert [row.key for row in cost_rows(ledger, GroupBy.JOB)][:2] == ["job-a", "job-b"]


async def post_sightings(bus: JetStreamBus, seen: dict[str, datetime]) -> None:
    """As the scaler's pass posts them."""
    js = bus.client.jetstream()
    kv = await js.create_key_value(bucket=pools_bucket(bus.prefix))
    sightings = NodeSightings(updated_at=max(seen.values()), pass_interval_s=2, seen=seen)
    await kv.put(SIGHTINGS_KEY, sightings.model_dump_json().encode())


async def test_a_node_not_seen_lately_is_billed_to_its_sighting_and_listed_by_check(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    told = Story(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1))
    await jetstream_bus.publish(told.launched("gpu-spot-9", 0))
    await post_sightings(jetstream_bus, {"gpu-spot-9": told.t(1800)})
    first = cost_json(bus_settings, "--by", "pool")
    assert first == [
        {
            "pool": "gpu-spot",
            "cost_usd": 0.36,  # half an hour at $0.72/h, not the hour since launch
            "idle_usd": 0.36,
            "gpu_hours": 1.0,
            "waste_usd": 0.0,
            "saving_vs_on_demand_usd": 0.54,
        }
    ]
    async with await SpotrainClient.connect(bus_settings) as client:
        before = (await client.costs()).attribution.cost_usd
        await asyncio.sleep(1)
        assert (await client.costs()).attribution.cost_usd == before, "an unseen node grew"
    checked = spotrain(bus_settings, "cost", "--check")
    assert checked.returncode == 1
    [row] = [line for line in checked.stdout.splitlines() if "gpu-spot-9" in line]
    assert "30m0" in row  # unaccounted for since its sighting, half an hour ago
    table = spotrain(bus_settings, "cost")
    assert "have not been seen for up to 30m0" in table.stderr
    await post_sightings(jetstream_bus, {"gpu-spot-9": datetime.now(UTC)})
    fine = spotrain(bus_settings, "cost", "--check")
    assert fine.returncode == 0, fine.stdout
    assert "every node open on the ledger (1) was seen lately" in fine.stdout


async def test_reconcile_matches_a_billing_export_of_the_same_nodes(
    story: Story, bus_settings: BusSettings, tmp_path: Path
) -> None:
    async with await SpotrainClient.connect(bus_settings) as client:
        ledger = await client.costs()
    nodes = [
        BilledNode(n.node, n.pool, n.price_per_hour_usd, n.start, n.end or n.start)
        for n in ledger.inputs.nodes
    ]
    bill = tmp_path / "billing.jsonl"
    bill.write_text(as_json_lines(billing_rows(nodes)))
    result = spotrain(bus_settings, "cost", "--reconcile", str(bill))
    assert result.returncode == 0, result.stdout + result.stderr
    # A node's life may cross midnight UTC (the story ends now): count its days.
    days = len(ledger_by_node_day(ledger.inputs.nodes, ledger.end))
    summary = f"{days} node-days: {days} matched, 0 differs, 0 not in ledger, 0 not billed"
    assert summary in result.stdout.replace("\n", " ")
    flat = tmp_path / "billing.csv"
    billed_more = billing_rows(nodes)
    billed_more[0] = dict(billed_more[0], cost=billed_more[0]["cost"] + 1.0)  # a dollar more
    flat.write_text(as_csv(billed_more))
    short = spotrain(bus_settings, "cost", "--reconcile", str(flat), "--json")
    assert short.returncode == 1
    report = json.loads(short.stdout)
    assert [d["match"] for d in report["node_days"]].count("differs") == 1


async def test_a_billing_export_that_cannot_be_compared_is_one_line(
    story: Story, bus_settings: BusSettings, tmp_path: Path
) -> None:
    bill = tmp_path / "billing.csv"
    bill.write_text("usage_start_time,usage_end_time,cost\n")
    result = spotrain(bus_settings, "cost", "--reconcile", str(bill))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "lacks the column(s) currency" in result.stderr
    assert "Traceback" not in result.stderr
