"""The platform's own queue, end to end on a local stack of its own whose Ray head gives
up on a job that waits 20 s for room (`RAY_JOB_START_TIMEOUT_SECONDS`): jobs held by the
budget for half as long again wait in spotrain's queue with nothing in Ray, run once
the budget allows, in the platform's order (priority first); a job cancelled while queued
leaves no Ray job; a sweep is accepted whole and runs within its owner's quota."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.client import SpotrainClient
from shared.jobs import JobRecord, JobState
from shared.localstack.nodes import kill_node
from shared.localstack.processes import ProcessRecord
from shared.messaging import BusSettings
from tests.e2e.stack import spotrain, stack_env, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RAY_START_TIMEOUT_S = 20
QUICK = ("--", "--steps=20", "--step-delay-s=0.05", "--report-every=5")


@pytest.fixture(scope="module")
def held_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A stack whose scaler may buy nothing (budget $0/h) until a test raises it."""
    env = {
        **stack_env(tmp_path_factory.mktemp("queue-stack") / "stack"),
        "RAY_JOB_START_TIMEOUT_SECONDS": str(RAY_START_TIMEOUT_S),
        "SPOTRAIN_SCALER_BUDGET_PER_HOUR_USD": "0",
        "SPOTRAIN_SUBMITTER_MAX_GPUS_PER_OWNER": "4",
    }
    up = spotrain(env, "up")
    assert up.returncode == 0, up.stderr + up.stdout
    yield env
    spotrain(env, "down")


def restart_scaler(env: dict[str, str], budget_per_hour_usd: float) -> None:
    home = Path(env["SPOTRAIN_LOCAL_HOME"])
    record = ProcessRecord(**json.loads((home / "run/scaler.json").read_text()))
    assert kill_node(record) > 0
    env["SPOTRAIN_SCALER_BUDGET_PER_HOUR_USD"] = str(budget_per_hour_usd)
    up = spotrain(env, "up")
    assert up.returncode == 0, up.stderr + up.stdout


def ray_submissions(env: dict[str, str]) -> list[str]:
    """Every job Ray's Job API knows of, by submission id."""
    url = f"http://127.0.0.1:{env['SPOTRAIN_LOCAL_RAY_DASHBOARD_PORT']}/api/jobs/"
    with urllib.request.urlopen(url, timeout=10) as response:  # the stack's own
        jobs: list[dict[str, Any]] = json.load(response)
    return [job["submission_id"] for job in jobs if job.get("submission_id")]


def submit(env: dict[str, str], workdir: Path, *args: str) -> str:
    done = spotrain(
        env, "submit", "train_digits.py", "--workdir", str(workdir), "--gpus", "2", "--spot", *args
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(EXAMPLES / "train_digits.py", folder)
    return folder


def test_held_jobs_wait_past_rays_start_timeout_then_run_in_the_platforms_order(
    held_stack: dict[str, str], workdir: Path
) -> None:
    env = held_stack
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])
    low = submit(env, workdir, "--priority", "2", "--experiment", "held", *QUICK)
    high = submit(env, workdir, "--priority", "8", "--experiment", "held", *QUICK)
    cancelled = submit(env, workdir, "--priority", "9", *QUICK)

    async def story() -> tuple[JobRecord, JobRecord]:
        async with await SpotrainClient.connect(settings) as client:
            gone = spotrain(env, "cancel", cancelled)
            assert gone.returncode == 0, gone.stderr
            await until(client, cancelled, "cancel", lambda r: r.state is JobState.CANCELLED)
            # Past Ray's start timeout, which its job manager checks every second: in Ray,
            # these jobs would have failed by now.
            await asyncio.sleep(1.5 * RAY_START_TIMEOUT_S)
            for job_id in (low, high):
                record = await client.job(job_id)
                assert record is not None
                assert record.state is JobState.QUEUED, record
                assert [a.state.value for a in record.attempts] == ["queued"]
            assert ray_submissions(env) == [], "nothing of a queued job is in Ray"
            shown = spotrain(env, "show", low)
            assert shown.returncode == 0, shown.stderr
            assert "queue: #2 of 2: over-budget: " in shown.stdout, shown.stdout
            listed = spotrain(env, "ls", "-o", "json")
            places = {row["job"]: row["queue"] for row in json.loads(listed.stdout)}
            assert (places[high], places[low]) == ("#1 of 2", "#2 of 2")
            # One node's worth of budget: the two jobs share it, one after the other.
            restart_scaler(env, budget_per_hour_usd=0.5)
            done_high = await until(client, high, "end", lambda r: not r.is_active, 180)
            done_low = await until(client, low, "end", lambda r: not r.is_active, 180)
            return done_high, done_low

    done_high, done_low = asyncio.run(story())
    assert (done_high.state, done_low.state) == (JobState.SUCCEEDED, JobState.SUCCEEDED)
    assert len(done_high.attempts) == len(done_low.attempts) == 1, "no failure, no restart"
    high_start, low_start = done_high.attempts[0].started_at, done_low.attempts[0].started_at
    assert high_start is not None
    assert low_start is not None
    assert high_start < low_start, "the higher priority job took the one node first"
    submitted = ray_submissions(env)
    assert not any(s.startswith(cancelled) for s in submitted), "a cancelled queued job"
    assert sorted(submitted) == sorted([f"{high}-1", f"{low}-1"])


def test_a_sweep_is_accepted_whole_and_runs_within_its_owners_quota(
    held_stack: dict[str, str], workdir: Path
) -> None:
    """Six one-GPU points under an owner quota of 4 GPUs, room for all six: all accepted
    at once, at most four running at a time, all succeed, followed as one experiment."""
    env = held_stack
    restart_scaler(env, budget_per_hour_usd=1.1)  # three spot nodes, six GPUs
    done = spotrain(
        env, "submit", "train_digits.py", "--workdir", str(workdir), "--gpus", "1", "--spot",
        "--experiment", "lr-sweep", "--sweep", "lr=0.1,0.2,0.3", "--sweep", "seed=1,2",
        "--", "--steps=20", "--step-delay-s=0.1", "--report-every=5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    *job_ids, experiment = done.stdout.split()
    assert experiment == "lr-sweep"
    assert len(job_ids) == 6
    assert "sweep of 6: 6 accepted, 0 rejected" in done.stderr
    watched = spotrain(env, "watch", "--experiment", "lr-sweep", timeout_s=300)
    assert watched.returncode == 0, watched.stderr + watched.stdout
    assert watched.stdout.splitlines()[-1] == "lr-sweep: 6 jobs: 6 succeeded"
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])

    async def records() -> list[JobRecord]:
        async with await SpotrainClient.connect(settings) as client:
            found = [await client.job(job_id) for job_id in job_ids]
        return [record for record in found if record is not None]

    ran = asyncio.run(records())
    assert sorted(record.request.labels["sweep.lr"] for record in ran) == [
        "0.1", "0.1", "0.2", "0.2", "0.3", "0.3",
    ]  # fmt: skip
    spans = [
        (a.started_at, a.ended_at) for r in ran for a in r.attempts if a.started_at and a.ended_at
    ]
    assert len(spans) == 6
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert most <= 4, f"{most} of the sweep ran at once; the owner's quota is 4 GPUs"
    cost = spotrain(env, "cost", "--by", "experiment", "-o", "json")
    assert cost.returncode == 0, cost.stderr
    assert "lr-sweep" in cost.stdout
