"""Issue 31 end to end on the local stack: training scripts that nobody wrote for spotrain
survive a spot loss with their own checkpoints.

- A Ray Train script as Ray's documentation writes one (no spotrain import), `--workers 2`
  on spot: one worker's node is killed without notice, or preempted with one. It resumes
  from its own latest checkpoint and ends as its code says; the loss is never a failure.
- PyTorch's torchrun tutorial script, saving its snapshot to SPOTRAIN_CHECKPOINT_DIR: its
  node is preempted with a notice, which reaches it as SIGTERM; the next attempt, on
  another node, starts from the snapshot kept in the checkpoint store.

The workers ask for CPUs only: the local nodes declare GPUs they do not have."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from shared.checkpoints import storage_for
from shared.client import SpotrainClient
from shared.events import Event
from shared.events.data import JobFailed, JobResized, JobSucceeded
from shared.jobs import AttemptState, JobRecord, JobState
from shared.messaging import BusSettings
from tests.e2e.stack import spotrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

BYO = Path(__file__).resolve().parents[2] / "examples" / "byo"


async def _history(env: dict[str, str], job_id: str) -> tuple[JobRecord | None, list[Event[Any]]]:
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])
    async with await SpotrainClient.connect(settings) as client:
        return await client.job(job_id), await client.history(job_id)


def wait_for(env: dict[str, str], job_id: str, what: str, ok: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        record, events = asyncio.run(_history(env, job_id))
        if record is not None and ok(record, events):
            return record, events
        if time.monotonic() >= deadline:
            top = spotrain(env, "top", "--once").stdout
            pytest.fail(f"{job_id}: no {what}: {record}\n{top}")
        time.sleep(0.5)


def saved(record: JobRecord, key: str) -> bool:
    """Whether the job's checkpoint store holds `key` (under its root) yet."""
    assert record.checkpoint_uri is not None
    storage, root = storage_for(record.checkpoint_uri)
    return storage.get(f"{root}/{key}") is not None


def ended(record: JobRecord, _: list[Event[Any]]) -> bool:
    return not record.is_active


def submit(env: dict[str, str], *argv: str) -> str:
    submitted = spotrain(env, "submit", *argv)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.split()[-1]


def lose_a_worker_node(env: dict[str, str], notice: str) -> tuple[JobRecord, list[Event[Any]]]:
    job_id = submit(
        env, "ray_train_as_documented.py", "--workdir", str(BYO),
        "--workers", "2", "--gpus", "0", "--cpus", "1", "--spot",
        "--", "--epochs", "80", "--epoch-delay-s", "0.15",
    )  # fmt: skip
    try:
        # The platform learns where the workers are from Ray (the script reports nothing
        # to it), and the run has saved a checkpoint of its own where the platform said.
        _, events = wait_for(
            env, job_id, "workers counted and a checkpoint",
            lambda record, events: any(
                isinstance(e.data, JobResized) and e.data.workers == 2 for e in events
            )
            and saved(record, "ray-train/checkpoint_manager_snapshot.json"),
            timeout_s=240,
        )  # fmt: skip
        counted = next(e.data for e in events if isinstance(e.data, JobResized))
        assert len(counted.nodes) == 2, counted
        gone = spotrain(env, "preempt", counted.nodes[-1], "--notice", notice)
        assert gone.returncode == 0, gone.stderr
        record, events = wait_for(env, job_id, "end", ended, timeout_s=300)
    finally:
        spotrain(env, "cancel", job_id)
    assert record.state is JobState.SUCCEEDED, record
    assert not [e for e in events if isinstance(e.data, JobFailed)]
    assert any(isinstance(e.data, JobSucceeded) for e in events)
    logs = spotrain(env, "logs", job_id).stdout
    began = [int(n) for n in re.findall(r"started at epoch (\d+), ended at 79", logs)]
    assert began, logs[-3000:]
    assert began[-1] > 0, "it went on from its own checkpoint, not from the start"
    return record, events


def test_a_ray_train_script_as_documented_survives_a_worker_node_lost_without_notice(
    local_stack: dict[str, str],
) -> None:
    record, _ = lose_a_worker_node(local_stack, "0")
    # Ray Train gave up at once (the script's FailureConfig allows no failure): the attempt
    # is lost to the node, and the next attempt's driver restores the run.
    [lost, last] = record.attempts[-2:]
    assert lost.state is AttemptState.LOST, lost
    assert lost.cause is not None
    assert lost.cause.value == "node-lost", lost
    assert last.state is AttemptState.SUCCEEDED


def test_a_ray_train_script_as_documented_survives_a_worker_node_preempted_with_notice(
    local_stack: dict[str, str],
) -> None:
    record, events = lose_a_worker_node(local_stack, "5s")
    # Ray Train restarts its group in the same attempt on a preemption, which spends no
    # failure of the script's; the platform saw the group shrink and asked for room.
    assert len(record.attempts) == 1, record.attempts
    counts = [e.data.workers for e in events if isinstance(e.data, JobResized)]
    assert counts[0] == 2
    assert min(counts) < 2, counts
    assert counts[-1] == 2, counts


def test_a_torchrun_script_resumes_from_the_snapshot_it_saved_to_the_checkpoint_dir(
    local_stack: dict[str, str],
) -> None:
    job_id = submit(
        local_stack, "torchrun", "--workdir", str(BYO), "--gpus", "0", "--cpus", "2", "--spot",
        "--", "--standalone", "--nproc_per_node=2", "torchrun_ddp.py", "300", "5",
        "--epoch_delay_s", "0.1",
    )  # fmt: skip
    try:
        record, _ = wait_for(
            local_stack, job_id, "a snapshot kept in the store",
            lambda record, _: record.state is JobState.RUNNING
            and saved(record, "checkpoint-dir/snapshot.pt")
            and record.current is not None
            and bool(record.current.nodes),
            timeout_s=240,
        )  # fmt: skip
        assert record.current is not None
        gone = spotrain(local_stack, "preempt", record.current.nodes[0], "--notice", "5s")
        assert gone.returncode == 0, gone.stderr
        record, events = wait_for(local_stack, job_id, "end", ended, timeout_s=300)
        said = f"{gone.stdout}\n{spotrain(local_stack, 'show', job_id).stdout}"
    finally:
        spotrain(local_stack, "cancel", job_id)
    assert record.state is JobState.SUCCEEDED, record
    assert not [e for e in events if isinstance(e.data, JobFailed)]
    assert len(record.attempts) >= 2, said
    [lost, last] = record.attempts[-2:]
    assert lost.cause is not None
    assert lost.cause.value == "preempted", lost
    assert last.state is AttemptState.SUCCEEDED
    logs = spotrain(local_stack, "logs", job_id).stdout
    # (The first attempt's own logs, SIGTERM and all, went with its node: Ray kept them there.)
    resumed = [int(n) for n in re.findall(r"Resuming training from snapshot at Epoch (\d+)", logs)]
    assert resumed, logs[-3000:]
    assert resumed[-1] > 0
    assert "Trained from epoch" in logs
