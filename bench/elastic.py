"""An elastic multi-node job losing workers, against a fixed one restarted in full.

`examples/train_ddp.py` (PyTorch DDP through Ray Train's TorchTrainer, a real gloo
allreduce) with `--workers 2..4` on a real Ray cluster of its own: a head that holds the
driver and four `ray start` spot nodes of one GPU each (declared; no device needed), the
job run with the environment the submitter gives a multi-node attempt (its workers
pinned to spot, Ray Train's start timeout and preemption poll). Cases, each on a fresh
cluster:

- (a) one worker's node preempted with a 5 s notice: the checkpointer's own drain
  (`RayGcsNodes.drain`, Ray's preemption reason and deadline), the kill at the deadline;
- (b) one worker's node killed without notice;
- (c) two nodes killed at once without notice, leaving MIN;
- fixed: the same job as `--workers 4`, one node killed without notice, under today's
  full-restart path: the attempt is lost, and a new attempt (a new driver) resumes from
  Ray Train's latest checkpoint once a replacement node has joined.

Each time a node goes, a replacement joins after `--boot-s` (the local pools' boot time),
as the scaler's would. Per case: seconds from the loss to training steps advancing again,
steps lost (the last step reached before, against the step it went on from), whether a new
attempt was needed, and seconds from the replacement's join until the job is back to 4
workers. The final loss of each run is compared with an uninterrupted run of the same seed
(every step is the same step whatever the worker count: see the example).

The platform's own path (notice, drain, `job.resized`, the scaler's growth demand) runs
end to end in tests/e2e/test_elastic.py; this bench times Ray Train's part under it.

    python bench/elastic.py [--steps 600] [--step-delay-s 0.05] [--boot-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from services.checkpointer.adapters.ray_gcs import RayGcsNodes
from services.submitter.policy import RAY_TRAIN_ON_SPOT
from shared.localstack.ports import free_port_below
from shared.resources import NODE_LABEL

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"
RAY = Path(sys.executable).with_name("ray")
SPOT = "spotrain-capacity-spot"


@dataclass
class Case:
    name: str
    workers: str  # "2..4" or "4"
    kill: int  # nodes lost
    notice_s: float


@dataclass
class Figures:
    resume_s: float
    steps_lost: int
    new_attempts: int
    regrow_s: float | None
    final_loss: float


class Cluster:
    """A Ray head and worker nodes of one declared GPU each, in a folder of their own."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port_below(10_000)
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": str(folder / "ray"),
            # As the local stack's head: a node that went is known dead within seconds.
            "RAY_health_check_initial_delay_ms": "1000",
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "2000",
            "RAY_health_check_failure_threshold": "3",
        }
        self.nodes: dict[str, int] = {}
        self.count = 0

    def start(self, nodes: int) -> None:
        (self.folder / "ray").mkdir(parents=True, exist_ok=True)
        self._ray(
            "start", "--head", f"--port={self.port}", "--num-cpus=1", "--num-gpus=0",
            "--include-dashboard=false", "--disable-usage-stats",
        )  # fmt: skip
        for _ in range(nodes):
            self.add()

    def add(self) -> str:
        self.count += 1
        name = f"spot-{self.count}"
        before = set(self._raylets())
        self._ray(
            "start", f"--address=127.0.0.1:{self.port}", "--num-cpus=1", "--num-gpus=1",
            f"--resources={json.dumps({SPOT: 1})}", f"--labels={NODE_LABEL}={name}",
        )  # fmt: skip
        [raylet] = set(self._raylets()) - before
        self.nodes[name] = raylet
        return name

    def kill(self, name: str) -> None:
        raylet = self.nodes.pop(name)
        subprocess.run(["pkill", "-9", "-P", str(raylet)], check=False)
        os.kill(raylet, signal.SIGKILL)

    def stop(self) -> None:
        subprocess.run(["pkill", "-9", "-f", str(self.folder / "ray")], check=False)

    def _ray(self, *args: str) -> None:
        subprocess.run([str(RAY), *args], env=self.env, check=True, capture_output=True)

    def _raylets(self) -> list[int]:
        found = subprocess.run(
            ["pgrep", "-f", f"raylet.*{self.folder / 'ray'}"],
            check=False,
            capture_output=True,
            text=True,
        )
        return [int(pid) for pid in found.stdout.split()]


