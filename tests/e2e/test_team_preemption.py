"""Preemption that checkpoints first, end to end on the local stack: the submitter runs on
a teams file whose one team may hold one job's GPUs; a high-priority job of the team
makes the running low-priority one checkpoint and give way (real Ray, real training,
real CHECKPOINT_NOW), runs, and the low one goes on from its checkpoint afterwards,
having lost at most one step; each record and event says `priority`."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.client import SpotrainClient, current_user
from shared.events.data import InterruptionCause
from shared.jobs import AttemptState, JobState
from shared.localstack.nodes import kill_node
from shared.localstack.processes import ProcessRecord
from shared.messaging import BusSettings
from tests.e2e.stack import spotrain, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def restart_submitter(env: dict[str, str]) -> None:
    home = Path(env["SPOTRAIN_LOCAL_HOME"])
    record = ProcessRecord(**json.loads((home / "run/submitter.json").read_text()))
    assert kill_node(record) > 0
    up = spotrain(env, "up")
    assert up.returncode == 0, up.stderr + up.stdout


@pytest.fixture
def teams_stack(local_stack: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The shared stack, its submitter restarted on a teams file for this test only."""
    teams = tmp_path / "teams.toml"
    teams.write_text(
        f'[teams.lab]\nmembers = ["{current_user()}"]\n'
        "[teams.lab.quota.spot]\nguaranteed_gpus = 2\n"
    )
    env = {
        **local_stack,
        "SPOTRAIN_TEAMS_FILE": str(teams),
        "SPOTRAIN_MIN_RUNTIME_BEFORE_PREEMPTION_S": "3",
        "SPOTRAIN_SUBMITTER_GIVE_WAY_GRACE_S": "60",
    }
    restart_submitter(env)
    try:
        yield env
    finally:
        restart_submitter(local_stack)


def submit(env: dict[str, str], workdir: Path, *args: str) -> str:
    done = spotrain(
        env, "submit", "train_digits.py", "--workdir", str(workdir), "--gpus", "2", "--spot",
        *args,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def test_a_high_priority_job_makes_a_running_one_checkpoint_and_give_way(
    teams_stack: dict[str, str], tmp_path: Path
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    shutil.copy(EXAMPLES / "train_digits.py", workdir)
    low = submit(
        teams_stack, workdir, "--priority", "2", "--experiment", "give-way",
        "--", "--steps=160", "--step-delay-s=0.15", "--report-every=1", "--checkpoint-every=20",
    )  # fmt: skip
    settings = BusSettings(nats_url=teams_stack["SPOTRAIN_NATS_URL"])

    async def story() -> str:
        async with await SpotrainClient.connect(settings) as client:
            await until(
                client, low, "progress past its first checkpoint",
                lambda r: (a := r.current) is not None and (a.step or 0) >= 25,
            )  # fmt: skip
            asked_at = time.monotonic()
            high = submit(
                teams_stack, workdir, "--priority", "9",
                "--", "--steps=20", "--step-delay-s=0.05", "--report-every=5",
            )  # fmt: skip
            running = await until(client, high, "start", lambda r: r.state is JobState.RUNNING)
            preemption_s = time.monotonic() - asked_at
            assert len(running.attempts) == 1
            gave_way = await until(client, low, "give way", lambda r: len(r.attempts) >= 2)
            first = gave_way.attempts[0]
            assert first.state is AttemptState.LOST
            assert first.cause is InterruptionCause.PRIORITY
            assert first.give_way_for == high
            assert gave_way.interruptions == 0, "no restart budget spent"
            second = gave_way.attempts[1]
            assert second.resumed_from is not None, "resumes from the checkpoint it wrote"
            reached = first.step or 0
            assert reached - second.from_step <= 1, f"lost {reached - second.from_step} steps"
            await until(client, high, "success", lambda r: r.state is JobState.SUCCEEDED)
            done = await until(
                client, low, "success", lambda r: r.state is JobState.SUCCEEDED, timeout_s=180
            )
            assert done.attempts[1].started_at is not None
            ended = running.attempts[0].started_at
            assert ended is not None
            assert done.attempts[1].started_at > ended, "it went on once the high one ran"
            print(f"priority_preemption_s: {preemption_s:.1f}")
            print(f"priority_victim_steps_lost: {reached - second.from_step}")
            return high

    high = asyncio.run(story())
    shown = spotrain(teams_stack, "show", low)
    assert shown.returncode == 0, shown.stderr
    [first] = [line for line in shown.stdout.splitlines() if "#1 " in line]
    assert f"ended by priority, gave way to {high}" in first
