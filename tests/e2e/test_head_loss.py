"""The Ray head lost mid-batch, on the local stack, in both of its modes: every process of
the head SIGKILLed (as a pod's are when it is evicted or its node goes) while checkpointing
jobs run and others wait in the platform's queue; a job asked for meanwhile; then a head
started again by `spotrain up`.

- Without fault tolerance (the default) the head comes back empty: every attempt that was
  running is resumed from its checkpoint once, as cause head-lost, on the platform's
  account (the jobs allow no restart at all), and the nodes are not lost: each joins the
  new head as a pod's restarted container would.
- With it (`--ray-ft`, the head's state in Redis) the running attempts carry on.

Either way every job ends as its code says, with the result of an uninterrupted run, and
no job ever runs two attempts at once (the processes are watched throughout)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.checkpoints import latest_checkpoint, load_checkpoint
from shared.client import SpotrainClient
from shared.events.data import InterruptionCause, JobRequested
from shared.events.types import ObjectRef
from shared.jobs import AttemptState, JobRecord
from shared.localstack.nodes import kill_node
from shared.localstack.ports import free_port
from shared.localstack.processes import ProcessRecord, is_running
from shared.localstack.redis import find_binary
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings
from tests.async_helpers import eventually
from tests.e2e import training
from tests.e2e.stack import sessions, spotrain
from tests.e2e.training import AttemptWatch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).parents[2] / "examples"
RUNNING = ("head-run-0", "head-run-1")
QUEUED = "head-queued"
ASKED_WHILE_AWAY = "head-asked-away"
STEPS = 300
"""The running jobs': long enough to run through the head's loss and return."""
SHORT_STEPS = 60
"""The jobs that wait meanwhile: they only have to run, once the head is back."""
POOLS = """
[[pool]]
name = "gpu-spot"
capacity = "spot"
gpus = 2
cpus = 2
price_per_hour_usd = 0.34
boot_time_s = 10
min_nodes = 0
max_nodes = 2
"""
"""Two nodes, one job each: a third job waits in the platform's queue."""


def digits_job(job_id: str, workspace: ObjectRef, steps: int = STEPS) -> JobRequested:
    # No restart allowed: a head's loss must not be counted as the job's.
    return training.digits_job(
        job_id, workspace, owner="head", experiment="head-loss", seed=5, steps=steps,
        step_delay_s=0.1, gpus=2, max_restarts=0,
    )  # fmt: skip


@pytest.fixture(params=["plain", "ft"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalStackSettings]:
    mode = str(request.param)
    settings = isolated_stack(tmp_path / "stack")
    pools = tmp_path / "pools.toml"
    pools.write_text(POOLS)
    env = env_of(settings, pools)
    up = spotrain(env, "up", *(["--ray-ft"] if mode == "ft" else []), timeout_s=180)
    if up.returncode != 0:
        spotrain(env, "down")
        pytest.fail(f"spotrain up ({mode}): {up.stderr}{up.stdout}")
    try:
        yield settings.model_copy(update={"ray_ft": mode == "ft"})
    finally:
        spotrain(env, "down")


def env_of(settings: LocalStackSettings, pools: Path | None = None) -> dict[str, str]:
    env = {**os.environ, **settings.environment()}
    if pools is not None:
        env["SPOTRAIN_SCALER_POOLS_FILE"] = str(pools)
    # A raylet waits this long for a head without its state before it gives up and its
    # node starts it again (Ray's default is 60 s): the plain mode's recovery, shorter.
    env.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "20")
    return env


def kill_the_head(settings: LocalStackSettings) -> int:
    record = ProcessRecord.load(settings.run_dir / "ray-head.json")
    assert record is not None
    assert is_running(record)
    return kill_node(record)


