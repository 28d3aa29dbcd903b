"""How fast `spotrain` answers a person, beside a bare `python -c "import nats"` timed in
the same run (the floor for any Python client of the bus).

Starts its own local stack (free ports, a temporary state folder), stores 1,000 finished
jobs' records, then times each command from process start to exit:
- `spotrain --help` and `spotrain ls --help` (no bus),
- `spotrain submit` of a one-file workspace, until the submitter's answer (accepted);
  the job runs on the stack's Ray before the next command is timed, so that no command
  shares the machine with a job starting,
- `spotrain ls --all` with the 1,000 jobs in the store.
Medians of --runs runs. Ends with `name: value` lines.

    python bench/cli.py [--runs 5] [--jobs 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats

from shared.events.data import JobRequested
from shared.events.types import Bundle
from shared.jobs import JobRecord, JobState, jobs_bucket
from shared.localstack import stack
from shared.localstack.settings import LocalStackSettings, isolated_stack


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{argv[1:3]} failed: {result.stderr.strip()}")
    return elapsed


async def store_jobs(settings: LocalStackSettings, count: int) -> None:
    """`count` finished jobs, as the submitter would have left them."""
    client = await nats.connect(settings.nats_servers)
    try:
        bucket = await client.jetstream().key_value(jobs_bucket("spotrain"))
        now = datetime.now(UTC)
        for index in range(count):
            job_id = f"seeded-{index:04d}"
            request = JobRequested(
                job_id=job_id,
                owner=f"user-{index % 7}",
                experiment=f"exp-{index % 13}",
                entrypoint=("python", "train.py"),
                worker=Bundle(gpus=1 + index % 4),
            )
            record = JobRecord(
                request=request,
                request_event_id=f"seeded-{index}",
                state=JobState.SUCCEEDED,
                accepted_at=now - timedelta(minutes=index),
                updated_at=now,
            )
            await bucket.put(job_id, record.model_dump_json().encode())
    finally:
        await client.close()


async def job_ended(settings: LocalStackSettings, job_id: str, timeout_s: float = 120) -> None:
    """Until the job's record says it ended (it is watched, not polled)."""
    client = await nats.connect(settings.nats_servers)
    try:
        bucket = await client.jetstream().key_value(jobs_bucket("spotrain"))
        watcher = await bucket.watch(job_id)
        async with asyncio.timeout(timeout_s):
            async for entry in watcher:
                if entry is None or not entry.value:
                    continue  # the watch's "no value yet", or a deletion
                if not JobRecord.model_validate_json(entry.value).is_active:
                    return
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    spotrain = str(Path(sys.executable).parent / "spotrain")
    with tempfile.TemporaryDirectory() as home_dir:
        home = Path(home_dir)
        settings = isolated_stack(home / "stack")
        project = home / "project"
        project.mkdir()
        (project / "train.py").write_text("print('trained')\n")
        env = {**os.environ, "SPOTRAIN_NATS_URL": settings.nats_url, "COLUMNS": "80"}
        # As a person's shell runs it: Python keeps the project's compiled modules (a
        # sandbox may say not to, and then every run compiles them all again).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        stack.up(settings)
        try:
            asyncio.run(store_jobs(settings, args.jobs))
            figures: dict[str, list[float]] = {
                "bare": [], "help": [], "ls_help": [], "submit": [], "ls": [],
            }  # fmt: skip
            # Run 0 is not counted: the first run after an install compiles the modules.
            for run in range(args.runs + 1):
                figures["bare"].append(timed([sys.executable, "-c", "import nats"], env, project))
                figures["help"].append(timed([spotrain, "--help"], env, project))
                figures["ls_help"].append(timed([spotrain, "ls", "--help"], env, project))
                submit = [spotrain, "submit", "train.py", "--cpus", "0.1", "--job-id", f"b-{run}"]
                figures["submit"].append(timed(submit, env, project))
                asyncio.run(job_ended(settings, f"b-{run}"))
                figures["ls"].append(timed([spotrain, "ls", "--all"], env, project))
                print(
                    f"run {run}{' (not counted)' if run == 0 else ''}: "
                    + "  ".join(f"{name} {values[-1]:.3f}s" for name, values in figures.items()),
                    file=sys.stderr,
                )
        finally:
            stack.down(settings)
    median = {name: statistics.median(values[1:]) for name, values in figures.items()}
    bare = median["bare"]
    print(f"runs: {args.runs}; jobs in the store: {args.jobs}")
    print(f"{'':<14}{'median s':>10}{'over bare':>11}")
    for name in ("bare", "help", "ls_help", "submit", "ls"):
        print(f"{name:<14}{median[name]:>10.3f}{median[name] / bare:>11.2f}")
    print(f"bare_python_import_nats_s: {bare:.3f}")
    for name in ("help", "ls_help", "submit", "ls"):
        figure = f"cli_{name}_s"
        print(f"{figure}: {median[name]:.3f}")
        print(f"{figure.removesuffix('_s')}_over_bare_python: {median[name] / bare:.2f}")


if __name__ == "__main__":
    main()