@contextmanager
def cluster(nodes: int) -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="el-", dir="/tmp") as folder:
        found = Cluster(Path(folder))
        try:
            found.start(nodes)
            yield found
        finally:
            found.stop()


class Run:
    """One attempt: a driver of the example on the cluster, as the platform starts it."""

    def __init__(self, c: Cluster, uri: str, attempt: int, workers: str, args: list[str]):
        low, _, high = workers.partition("..")
        env = {
            **c.env,
            **RAY_TRAIN_ON_SPOT,
            "RAY_ADDRESS": f"127.0.0.1:{c.port}",
            "PYTHONPATH": str(ROOT),
            "SPOTRAIN_JOB_ID": "elastic",
            "SPOTRAIN_ATTEMPT": str(attempt),
            "SPOTRAIN_CHECKPOINT_URI": uri,
            "SPOTRAIN_NUM_WORKERS": low,
            "SPOTRAIN_MAX_WORKERS": high or low,
            "SPOTRAIN_GPUS_PER_WORKER": "0",  # declared GPUs: a CPU run, pinned to spot
            "SPOTRAIN_CPUS_PER_WORKER": "1",
            "SPOTRAIN_WORKER_RESOURCES": json.dumps({SPOT: 1}),
            "SPOTRAIN_RESIZE_INTERVAL_S": "5",
        }
        self.log = c.folder / f"attempt-{attempt}.log"
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def final_loss(self) -> float:
        for line in self.log.read_text().splitlines():
            if line.startswith("final loss "):
                return float(line.split()[2])
        raise RuntimeError(f"no final loss in {self.log}")


def progress(uri: str, attempt: int = 1) -> tuple[int, int | None]:
    """The step and worker count the attempt last reported; (0, None) before it has."""
    try:
        report = json.loads(Path(uri.removeprefix("file://"), "progress.json").read_text())
    except (OSError, ValueError):
        return 0, None
    if report["attempt"] != attempt:
        return 0, None
    return int(report["step"]), report.get("workers")


def wait(what: str, ok: object, timeout_s: float = 300, every_s: float = 0.05) -> float:
    start = time.monotonic()
    while not ok():  # type: ignore[operator]
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(what)
        time.sleep(every_s)
    return time.monotonic() - start


def run_case(case: Case, args: argparse.Namespace) -> Figures:
    train = ["--seed", "3", "--steps", str(args.steps), "--step-delay-s", str(args.step_delay_s)]
    train += ["--checkpoint-every", "50", "--report-every", "1"]
    with cluster(4) as c, tempfile.TemporaryDirectory(prefix="el-ckpt-") as ckpt:
        uri = f"file://{ckpt}"
        run = Run(c, uri, 1, case.workers, train)
        wait("4 workers", lambda: progress(uri)[1] == 4 and progress(uri)[0] >= 100)
        victims = list(c.nodes)[: case.kill]
        if case.notice_s:
            deadline = datetime.now(UTC) + timedelta(seconds=case.notice_s)
            drain = RayGcsNodes(f"127.0.0.1:{c.port}")
            assert asyncio.run(drain.drain(victims[0], deadline))
            time.sleep(case.notice_s)
        reached = progress(uri)[0]
        for victim in victims:
            c.kill(victim)
        lost_at = time.monotonic()
        attempts = 1
        if case.workers == "4":
            # Today's path: the attempt is lost; its successor needs all 4 again.
            run.kill()
            time.sleep(args.boot_s)
            for _ in victims:
                c.add()
            attempts = 2
            run = Run(c, uri, 2, case.workers, train)
            # Its first report is the step it resumes from (the example reports at start).
            wait("the new attempt", lambda: progress(uri, 2)[1] == 4)
            went_on_from = progress(uri, 2)[0]
            wait("steps advancing", lambda: progress(uri, 2)[0] > went_on_from)
            resume_s = time.monotonic() - lost_at
            regrow_s = None
        else:
            fewer = 4 - len(victims)
            wait("the group on fewer", lambda: progress(uri)[1] == fewer)
            went_on_from = progress(uri)[0]
            wait("steps advancing", lambda: progress(uri)[0] > went_on_from)
            resume_s = time.monotonic() - lost_at
            time.sleep(max(0.0, args.boot_s - resume_s))
            for _ in victims:
                c.add()
            regrow_s = wait("back to 4", lambda: progress(uri)[1] == 4, every_s=0.2)
        if run.process.wait(timeout=600) != 0:
            raise RuntimeError(f"{case.name}: the run failed; see {run.log}")
        final = run.final_loss()
    return Figures(
        resume_s=resume_s,
        steps_lost=max(reached - went_on_from, 0),
        new_attempts=attempts - 1,
        regrow_s=regrow_s,
        final_loss=final,
    )


