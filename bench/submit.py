"""How long `spotrain submit` takes, beside a bare nats-py publish, on a real local stack.

Starts its own stack (free ports, a temporary state folder); its scaler starts the spot
node the jobs need (the first run pays for the node's boot, later runs find it), then:
- `spotrain submit` wall time, process start to exit (the submitter's answer received),
- the same for a bare script that imports nats-py, connects and publishes one JetStream
  message with an ack (the floor for any Python client),
- submit → RUNNING: from the command's start until Ray reports the job running.
Medians of --runs runs. Ends with `name: value` lines.

    python bench/submit.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from shared.localstack import stack
from shared.localstack.settings import isolated_stack

BARE_PUBLISH = """
import asyncio, nats, sys
async def main():
    nc = await nats.connect(sys.argv[1])
    js = nc.jetstream()
    await js.publish("spotrain.bench.bare", b'{"hello": "world"}')
    await nc.close()
asyncio.run(main())
"""


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {result.stderr.strip()}")
    return elapsed


def ray_status(dashboard: str, submission_id: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{dashboard}/api/jobs/{submission_id}", timeout=5) as r:  # noqa: S310  # local dashboard
            return str(json.load(r)["status"])
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as home_dir:
        home = Path(home_dir)
        settings = isolated_stack(home / "stack")
        project = home / "project"
        project.mkdir()
        (project / "train.py").write_text("import time\ntime.sleep(1)\n")
        env = {
            **os.environ,
            "SPOTRAIN_NATS_URL": settings.nats_url,
            "SPOTRAIN_RAY_ADDRESS": settings.dashboard_url,
        }
        stack.up(settings)
        try:
            submit_s, bare_s, running_s = [], [], []
            for run in range(args.runs):
                bare_s.append(
                    timed([sys.executable, "-c", BARE_PUBLISH, settings.nats_url], env, project)
                )
                job_id = f"bench-{run}"
                started = time.perf_counter()
                submit_s.append(
                    timed(
                        [
                            str(bin_dir / "spotrain"),
                            "submit",
                            "train.py",
                            "--spot",
                            "--job-id",
                            job_id,
                        ],
                        env,
                        project,
                    )
                )
                while ray_status(settings.dashboard_url, f"{job_id}-1") not in (
                    "RUNNING",
                    "SUCCEEDED",
                ):
                    if time.perf_counter() - started > 60:
                        raise SystemExit(f"{job_id} did not start within 60 s")
                    time.sleep(0.02)
                running_s.append(time.perf_counter() - started)
                print(
                    f"run {run + 1}: submit {submit_s[-1]:.3f}s  bare {bare_s[-1]:.3f}s  "
                    f"to RUNNING {running_s[-1]:.2f}s"
                )
                time.sleep(1.5)  # let the job finish so each run finds the node free
        finally:
            stack.down(settings)
    submit, bare = statistics.median(submit_s), statistics.median(bare_s)
    print(f"runs: {args.runs}")
    print(f"submit_wall_s_median: {submit:.3f}")
    print(f"bare_publish_wall_s_median: {bare:.3f}")
    print(f"submit_to_bare_ratio: {submit / bare:.2f}")
    print(f"submit_to_running_s_median: {statistics.median(running_s):.2f}")


if __name__ == "__main__":
    main()
