"""The example training script, run as the platform runs it: stopped by SIGTERM partway, then
resumed by the next attempt, ending with exactly the weights of a run never interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shared.checkpoints import latest_checkpoint, load_checkpoint, read_progress

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[2] / "examples" / "train_digits.py"
STEPS = 200
ARGS = ["--seed", "7", "--steps", str(STEPS), "--checkpoint-every", "50", "--lr", "0.5"]


@contextmanager
def training(uri: str, attempt: int, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """One attempt of the job, as the platform would start it; killed if the test fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRAIN_")} | {
        "SPOTRAIN_JOB_ID": "digits",
        "SPOTRAIN_ATTEMPT": str(attempt),
        "SPOTRAIN_CHECKPOINT_URI": uri,
    }
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), *ARGS, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def wait_for_step(process: subprocess.Popen[str], uri: str, step: int) -> None:
    deadline = time.monotonic() + 30
    while (progress := read_progress(uri)) is None or progress.step < step:
        assert process.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.01)


def final_weights(uri: str) -> dict[str, bytes]:
    checkpoint = latest_checkpoint(uri)
    assert checkpoint is not None
    assert checkpoint.step == STEPS
    return load_checkpoint(checkpoint)


def test_a_run_stopped_by_sigterm_resumes_to_the_weights_of_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """Determinism across resume: weights, bias and RNG state travel in the checkpoint."""
    interrupted_uri = f"file://{tmp_path}/interrupted"
    straight_uri = f"file://{tmp_path}/straight"
    # The uninterrupted run goes alongside, to save a start-up's time.
    with training(straight_uri, 1) as straight:
        # Slowed down and reporting every step, so SIGTERM surely lands partway.
        with training(interrupted_uri, 1, "--report-every", "1", "--step-delay-s", "0.01") as first:
            wait_for_step(first, interrupted_uri, 20)
            first.send_signal(signal.SIGTERM)
            first_out, first_err = first.communicate(timeout=30)
        assert first.returncode == 143, first_out + first_err
        saved = latest_checkpoint(interrupted_uri)
        assert saved is not None
        assert 20 <= saved.step < STEPS
        assert saved.manifest.attempt == 1
        assert f"saved step {saved.step}, stopping" in first_out

        with training(interrupted_uri, 2) as second:
            second_out, second_err = second.communicate(timeout=60)
        assert second.returncode == 0, second_err
        assert f"attempt 2: resumed from step {saved.step}" in second_out
        progress = read_progress(interrupted_uri)
        assert progress is not None
        assert (progress.attempt, progress.step, progress.total_steps) == (2, STEPS, STEPS)

        straight_out, straight_err = straight.communicate(timeout=60)
    assert straight.returncode == 0, straight_err
    assert "attempt 1: starting at step 0" in straight_out

    assert final_weights(interrupted_uri) == final_weights(straight_uri)
    accuracy = straight_out.strip().splitlines()[-1]
    assert accuracy.startswith("final accuracy 0.9")
    assert second_out.strip().splitlines()[-1] == accuracy