def uninterrupted_loss(args: argparse.Namespace) -> float:
    train = ["--seed", "3", "--steps", str(args.steps), "--step-delay-s", "0"]
    with cluster(4) as c, tempfile.TemporaryDirectory(prefix="el-ckpt-") as ckpt:
        run = Run(c, f"file://{ckpt}", 1, "4", train)
        if run.process.wait(timeout=600) != 0:
            raise RuntimeError(f"the uninterrupted run failed; see {run.log}")
        return run.final_loss()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-delay-s", type=float, default=0.05)
    parser.add_argument("--boot-s", type=float, default=10.0)
    args = parser.parse_args()
    baseline = uninterrupted_loss(args)
    cases = [
        Case("(a) one node, 5 s notice", "2..4", 1, 5.0),
        Case("(b) one node, no notice", "2..4", 1, 0.0),
        Case("(c) two nodes, no notice", "2..4", 2, 0.0),
        Case("fixed --workers 4, one node", "4", 1, 0.0),
    ]
    results = {}
    for case in cases:
        results[case.name] = run_case(case, args)
        print(f"{case.name}: {results[case.name]}", file=sys.stderr, flush=True)
    print(f"uninterrupted final loss (4 workers, seed 3): {baseline:.6f}\n")
    print(f"{'case':32} {'resume s':>9} {'lost':>5} {'new att.':>9} {'regrow s':>9} {'loss vs':>8}")
    worst = 0.0
    for name, f in results.items():
        off = abs(f.final_loss - baseline) / baseline * 100
        worst = max(worst, off) if not name.startswith("fixed") else worst
        regrow = f"{f.regrow_s:.1f}" if f.regrow_s is not None else "-"
        print(
            f"{name:32} {f.resume_s:9.1f} {f.steps_lost:5d} {f.new_attempts:9d} {regrow:>9} "
            f"{off:7.2f}%"
        )
    a, b, c, fixed = results.values()
    print()
    print(f"elastic_resume_s_notice: {a.resume_s:.1f}")
    print(f"elastic_resume_s_no_notice: {b.resume_s:.1f}")
    print(f"elastic_resume_s_two_nodes: {c.resume_s:.1f}")
    print(f"elastic_steps_lost_notice: {a.steps_lost}")
    print(f"elastic_new_attempts: {a.new_attempts + b.new_attempts + c.new_attempts}")
    print(f"elastic_regrow_s: {max(x.regrow_s or 0.0 for x in (a, b, c)):.1f}")
    print(f"elastic_final_loss_vs_uninterrupted_pct: {worst:.2f}")
    print(f"fixed_resume_s: {fixed.resume_s:.1f}")


if __name__ == "__main__":
    main()
