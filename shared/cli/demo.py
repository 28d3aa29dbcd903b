"""`spotrain demo`: a real training job on a spot node, the node preempted mid-run, the job
resumed on another node from its latest checkpoint, and its result checked against an
uninterrupted run of the same seed.

It prints the story with timings, then one `name: value` line per figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from shared.checkpoints import latest_checkpoint, load_checkpoint
from shared.cli.console import CliError
from shared.client import PlatformError, SpotrainClient
from shared.events import Event, EventData, new_event_id
from shared.events.data import (
    JobFailed,
    JobInterrupted,
    JobProgress,
    JobRequested,
    JobResumed,
    JobStarted,
    JobSucceeded,
)
from shared.events.types import Bundle, CapacityClass
from shared.localstack.nodes import NodeFolder, NoSuchNodeError, Preemption, pick_node, preempt
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from shared.messaging.jetstream import BusUnavailableError

SCRIPT = "train_digits.py"


@dataclass(frozen=True)
class DemoRun:
    """The training run the demo preempts: small, seeded, and slow enough to be caught."""

    seed: int = 7
    steps: int = 240
    checkpoint_every: int = 20
    step_delay_s: float = 0.05
    preempt_at_steps: tuple[int, ...] = (70,)
    """Attempt k's node is preempted once attempt k reports this step (the k-th value)."""

    def argv(self, *, delay: bool) -> list[str]:
        return [
            "python",
            SCRIPT,
            f"--seed={self.seed}",
            f"--steps={self.steps}",
            f"--checkpoint-every={self.checkpoint_every}",
            "--report-every=1",
            f"--step-delay-s={self.step_delay_s if delay else 0}",
        ]


@dataclass
class Story:
    """What happened, as the bus told it, with seconds since the job was submitted."""

    out: Console
    started: float = field(default_factory=time.monotonic)
    preemptions: list[Preemption] = field(default_factory=list)
    resumes: list[tuple[JobResumed, datetime]] = field(default_factory=list)
    node_of_attempt: dict[int, str] = field(default_factory=dict)
    first_seen: dict[tuple[str, int], datetime] = field(default_factory=dict)
    result_matches: bool | None = None
    """When each kind of event was first published for each attempt (`started`, ...)."""

    def resume_after_loss_s(self) -> float:
        """The slowest resume: from each kill to the `job.resumed` of the attempt it hit."""
        waits = []
        for number, preemption in enumerate(self.preemptions, start=1):
            times = [at for resumed, at in self.resumes if resumed.attempt == number + 1]
            if not times:
                return float("nan")
            waits.append((times[0] - preemption.killed_at).total_seconds())
        return max(waits, default=float("nan"))

    def say(self, text: str) -> None:
        self.out.print(f"[dim]{time.monotonic() - self.started:6.1f}s[/] {text}")

    def tell(self, event: Event[EventData]) -> None:
        data = event.data
        if (attempt := getattr(data, "attempt", None)) is not None:
            self.first_seen.setdefault((data.event, attempt), event.time)
        match data:
            case JobStarted(attempt=attempt, nodes=nodes):
                where = f" on {nodes[0]}" if nodes else ""
                self.say(f"attempt {attempt} started{where}")
            case JobInterrupted(attempt=attempt, node=node, cause=cause):
                self.say(f"attempt {attempt} interrupted: {cause.value} ({node})")
            case JobResumed():
                self.resumes.append((data, event.time))
                origin = f"step {data.from_step}" if data.from_checkpoint else "scratch"
                self.say(
                    f"resumed as attempt {data.attempt} from {origin} on {data.capacity.value} "
                    f"capacity ({data.steps_lost} steps lost)"
                )
            case JobSucceeded(attempt=attempt):
                self.say(f"succeeded on attempt {attempt}")
            case JobFailed(message=message):
                self.say(f"[red]failed:[/] {message.strip().splitlines()[-1]}")
            case JobProgress():
                pass
            case _:
                self.say(event.type.split(".")[2])


