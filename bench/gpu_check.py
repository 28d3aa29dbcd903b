"""A short, prepared check for a machine with real NVIDIA GPUs: do they show up in Ray and
in the metrics, and does a job on them survive a spot loss? Nothing else in the project
needs a GPU; run this wherever one is at hand (it exits 2, saying why, where none is).

It starts a local stack of its own whose one spot pool's nodes declare the machine's real
GPUs (`SPOTRAIN_SCALER_POOLS_FILE`), with Prometheus, and then:
1. runs examples/train_ddp.py with `--gpus 1`: Ray Train's TorchTrainer on CUDA, so the
   allreduce is NCCL's;
2. reads Ray's GPU metrics (`ray_node_gpus_available`, `ray_node_gpus_utilization`) from
   Prometheus;
3. kills the job's node (a preemption without notice) and waits for the job to train again
   on a new node, then for it to succeed.
Ends with `name: value` lines, beside `nvidia-smi`'s own count of GPUs.

    python bench/gpu_check.py [--timeout-s 480]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.localstack.settings import isolated_stack

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]
EXIT_NO_GPU = 2


def nvidia_gpus() -> int:
    """How many GPUs `nvidia-smi` lists; 0 without the tool or a driver."""
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def spotrain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, check=False)


def prometheus(env: dict[str, str], promql: str) -> list[dict[str, object]]:
    port = env["SPOTRAIN_LOCAL_PROMETHEUS_PORT"]
    query = urllib.parse.urlencode({"query": promql})
    url = f"http://127.0.0.1:{port}/api/v1/query?{query}"
    with urllib.request.urlopen(url, timeout=10) as answer:  # the local Prometheus
        return list(json.load(answer)["data"]["result"])


def show_json(env: dict[str, str], job_id: str) -> dict[str, object]:
    shown = spotrain(env, "show", job_id, "-o", "json")
    return dict(json.loads(shown.stdout)) if shown.returncode == 0 else {}


def wait(what: str, ok: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if ok():
            return time.monotonic() - started
        time.sleep(1)
    msg = f"timed out waiting for {what}"
    raise TimeoutError(msg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, default=480)
    args = parser.parse_args()
    gpus = nvidia_gpus()
    if gpus == 0:
        print("gpu_check: no NVIDIA GPU here (nvidia-smi lists none); nothing to check")
        return EXIT_NO_GPU
    with tempfile.TemporaryDirectory() as home:
        pools = Path(home, "pools.toml")
        pools.write_text(
            f'[[pool]]\nname = "gpu-spot"\ncapacity = "spot"\ngpus = {gpus}\ncpus = 4\n'
            "price_per_hour_usd = 0.34\nboot_time_s = 10\nmin_nodes = 0\nmax_nodes = 1\n"
        )
        env = {
            **os.environ,
            **isolated_stack(Path(home, "stack")).environment(),
            "SPOTRAIN_SCALER_POOLS_FILE": str(pools),
        }
        up = spotrain(env, "up", "--prometheus")
        if up.returncode != 0:
            print(up.stderr, file=sys.stderr)
            return 1
        try:
            return check(env, gpus, args.timeout_s)
        finally:
            spotrain(env, "down")


def check(env: dict[str, str], gpus: int, timeout_s: float) -> int:
    submitted = spotrain(
        env, "submit", "train_ddp.py", "--workdir", str(ROOT / "examples"),
        "--workers", "1", "--gpus", "1", "--spot",
        "--", "--steps", "3000", "--step-delay-s", "0.02", "--checkpoint-every", "100",
    )  # fmt: skip
    if submitted.returncode != 0:
        print(submitted.stderr, file=sys.stderr)
        return 1
    job_id = submitted.stdout.split()[-1]

    def current() -> dict[str, Any]:
        attempts = show_json(env, job_id).get("attempts") or [{}]
        return dict(attempts[-1]) if isinstance(attempts, list) else {}

    def step() -> int:
        return int(current().get("step") or 0)

    wait("the job to train", lambda: step() > 200, timeout_s)
    in_ray = prometheus(env, "sum(ray_node_gpus_available)")
    declared = float(in_ray[0]["value"][1]) if in_ray else 0.0  # type: ignore[index]
    used = prometheus(env, "ray_node_gpus_utilization")
    node = str((current().get("nodes") or [""])[0])
    killed = spotrain(env, "preempt", node, "--notice", "0")
    if killed.returncode != 0:
        print(killed.stderr, file=sys.stderr)
        return 1
    resume_s = wait(
        "the next attempt to train",
        lambda: current().get("number", 1) != 1 and step() > 0,
        timeout_s,
    )
    wait(
        "the job to succeed", lambda: show_json(env, job_id).get("state") == "succeeded", timeout_s
    )
    logs = spotrain(env, "logs", job_id).stdout
    on_cuda = " on cuda" in logs  # train_ddp.py says its device: DDP on CUDA is NCCL
    print(f"{'':<28}{'nvidia-smi':>12}{'spotrain':>12}")
    print(f"{'GPUs':<28}{gpus:>12}{declared:>12.0f}")
    print(f"gpu_check_gpus_nvidia_smi: {gpus}")
    print(f"gpu_check_gpus_in_ray: {declared:.0f}")
    print(f"gpu_check_gpu_utilization_series: {len(used)}")
    print(f"gpu_check_workers_on_cuda: {int(on_cuda)}")
    print(f"gpu_check_resume_s: {resume_s:.1f}")
    return 0 if declared >= 1 and used and on_cuda else 1


if __name__ == "__main__":
    sys.exit(main())