async def test_a_head_lost_mid_batch_loses_no_job_and_runs_none_twice(
    stack: LocalStackSettings, tmp_path: Path
) -> None:
    ft = stack.is_ray_ft
    env = env_of(stack, tmp_path / "pools.toml")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLES / "train_digits.py", project)
    bus = BusSettings(nats_url=stack.nats_url, connect_timeout_s=10)
    with AttemptWatch() as watch:
        async with await SpotrainClient.connect(bus) as client:
            workspace = await client.upload_workspace(project, owner="head")
            for job_id in RUNNING:
                await client.submit(digits_job(job_id, workspace), answer_timeout_s=30)
            await client.submit(digits_job(QUEUED, workspace, SHORT_STEPS), answer_timeout_s=30)

            async def running_past_a_checkpoint() -> bool:
                records = {r.job_id: r for r in await client.jobs()}
                return all(
                    (current := records[job_id].current) is not None
                    and current.state is AttemptState.RUNNING
                    and (current.step or 0) >= 20
                    for job_id in RUNNING
                    if job_id in records
                ) and set(RUNNING) <= set(records)

            await eventually(running_past_a_checkpoint, timeout_s=240, interval_s=1)
            queued = await client.job(QUEUED)
            assert queued is not None
            assert queued.state.value == "queued", "two nodes, two jobs: the third waits"

            killed = await asyncio.to_thread(kill_the_head, stack)
            assert killed > 0
            # The platform rides it out: a job asked for is queued, nothing fails.
            asked = digits_job(ASKED_WHILE_AWAY, workspace, SHORT_STEPS)
            await client.submit(asked, answer_timeout_s=30)

            async def top_says_the_head_is_away() -> bool:
                top = await asyncio.to_thread(spotrain, env, "top", "--once")
                return "Ray's head is away since" in top.stdout

            await eventually(top_says_the_head_is_away, timeout_s=60, interval_s=1)
            during = {r.job_id: r for r in await client.jobs()}
            assert not any(r.state.value == "failed" for r in during.values()), during
            assert during[ASKED_WHILE_AWAY].state.value == "queued", "the queue keeps queuing"
            pools = await asyncio.to_thread(spotrain, env, "pools")
            assert "Ray's head is away since" in pools.stdout, pools.stdout
            shown = await asyncio.to_thread(spotrain, env, "status")
            assert shown.returncode == 1
            [head] = [line for line in shown.stdout.splitlines() if "ray-head" in line]
            assert "stopped" in head, shown.stdout

            up = await asyncio.to_thread(spotrain, env, "up", timeout_s=180)
            assert up.returncode == 0, up.stderr

            every = (*RUNNING, QUEUED, ASKED_WHILE_AWAY)

            async def all_ended() -> bool:
                records = [r for r in await client.jobs() if r.job_id in every]
                return len(records) == len(every) and not any(r.is_active for r in records)

            await eventually(all_ended, timeout_s=400, interval_s=1)
            records = {r.job_id: r for r in await client.jobs() if r.job_id in every}

    for job_id, record in records.items():
        assert record.state.value == "succeeded", (job_id, record.detail, record.attempts)
        assert record.interruptions == 0, f"{job_id}: the head's loss spent its restart budget"
        assert matches_an_uninterrupted_run(record, project), job_id
    for job_id in RUNNING:
        causes = [a.cause for a in records[job_id].attempts if a.state is AttemptState.LOST]
        if ft:
            assert causes == [], f"{job_id} carried on with its head's state: {causes}"
            assert len(records[job_id].attempts) == 1
        else:
            assert causes == [InterruptionCause.HEAD_LOST], records[job_id].attempts
            assert records[job_id].attempts[-1].from_step >= 20, "resumed from its checkpoint"
    # What the first attempts printed outlives Ray's memory of them (a head back without
    # its state has none): the platform kept it beside their checkpoints.
    first = await asyncio.to_thread(spotrain, env, "logs", RUNNING[0], "--attempt", "1")
    assert first.returncode == 0, first.stderr
    assert "attempt 1: starting at step 0" in first.stdout
    assert watch.overlaps == [], "a job ran two attempts at once"
    assert set(watch.seen) >= set(every), watch.seen


def matches_an_uninterrupted_run(record: JobRecord, project: Path) -> bool:
    """The job's final checkpoint is the one its script writes uninterrupted."""
    assert record.checkpoint_uri is not None
    steps = next(
        int(arg.removeprefix("--steps="))
        for arg in record.request.entrypoint
        if arg.startswith("--steps=")
    )
    final = latest_checkpoint(record.checkpoint_uri)
    if final is None or final.step != steps:
        return False
    reference = project.parent / f"reference-{steps}"  # every job runs the same seed
    if not reference.exists():
        env = {
            **os.environ,
            "SPOTRAIN_JOB_ID": "reference",
            "SPOTRAIN_ATTEMPT": "1",
            "SPOTRAIN_CHECKPOINT_URI": reference.resolve().as_uri(),
        }
        argv = [sys.executable, *record.request.entrypoint[1:]]
        argv = [a for a in argv if not a.startswith("--step-delay-s")]
        subprocess.run(argv, cwd=project, env=env, check=True, capture_output=True, timeout=120)
    expected = latest_checkpoint(reference.resolve().as_uri())
    assert expected is not None
    return bool(load_checkpoint(expected) == load_checkpoint(final))


@pytest.mark.parametrize("password", [None, "wrong"], ids=["nothing-there", "wrong-password"])
def test_up_never_starts_a_head_without_the_redis_that_keeps_its_state(
    tmp_path: Path, password: str | None
) -> None:
    settings = isolated_stack(tmp_path / "stack")
    port = free_port()
    env = {
        **env_of(settings),
        "SPOTRAIN_LOCAL_RAY_REDIS_ADDRESS": f"127.0.0.1:{port}",
        "SPOTRAIN_LOCAL_RAY_REDIS_PASSWORD": password or "",
    }
    server = None
    if password is not None:
        binary = find_binary(settings)
        assert binary is not None, "run tools/install-redis .tools/bin (make test does)"
        server = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", "right",
             "--save", ""],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        if server is not None:
            wait_for_port(port)
        up = spotrain(env, "up", "--ray-ft", timeout_s=180)
        left = sessions(settings.home)
    finally:
        spotrain(env, "down")
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    assert up.returncode == 1, up.stdout
    # After the progress lines (`starting nats`), the refusal, in one line.
    line = up.stderr.strip().splitlines()[-1]
    assert "Traceback" not in up.stderr
    why = "refuses the password" if password else "nothing answers as Redis at"
    assert line.startswith("spotrain: error: --ray-ft: "), line
    assert why in line
    assert line.endswith("the Ray head is not started without the Redis that keeps its state")
    assert left == {}, "what it started (the bus) is stopped again"


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


def test_a_secure_stack_is_not_offered_fault_tolerance(tmp_path: Path) -> None:
    """Ray keeps the Redis password on its head's command line, readable by job code on the
    head: the secure stack refuses rather than hand it over."""
    settings = isolated_stack(tmp_path / "stack")
    env = env_of(settings)
    try:
        up = spotrain(env, "up", "--secure", "--ray-ft")
        left = sessions(settings.home)
    finally:
        spotrain(env, "down")
    assert up.returncode == 2
    assert (
        up.stderr.strip()
        .splitlines()[-1]
        .startswith("spotrain: error: --ray-ft is not offered on a --secure stack")
    )
    assert left == {}