async def run_demo(
    out: Console, *, workdir: Path, notice_s: float, timeout_s: float, run: DemoRun = DemoRun()
) -> Story:
    if not (workdir / SCRIPT).is_file():
        msg = f"{workdir / SCRIPT} not found; run the demo from the project root or pass --workdir"
        raise CliError(msg)
    settings = LocalStackSettings()
    async with await connect_to_stack("spotrain up") as client:
        job_id = f"demo-{new_event_id()[:8]}"
        request = JobRequested(
            job_id=job_id,
            owner="demo",
            experiment="preemption-demo",
            entrypoint=tuple(run.argv(delay=True)),
            working_dir=await client.upload_workspace(workdir, owner="demo"),
            worker=Bundle(gpus=1, cpus=1),
            capacity=CapacityClass.SPOT,
        )
        story = Story(out)
        await submit_accepted(client, request)
        story.say(f"submitted {job_id}: {SCRIPT}, seed {run.seed}, {run.steps} steps, spot")
        followed = _follow(
            client, job_id, story, run=run, folder=NodeFolder(settings.node_dir), notice_s=notice_s
        )
        await within(followed, job_id, timeout_s)
        record = await client.job(job_id)
    if record is None or record.checkpoint_uri is None or not story.preemptions:
        raise CliError(f"{job_id} ended without the preemption the demo is about")
    matches = await asyncio.to_thread(_matches_uninterrupted, record.checkpoint_uri, workdir, run)
    story.result_matches = matches
    out.print(f"preemptions: {len(story.preemptions)}")
    out.print(f"resume_after_loss_s: {story.resume_after_loss_s():.3f}")
    out.print(f"steps_lost: {sum(resumed.steps_lost for resumed, _ in story.resumes)}")
    out.print(f"result_matches_uninterrupted: {str(matches).lower()}")
    return story


async def connect_to_stack(start_hint: str) -> SpotrainClient:
    """The local stack's bus, or a one-line error saying how to start the stack."""
    bus = BusSettings(connect_timeout_s=2)
    try:
        return await SpotrainClient.connect(bus)
    except (BusUnavailableError, PlatformError):
        msg = f"the stack is not running (no NATS at {bus.nats_url}); start it: {start_hint}"
        raise CliError(msg) from None


async def submit_accepted(client: SpotrainClient, request: JobRequested) -> None:
    answer = await client.submit(request)
    if answer is None or not answer.type.endswith("accepted.v1"):
        why = answer.data if answer else "no answer"
        raise CliError(f"the submitter did not accept {request.job_id}: {why}")


async def within(followed: Coroutine[Any, Any, None], job_id: str, timeout_s: float) -> None:
    """Follow the job to its end, or fail in one line once `timeout_s` has passed."""
    try:
        await asyncio.wait_for(followed, timeout=timeout_s)
    except TimeoutError:
        msg = f"{job_id} did not finish in {timeout_s:.0f}s; see `spotrain show {job_id}`"
        raise CliError(msg) from None


async def _follow(
    client: SpotrainClient,
    job_id: str,
    story: Story,
    *,
    run: DemoRun,
    folder: NodeFolder,
    notice_s: float,
) -> None:
    preempting: list[asyncio.Task[None]] = []
    async with contextlib.aclosing(client.follow(job_id)) as events:
        async for event in events:
            story.tell(event)
            data = event.data
            if isinstance(data, JobStarted) and data.nodes:
                story.node_of_attempt[data.attempt] = data.nodes[0]
            if (
                isinstance(data, JobProgress)
                and data.attempt == len(preempting) + 1
                and data.attempt <= len(run.preempt_at_steps)
                and data.step >= run.preempt_at_steps[data.attempt - 1]
            ):
                node = story.node_of_attempt.get(data.attempt)
                preempting.append(asyncio.create_task(_preempt(story, folder, node, notice_s)))
            if isinstance(data, JobFailed):
                raise CliError(f"{job_id} failed: {data.message.strip().splitlines()[-1]}")
    for task in preempting:
        await task


async def _preempt(story: Story, folder: NodeFolder, node: str | None, notice_s: float) -> None:
    try:
        target = pick_node(folder, node, capacity="spot")
    except NoSuchNodeError as error:
        raise CliError(f"cannot preempt the job's node: {error}") from None
    how = f"with {notice_s:g}s notice" if notice_s > 0 else "without notice"
    story.say(f"preempting {target.name} {how}")
    done = await asyncio.to_thread(preempt, folder, target, notice_s=notice_s)
    story.preemptions.append(done)
    story.say(f"{target.name} killed ({done.processes} processes)")


def _matches_uninterrupted(checkpoint_uri: str, workdir: Path, run: DemoRun) -> bool:
    """Run the same seed here, uninterrupted, and compare final checkpoints byte for byte."""
    final = latest_checkpoint(checkpoint_uri)
    if final is None or final.step != run.steps:
        return False
    with tempfile.TemporaryDirectory(prefix="spotrain-reference-") as folder:
        reference_uri = Path(folder).resolve().as_uri()
        env = {
            **os.environ,
            "SPOTRAIN_JOB_ID": "reference",
            "SPOTRAIN_ATTEMPT": "1",
            "SPOTRAIN_CHECKPOINT_URI": reference_uri,
        }
        argv = [sys.executable, *run.argv(delay=False)[1:]]
        done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, check=False)
        reference = latest_checkpoint(reference_uri)
        if done.returncode != 0 or reference is None:
            return False
        return load_checkpoint(reference) == load_checkpoint(final)
