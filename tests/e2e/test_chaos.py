"""Chaos on the local stack: a batch of jobs of mixed sizes while spot nodes are preempted
(with and without notice), the NATS server is restarted, and every service is killed and
started again. Afterwards every job ended as its own code says, no attempt reached Ray
twice, no request lost its outcome, and every node-second is on the bill.

Bounded: a dozen short jobs and one fixed, seeded schedule of disruptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import statistics
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from shared.client import SpotrainClient
from shared.events import Event, decode
from shared.events.data import (
    JobCancelled,
    JobFailed,
    JobRejected,
    JobRequested,
    JobResumed,
    JobSucceeded,
    NodeLost,
)
from shared.events.types import Bundle, CapacityClass, ObjectRef
from shared.localstack.nodes import NodeFolder, kill_node, pick_node, preempt
from shared.localstack.processes import ProcessRecord
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.policy.cost import Ledger
from tests.e2e.stack import spotrain, stack_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = Path(__file__).parents[2] / "examples"
SERVICES = ("submitter", "scaler", "preemption_watcher", "checkpointer")
TERMINAL = (JobSucceeded, JobFailed, JobCancelled, JobRejected)


@dataclass
class Chaos:
    """What was done to the stack, and when."""

    preemptions: list[tuple[str, datetime]] = field(default_factory=list)
    restarts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def owner_of(job_id: str) -> str:
    # Spread over owners: one owner's dozen jobs at once would pass their GPU quota.
    return f"team-{sum(map(ord, job_id)) % 6}"


def job_requests(workdir_refs: Mapping[str, ObjectRef]) -> list[JobRequested]:
    def digits(job_id: str, gpus: int, steps: int, capacity: CapacityClass) -> JobRequested:
        return JobRequested(
            job_id=job_id,
            owner=owner_of(job_id),
            experiment="chaos",
            entrypoint=(
                "python",
                "train_digits.py",
                "--seed",
                "3",
                f"--steps={steps}",
                "--checkpoint-every=10",
                "--report-every=5",
                "--step-delay-s=0.05",
            ),
            working_dir=workdir_refs[owner_of(job_id)],  # a job runs its owner's only
            worker=Bundle(gpus=gpus, cpus=1),
            capacity=capacity,
            max_restarts=5,
        )

    requests = [
        digits(f"chaos-{n:02d}", gpus=1 + n % 2, steps=60 + 10 * (n % 4), capacity=cap)
        for n, cap in enumerate([CapacityClass.SPOT] * 6 + [CapacityClass.ANY] * 3)
    ]
    requests.append(digits("chaos-cpu-0", gpus=0, steps=40, capacity=CapacityClass.ON_DEMAND))
    # Two workers, all placed or none: the scaler must grow room for both.
    requests.append(
        digits("chaos-multi", gpus=1, steps=40, capacity=CapacityClass.SPOT).model_copy(
            update={"num_workers": 2}
        )
    )
    # One job that fails by its own code: failed, never resumed.
    requests.append(
        digits("chaos-bug", gpus=1, steps=40, capacity=CapacityClass.SPOT).model_copy(
            update={"entrypoint": ("python", "-c", "raise SystemExit(3)")}
        )
    )
    return requests


def disrupt(env: dict[str, str], chaos: Chaos, stop: threading.Event, seed: int) -> None:
    """The schedule: preemptions with and without notice, NATS restarted, each service
    killed (SIGKILL) and started again by `spotrain up`."""
    rng = random.Random(seed)  # noqa: S311  # a reproducible schedule, not a secret
    home = Path(env["SPOTRAIN_LOCAL_HOME"])
    folder = NodeFolder(LocalStackSettings(home=home).node_dir)
    victims = [
        "preempt", "nats", "submitter", "preempt-notice", "scaler",
        "preemption_watcher", "preempt", "checkpointer", "preempt",
    ]  # fmt: skip
    # Disruptions start once a job runs, so that they fall on running work.
    while not first_job_running.wait(0.5):
        if stop.is_set():
            return
    time.sleep(2)
    for victim in victims:
        if stop.wait(rng.uniform(1, 2)):
            return
        if victim in ("preempt", "preempt-notice"):
            try:
                node = pick_node(folder, None, capacity="spot")
            except LookupError:
                continue  # no spot node running at that moment: nothing to preempt
            notice_s = 3 if victim == "preempt-notice" else 0
            done = preempt(folder, node, notice_s=notice_s)
            chaos.preemptions.append((done.node, done.killed_at))
            continue
        record = ProcessRecord(**json.loads((home / "run" / f"{victim}.json").read_text()))
        kill_node(record)  # the whole session, at once
        time.sleep(1)
        up = spotrain(env, "up", timeout_s=120)
        if up.returncode != 0:
            chaos.errors.append(f"up after killing {victim}: {up.stderr[-500:]}")
        chaos.restarts.append(victim)


def ray_logs(env: dict[str, str], submission_id: str) -> str:
    url = f"http://127.0.0.1:{env['SPOTRAIN_LOCAL_RAY_DASHBOARD_PORT']}"
    try:
        with urllib.request.urlopen(f"{url}/api/jobs/{submission_id}/logs", timeout=5) as r:  # noqa: S310  # the local dashboard
            return str(json.load(r).get("logs", ""))
    except OSError as error:
        return f"(no logs: {error})"


failures: dict[str, str] = {}
"""Why each failed job failed, for the assertion message."""
first_job_running = threading.Event()
attempt_states: dict[str, list[str]] = {}


async def outcomes(env: dict[str, str], job_ids: set[str], timeout_s: float) -> dict[str, str]:
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])
    deadline = time.monotonic() + timeout_s
    ended: dict[str, str] = {}
    failures.clear()
    first_job_running.clear()
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # NATS may be restarting: look again
            async with await SpotrainClient.connect(settings) as client:
                for record in await client.jobs():
                    if record.job_id in job_ids and record.state.value != "queued":
                        first_job_running.set()
                    if record.job_id in job_ids and not record.is_active:
                        ended[record.job_id] = record.state.value
                        attempt_states[record.job_id] = [a.state.value for a in record.attempts]
                        if record.state.value == "failed" and record.current is not None:
                            logs = ray_logs(env, record.current.submission_id)
                            message = (record.current.message or "")[:300]
                            failures[record.job_id] = (
                                f"{len(record.attempts)} attempts; {record.detail or ''} "
                                f"ray: {message} logs: {logs[-300:]}"
                            )
        if ended.keys() >= job_ids:
            return ended
        await asyncio.sleep(2)
    return ended


def test_jobs_survive_preemptions_and_restarts_of_nats_and_every_service(
    tmp_path: Path,
) -> None:
    env = stack_env(tmp_path / "stack")
    up = spotrain(env, "up")
    assert up.returncode == 0, up.stderr + up.stdout
    stop = threading.Event()
    chaos = Chaos()
    try:
        project = tmp_path / "project"
        project.mkdir()
        shutil.copy(EXAMPLES / "train_digits.py", project)
        settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])

        async def submit_all() -> list[JobRequested]:
            async with await SpotrainClient.connect(settings) as client:
                owners = {f"team-{n}" for n in range(6)}
                refs = {o: await client.upload_workspace(project, owner=o) for o in owners}
                requests = job_requests(refs)
                for request in requests:
                    await client.submit(request, answer_timeout_s=0.01)
                return requests

        requests = asyncio.run(submit_all())
        started = time.monotonic()
        chaotic = threading.Thread(target=disrupt, args=(env, chaos, stop, 7), daemon=True)
        chaotic.start()
        ended = asyncio.run(outcomes(env, {r.job_id for r in requests}, timeout_s=420))
        chaotic.join(timeout=120)  # the whole schedule runs, even if the jobs finish first
        stop.set()
        elapsed = time.monotonic() - started

        async def evidence() -> tuple[list[Event[Any]], Ledger]:
            bus = await JetStreamBus.connect(settings, name="chaos-test")
            try:
                stored = [
                    *await bus.read(f"{bus.prefix}.job.>"),
                    *await bus.read(f"{bus.prefix}.node.>"),
                ]
            finally:
                await bus.close()
            async with await SpotrainClient.connect(settings) as client:
                return [decode(m.data) for m in stored], await client.costs()

        events, ledger = asyncio.run(evidence())
    finally:
        stop.set()
        spotrain(env, "down")

    assert chaos.errors == []
    job_ids = {r.job_id for r in requests}
    assert ended.keys() == job_ids, f"jobs without an outcome: {sorted(job_ids - ended.keys())}"
    assert ended.pop("chaos-bug") == "failed"
    assert set(ended.values()) == {"succeeded"}, failures

    terminal = {e.data.job_id for e in events if isinstance(e.data, TERMINAL)}
    assert terminal >= job_ids, "every request has its outcome on the bus"
    resumes = [e.data for e in events if isinstance(e.data, JobResumed)]
    keys = [(r.job_id, r.attempt) for r in resumes]
    assert len(keys) == len(set(keys)), "no attempt resumed twice"
    # Its node may go before it fails (then a resume is right), but once it failed by its
    # own code, nothing follows.
    *before, last = attempt_states["chaos-bug"]
    assert (set(before) <= {"lost"}, last) == (True, "failed"), attempt_states["chaos-bug"]
    assert not ledger.attribution.unbilled, "every attempt ran on a billed node"
    assert ledger.attribution.cost_usd > 0

    losses = {e.data.node: e.time for e in events if isinstance(e.data, NodeLost)}
    recovery = []
    for node, killed_at in chaos.preemptions:
        lost_at = losses.get(node, killed_at)
        after = [e.time for e in events if isinstance(e.data, JobResumed) and e.time >= lost_at]
        if after:
            recovery.append((min(after) - killed_at).total_seconds())
    print(f"jobs_completed: {len(ended) + 1}")
    print(f"preemptions_survived: {len(chaos.preemptions)}")
    print(f"restarts_survived: {len(chaos.restarts)} ({', '.join(chaos.restarts)})")
    if recovery:
        print(f"recovery_s_p50: {statistics.median(recovery):.2f}")
        print(f"recovery_s_p95: {sorted(recovery)[int(0.95 * (len(recovery) - 1))]:.2f}")
    print(f"chaos_wall_s: {elapsed:.0f}")
    assert len(chaos.restarts) == 1 + len(SERVICES), "NATS and every service restarted once"
