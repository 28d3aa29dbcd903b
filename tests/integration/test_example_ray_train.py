"""The Ray Train example, run as the platform runs it: the first attempt is killed outright after
Ray Train checkpointed step 40, and the next attempt resumes from Ray Train's own checkpoint."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest

from shared.checkpoints import read_progress
from shared.training import TrainingEnvironment

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parents[2] / "examples" / "train_ray_train.py"
STEPS = 60
ARGS = ["--seed", "7", "--steps", str(STEPS), "--checkpoint-every", "20", "--report-every", "5"]
RAY_ENV = {
    # No token written to ~/.ray, where it would switch on token auth for every later cluster.
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray Train's default polling costs seconds a run; nothing here tests preemption or metrics.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}


def attempt_env(uri: str, attempt: int, ray_tmpdir: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRAIN_", "RAY_"))}
    return (
        inherited
        | RAY_ENV
        | {
            "RAY_TMPDIR": ray_tmpdir,  # its own session folder, apart from other tests' clusters
            "SPOTRAIN_JOB_ID": "ray-train",
            "SPOTRAIN_ATTEMPT": str(attempt),
            "SPOTRAIN_CHECKPOINT_URI": uri,
            "SPOTRAIN_NUM_WORKERS": "1",
            "SPOTRAIN_GPUS_PER_WORKER": "0",
        }
    )


def session_processes(session_id: int) -> list[int]:
    """Live processes in a session: the driver, and the local Ray cluster it started."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it exited while we looked
        if fields[0] != "Z" and int(fields[3]) == session_id:
            members.append(int(stat.parent.name))
    return members


def wait_for_empty_session(session_id: int) -> list[int]:
    """The processes still in the session after a few seconds: none once Ray has shut down."""
    deadline = time.monotonic() + 10
    while (members := session_processes(session_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return members


def kill_session(session_id: int) -> None:
    """SIGKILL everything the attempt started; a killed driver leaves some Ray agents alive."""
    for pid in session_processes(session_id):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def attempt(
    uri: str,
    number: int,
    ray_tmpdir: str,
    *extra: str,
    cpus: int = 2,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """One attempt in its own session, with a private local Ray; nothing of it outlives the test."""
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *ARGS, "--local-cpus", str(cpus), *extra],
        env=attempt_env(uri, number, ray_tmpdir) | (env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
        kill_session(process.pid)


def wait_until_registered(process: subprocess.Popen[str], run_folder: Path, name: str) -> None:
    """Until Ray Train's run snapshot lists the checkpoint: only then will a new run find it."""
    snapshot = run_folder / "checkpoint_manager_snapshot.json"
    deadline = time.monotonic() + 120
    while not (snapshot.exists() and f'"{name}"' in snapshot.read_text()):
        assert process.poll() is None, "the first attempt ended before it could be killed"
        assert time.monotonic() < deadline, "Ray Train never registered the checkpoint"
        time.sleep(0.05)


def load_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example as a module; dataclasses need it in sys.modules while it is defined."""
    spec = importlib.util.spec_from_file_location("train_ray_train", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def uninterrupted_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The example's own numpy steps, 1..STEPS in one go, in this process and without Ray."""
    script = load_script(monkeypatch)
    args = script.parse_args(ARGS)
    config = script.Config(
        **vars(args), environment=TrainingEnvironment(job_id="x", attempt=1, checkpoint_uri="x")
    )
    x, y, _, _ = script.load_data(config.seed, 0, 1)
    weights, bias = script.initial_model(config.seed, x.shape[1])
    for step in range(1, STEPS + 1):
        script.sgd_step(weights, bias, x, y, config, key=[config.seed, 0, step])
    return weights, bias


def test_a_killed_attempt_resumes_from_ray_trains_latest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill after step 40 is registered; attempt 2 resumes there, not at 0, and finishes at 60."""
    uri = f"file://{tmp_path}/job"
    run_folder = tmp_path / "job" / "ray-train"
    # Short: Ray's socket paths under it must fit in 107 characters.
    with tempfile.TemporaryDirectory(prefix="rt-", dir="/tmp") as ray_tmpdir:
        # Slowed so the kill lands between the checkpoints of steps 40 and 60.
        with attempt(uri, 1, ray_tmpdir, "--step-delay-s", "0.1") as first:
            wait_until_registered(first, run_folder, "step_000040")
            kill_session(first.pid)  # a lost node: no chance to save or clean up
            first_out, _ = first.communicate(timeout=30)
        assert first.returncode == -signal.SIGKILL, first_out
        with attempt(uri, 2, ray_tmpdir) as second:
            second_out, _ = second.communicate(timeout=180)
            assert second.returncode == 0, second_out
            assert wait_for_empty_session(second.pid) == [], "a finished attempt left Ray behind"

    assert "attempt 2: resumed from step 40" in second_out, second_out
    accuracy = float(second_out.split("final accuracy ")[1].split()[0])
    assert accuracy > 0.85
    # CheckpointConfig(num_to_keep=2) dropped step 20 once step 60 was registered.
    assert sorted(p.name for p in run_folder.glob("step_*")) == ["step_000040", "step_000060"]
    progress = read_progress(uri)
    assert progress is not None
    assert (progress.attempt, progress.step, progress.total_steps) == (2, STEPS, STEPS)
    expected_weights, expected_bias = uninterrupted_weights(monkeypatch)
    final = run_folder / "step_000060"
    assert (final / "step.txt").read_text() == str(STEPS)
    np.testing.assert_array_equal(np.load(final / "weights.npy"), expected_weights)
    np.testing.assert_array_equal(np.load(final / "bias.npy"), expected_bias)


def test_an_elastic_range_runs_as_many_workers_as_the_cluster_holds(tmp_path: Path) -> None:
    """Issue 18: `--workers 2..4` reaches Ray Train's elastic ScalingConfig through the
    training helper: on a cluster of 3 CPUs it starts 3 workers, not 2 and not 4."""
    with tempfile.TemporaryDirectory(prefix="rt-", dir="/tmp") as ray_tmpdir:
        elastic = {"SPOTRAIN_NUM_WORKERS": "2", "SPOTRAIN_MAX_WORKERS": "4"}
        with attempt(f"file://{tmp_path}/job", 1, ray_tmpdir, cpus=3, env=elastic) as run:
            out, _ = run.communicate(timeout=180)
            assert run.returncode == 0, out
    # Ray Train's own account of the group it started (the workers' lines are deduplicated).
    assert "Started training worker group of size 3" in out, out
    assert "final accuracy" in out, out
