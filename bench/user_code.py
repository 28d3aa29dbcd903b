"""How fast scripts that nobody wrote for spotrain train again after a spot loss, on a real
local stack, beside a single-node job's resume in the same run (the platform's own helper
script, examples/train_digits.py).

Starts its own stack and runs, one after the other:
- `ray_train`: examples/byo/ray_train_as_documented.py (Ray's documented checkpointing, no
  spotrain import) with `--workers 2`; one worker's node is killed without notice;
- `ray_train_notice`: the same, the node preempted with a 5 s notice;
- `torchrun`: examples/byo/torchrun_ddp.py (PyTorch's torchrun tutorial, its snapshot in
  SPOTRAIN_CHECKPOINT_DIR) on one spot node, killed without notice;
- `single_node`: examples/train_digits.py on one spot node, killed without notice.
For each: seconds from the loss (with a notice, its deadline) to training again (the next
attempt's first reported step, or, where the group restarted inside the attempt, its first
step after the step went back; for torchrun, which reports nothing, the next attempt's
start), and the steps lost (as `job.resumed` counts them: the step reached against the
checkpoint it went on from; or the steps the group went back; for torchrun, the epochs of
its own last save on the lost node that the next attempt did not find). Goals (issue 31):
≤ 30 s for a Ray Train job without the helper, steps lost ≤ one checkpoint interval, ≤ 1
with notice.

    python bench/user_code.py [CASE ...]
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.client import SpotrainClient
from shared.events import Event
from shared.events.data import JobProgress, JobResized, JobResumed, JobStarted
from shared.jobs import JobRecord
from shared.localstack.settings import isolated_stack
from shared.messaging import BusSettings

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]


def spotrain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, check=False)


def stack_env(home: Path) -> dict[str, str]:
    return {**os.environ, **isolated_stack(home).environment()}


async def _history(env: dict[str, str], job_id: str) -> tuple[JobRecord | None, list[Event[Any]]]:
    async with await SpotrainClient.connect(BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])) as c:
        return await c.job(job_id), await c.history(job_id)


def history(env: dict[str, str], job_id: str) -> tuple[JobRecord | None, list[Event[Any]]]:
    return asyncio.run(_history(env, job_id))


def wait(env: dict[str, str], job_id: str, ok: Any, timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record, events = history(env, job_id)
        if record is not None and ok(record, events):
            return record, events
        time.sleep(0.25)
    msg = f"{job_id}: timed out"
    raise TimeoutError(msg)


@dataclass
class Case:
    name: str
    argv: tuple[str, ...]
    workdir: Path
    notice: str = "0"
    multi_node: bool = False
    reports: bool = True


@dataclass
class Figures:
    resume_s: float
    steps_lost: float


def progress(events: list[Event[Any]]) -> list[tuple[float, int]]:
    return [(e.time.timestamp(), e.data.step) for e in events if isinstance(e.data, JobProgress)]


def measure(env: dict[str, str], case: Case) -> Figures:
    submitted = spotrain(env, "submit", *case.argv[:1], "--workdir", str(case.workdir),
                         *case.argv[1:])  # fmt: skip
    if submitted.returncode != 0:
        raise RuntimeError(submitted.stderr)
    job_id = submitted.stdout.split()[-1]
    try:

        def going(record: JobRecord, events: list[Event[Any]]) -> bool:
            if case.multi_node:
                return (
                    any(isinstance(e.data, JobResized) and e.data.workers >= 2 for e in events)
                    and len(progress(events)) >= 10
                )
            if not case.reports:
                return (
                    record.current is not None
                    and bool(record.current.nodes)
                    and (
                        record.checkpoint_uri is not None
                        and Path(
                            record.checkpoint_uri.removeprefix("file://"), "checkpoint-dir.json"
                        ).exists()
                    )
                )
            return (
                len(progress(events)) >= 10
                and record.current is not None
                and bool(record.current.nodes)
            )

        record, events = wait(env, job_id, going)
        time.sleep(2.0)  # a few steps past the last checkpoint
        record, events = history(env, job_id)
        assert record is not None
        assert record.current is not None
        if case.multi_node:
            resized = [e.data for e in events if isinstance(e.data, JobResized)]
            node = resized[-1].nodes[-1]
        else:
            node = record.current.nodes[0]
        before = record.current.number
        local_snapshot = Path(
            tempfile.gettempdir(), "spotrain", job_id, f"attempt-{before}", "checkpoint",
            "snapshot.pt",
        )  # fmt: skip
        killed_at = time.time()
        gone = spotrain(env, "preempt", node, "--notice", case.notice)
        if gone.returncode != 0:
            raise RuntimeError(gone.stderr)
        lost_at = killed_at + float(case.notice.removesuffix("s"))
        # The epoch of the torchrun script's own last save on its node, as it is lost.
        time.sleep(max(lost_at - time.time(), 0))
        saved_epoch = snapshot_epoch(local_snapshot)
        record, events = wait(env, job_id, lambda r, _: not r.is_active, timeout_s=400)
    finally:
        spotrain(env, "cancel", job_id)
    if not case.reports:
        # Training again: the next attempt runs. Lost: the epochs of the script's own last
        # save that its next attempt did not find (the platform's copy lagged), beyond
        # those since that save (its own interval, which no platform can save).
        started = [e.time.timestamp() for e in events if isinstance(e.data, JobStarted)]
        logs = spotrain(env, "logs", job_id).stdout
        resumed = [
            int(n) for n in re.findall(r"Resuming training from snapshot at Epoch (\d+)", logs)
        ]
        print(f"  torchrun: saved {saved_epoch}, resumed {resumed}, started {len(started)}",
              file=sys.stderr)  # fmt: skip
        lost = saved_epoch - resumed[-1] if resumed and saved_epoch is not None else math.nan
        return Figures(started[-1] - lost_at if len(started) > 1 else math.nan, lost)
    reports = [e for e in events if isinstance(e.data, JobProgress)]
    later = [e for e in reports if e.data.attempt > before]
    if later:
        # A new attempt: training again at its first step; steps lost as `job.resumed`
        # counts them (the step reached against the checkpoint it went on from).
        resumed_event = next(e.data for e in events if isinstance(e.data, JobResumed))
        return Figures(later[0].time.timestamp() - lost_at, float(resumed_event.steps_lost))
    # The same attempt, its group restarted (the platform saw it whole again): training
    # again at its first step after that; lost, the steps it went back.
    regrown = [
        e.time.timestamp()
        for e in events
        if isinstance(e.data, JobResized)
        and e.time.timestamp() > killed_at
        and e.data.previous is not None
        and e.data.workers > e.data.previous
    ]
    if regrown:
        reached = max((e.data.step for e in reports if e.time.timestamp() <= regrown[0]), default=0)
        after = [e for e in reports if e.time.timestamp() > regrown[0]]
        if after:
            went_on_from = after[0].data.step - 1
            lost = max(reached - went_on_from, 0)
            return Figures(after[0].time.timestamp() - lost_at, float(lost))
    return Figures(math.nan, math.nan)


def snapshot_epoch(path: Path) -> int | None:
    """EPOCHS_RUN of a torchrun tutorial snapshot; None if there is none."""
    import torch  # noqa: PLC0415  # only for the torchrun case

    try:
        return int(torch.load(path, weights_only=True)["EPOCHS_RUN"])
    except (OSError, RuntimeError, KeyError):
        return None


def main() -> None:
    byo, examples = ROOT / "examples" / "byo", ROOT / "examples"
    ray_train = ("ray_train_as_documented.py", "--workers", "2", "--gpus", "0", "--cpus", "1",
                 "--spot", "--", "--epochs", "100", "--epoch-delay-s", "0.1")  # fmt: skip
    cases = [
        Case(
            "single_node",
            (
                "train_digits.py",
                "--gpus",
                "0",
                "--cpus",
                "1",
                "--spot",
                "--",
                "--steps",
                "3000",
                "--step-delay-s",
                "0.02",
                "--checkpoint-every",
                "50",
            ),
            examples,
        ),
        Case("ray_train", ray_train, byo, multi_node=True),
        Case("ray_train_notice", ray_train, byo, notice="5s", multi_node=True),
        Case(
            "torchrun",
            (
                "torchrun",
                "--gpus",
                "0",
                "--cpus",
                "2",
                "--spot",
                "--",
                "--standalone",
                "--nproc_per_node=2",
                "torchrun_ddp.py",
                "400",
                "5",
                "--epoch_delay_s",
                "0.1",
            ),
            byo,
            reports=False,
        ),
    ]
    only = set(sys.argv[1:])
    cases = [case for case in cases if not only or case.name in only]
    figures: dict[str, Figures] = {}
    with tempfile.TemporaryDirectory() as home:
        env = stack_env(Path(home) / "stack")
        up = spotrain(env, "up")
        if up.returncode != 0:
            raise RuntimeError(up.stderr)
        try:
            for case in cases:
                print(f"… {case.name}", file=sys.stderr, flush=True)
                figures[case.name] = measure(env, case)
        finally:
            spotrain(env, "down")
    print(f"{'job':<18}{'resume s':>10}{'steps lost':>12}")
    for name, found in figures.items():
        print(f"{name:<18}{found.resume_s:>10.1f}{found.steps_lost:>12.0f}")
    print(json.dumps({k: vars(v) for k, v in figures.items()}))
    if only:
        return
    print(f"user_code_resume_s_ray_train: {figures['ray_train'].resume_s:.1f}")
    print(f"user_code_resume_s_ray_train_notice: {figures['ray_train_notice'].resume_s:.1f}")
    print(f"user_code_resume_s_torchrun: {figures['torchrun'].resume_s:.1f}")
    print(f"user_code_steps_lost_ray_train: {figures['ray_train'].steps_lost:.0f}")
    print(f"user_code_steps_lost_torchrun: {figures['torchrun'].steps_lost:.0f}")
    print(f"user_code_resume_s_single_node: {figures['single_node'].resume_s:.1f}")


if __name__ == "__main__":
    main()
