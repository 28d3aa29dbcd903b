"""Training jobs for the end-to-end tests and benchmarks, and a watch on their processes."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from shared.events.data import JobRequested
from shared.events.types import Bundle, CapacityClass, ObjectRef


def digits_job(  # each a knob of the run the tests turn
    job_id: str,
    workspace: ObjectRef,
    *,
    owner: str,
    experiment: str,
    seed: int,
    steps: int,
    step_delay_s: float,
    gpus: int = 1,
    max_restarts: int = 3,
) -> JobRequested:
    """examples/train_digits.py on spot, checkpointing every 10 steps and reporting every 5:
    a run of `steps` that lasts at least `steps * step_delay_s`."""
    return JobRequested(
        job_id=job_id,
        owner=owner,
        experiment=experiment,
        entrypoint=(
            "python", "train_digits.py", "--seed", str(seed), f"--steps={steps}",
            "--checkpoint-every=10", "--report-every=5", f"--step-delay-s={step_delay_s}",
        ),
        working_dir=workspace,
        worker=Bundle(gpus=gpus, cpus=1),
        capacity=CapacityClass.SPOT,
        max_restarts=max_restarts,
    )  # fmt: skip


class AttemptWatch:
    """Which attempt of each job has a training process alive, sampled from /proc every
    0.25 s until stopped: two attempts of one job alive at once is a job run twice."""

    def __init__(self) -> None:
        self.overlaps: list[tuple[str, frozenset[str]]] = []
        self.seen: dict[str, set[str]] = {}
        self.details: list[str] = []
        """For each overlap seen, the processes: what to look at when one is."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AttemptWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def doubled(self) -> set[str]:
        """The jobs seen running two attempts at once."""
        return {job for job, _ in self.overlaps}

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            alive = _training_processes()
            for job, attempts in alive.items():
                self.seen.setdefault(job, set()).update(attempts)
                if len(attempts) > 1:
                    self.overlaps.append((job, frozenset(attempts)))
                    self.details.append(f"{time.time():.2f} {job}: {attempts}")
                    if len(self.details) == 1:
                        self.details.append(_process_tree())


def _training_processes() -> dict[str, dict[str, list[str]]]:
    """Job id → the attempts (SPOTRAIN_ATTEMPT) of its train_digits.py processes now, each
    with its processes (pid, parent, state)."""
    alive: dict[str, dict[str, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(arg.endswith(b"train_digits.py") for arg in argv):
                continue
            stat = (entry / "stat").read_text()
            state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
            environ = dict(
                item.split(b"=", 1)
                for item in (entry / "environ").read_bytes().split(b"\0")
                if b"=" in item
            )
        except OSError:
            continue  # ended between the listing and the look
        job = environ.get(b"SPOTRAIN_JOB_ID", b"").decode()
        if job:
            attempt = environ.get(b"SPOTRAIN_ATTEMPT", b"").decode()
            found = f"pid {entry.name} parent {parent} state {state}"
            alive.setdefault(job, {}).setdefault(attempt, []).append(found)
    return alive


def _process_tree() -> str:
    listed = subprocess.run(
        ["ps", "-eo", "pid,ppid,pgid,sid,stat,args", "--forest"],
        capture_output=True, text=True, check=False, timeout=10,
    )  # fmt: skip
    return "\n".join(line[:220] for line in listed.stdout.splitlines())
