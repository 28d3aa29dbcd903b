"""The launcher in front of every job's command: its checkpoint folder kept in the store,
the notice as SIGTERM, and Ray Train's defaults for a script that leaves them unsaid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.checkpoints import (
    KEPT_LOG_BYTES,
    CheckpointRequest,
    LocalStorage,
    read_attempt_log,
    request_checkpoint,
)
from shared.usercode import launch, ray_train_runs
from shared.usercode.checkpoint_dir import CheckpointFolder, to_copy

SECOND = 1_000_000_000
NOW_NS = 100 * SECOND
OLD, FRESH, OTHER = (10, NOW_NS - 2 * SECOND), (10, NOW_NS - SECOND // 10), (12, NOW_NS - SECOND)


@pytest.mark.parametrize(
    ("current", "copied", "final", "expected"),
    [
        pytest.param({"s.pt": FRESH}, {}, False, [], id="being-written"),
        pytest.param({"s.pt": OLD}, {}, False, ["s.pt"], id="written-a-moment-ago"),
        pytest.param({"s.pt": OTHER}, {"s.pt": OLD}, False, ["s.pt"], id="rewritten"),
        pytest.param({"s.pt": OLD}, {"s.pt": OLD}, False, [], id="already-kept"),
        pytest.param({"s.pt": FRESH}, {}, True, ["s.pt"], id="at-the-end-all-that-changed"),
    ],
)
def test_a_file_is_copied_once_nothing_wrote_to_it_for_a_moment(
    current: dict[str, tuple[int, int]],
    copied: dict[str, tuple[int, int]],
    final: bool,
    expected: list[str],
) -> None:
    assert to_copy(current, copied, now_ns=NOW_NS, final=final) == expected


stats = st.dictionaries(
    st.sampled_from(["a", "b", "c/d"]), st.sampled_from([OLD, FRESH, OTHER]), max_size=3
)


@given(current=stats, copied=stats, final=st.booleans())
def test_nothing_is_copied_that_is_gone_or_unchanged_since_it_was_copied(
    current: dict[str, tuple[int, int]],
    copied: dict[str, tuple[int, int]],
    final: bool,
) -> None:
    for name in to_copy(current, copied, now_ns=NOW_NS, final=final):
        assert name in current
        assert copied.get(name) != current[name]


def test_the_next_attempt_finds_the_latest_complete_set_on_a_new_node(tmp_path: Path) -> None:
    store, root = LocalStorage(), str(tmp_path / "store" / "job-1")
    first = CheckpointFolder(store, root, tmp_path / "node-a")
    first.restore()
    (first.folder / "snapshot.pt").write_bytes(b"epoch 3")
    (first.folder / "old").mkdir()
    (first.folder / "old" / "log.txt").write_text("x")
    assert first.sync(final=True) == ["old/log.txt", "snapshot.pt"]
    (first.folder / "snapshot.pt").write_bytes(b"epoch 7, longer")
    (first.folder / "old" / "log.txt").unlink()
    assert first.sync() == []  # written to just now: it may be half-way written
    time.sleep(0.3)
    assert first.sync() == ["snapshot.pt"]
    second = CheckpointFolder(store, root, tmp_path / "node-b")
    assert second.restore() == ["snapshot.pt"]
    assert (second.folder / "snapshot.pt").read_bytes() == b"epoch 7, longer"
    assert not (second.folder / "old" / "log.txt").exists()
    assert second.sync(final=True) == []  # what it restored is not copied back


@pytest.mark.parametrize(
    ("returncode", "noticed", "expected"),
    [
        pytest.param(0, False, 0, id="done"),
        pytest.param(3, False, 3, id="its-own-error"),
        pytest.param(-15, False, 143, id="killed-by-sigterm"),
        pytest.param(0, True, 143, id="saved-and-returned-after-a-notice-is-not-done"),
        pytest.param(1, True, 1, id="failed-after-a-notice"),
    ],
)
def test_the_launcher_exits_as_the_command_did(
    returncode: int, noticed: bool, expected: int
) -> None:
    assert launch.exit_code(returncode, noticed=noticed) == expected


SAVES_ON_SIGTERM = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    folder = pathlib.Path(os.environ["SPOTRAIN_CHECKPOINT_DIR"])
    snapshot = folder / "snapshot.txt"
    start = int(snapshot.read_text()) if snapshot.exists() else 0
    print("resumed at", start, flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    epoch = start
    while not stop and epoch < start + 600:
        epoch += 1
        time.sleep(0.01)
    snapshot.write_text(str(epoch))
    sys.exit(0)
    """
)


def run_launcher(tmp_path: Path, attempt: int, argv: list[str]) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "SPOTRAIN_JOB_ID": "job-1",
        "SPOTRAIN_ATTEMPT": str(attempt),
        "SPOTRAIN_CHECKPOINT_URI": f"file://{tmp_path}/store/job-1",
        "SPOTRAIN_CHECKPOINT_SYNC_S": "0.2",
        "SPOTRAIN_CHECKPOINT_DIR": str(tmp_path / f"node-{attempt}"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "shared.usercode.launch", "--", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_notice_reaches_a_plain_script_as_sigterm_and_what_it_saves_follows_it(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SAVES_ON_SIGTERM)
    first = run_launcher(tmp_path, 1, [sys.executable, str(script)])
    assert first.stdout is not None
    assert "resumed at 0" in first.stdout.readline()
    request = CheckpointRequest(job_id="job-1", attempt=1, requested_at=datetime.now(UTC))
    request_checkpoint(f"file://{tmp_path}/store/job-1", request)
    output = first.communicate(timeout=30)[0]
    assert first.returncode == 143, output  # cut short by the notice, never "succeeded"
    assert "SIGTERM" in output
    saved = int((tmp_path / "node-1" / "snapshot.txt").read_text())
    assert 0 < saved < 600
    # The next attempt, in another folder (another node), starts where the first saved.
    second = run_launcher(tmp_path, 2, [sys.executable, str(script)])
    output = second.communicate(timeout=30)[0]
    assert second.returncode == 0, output
    assert f"resumed at {saved}" in output


def test_a_command_that_cannot_start_is_one_line_and_exit_127(tmp_path: Path) -> None:
    launcher = run_launcher(tmp_path, 1, ["no-such-command-here"])
    output = launcher.communicate(timeout=30)[0]
    assert launcher.returncode == 127
    assert output.strip().splitlines() == [
        "spotrain: could not start 'no-such-command-here': No such file or directory"
    ]


RAY_TRAIN_CONFIGS = textwrap.dedent(
    """
    import json
    from ray.train import RunConfig, ScalingConfig
    unsaid, said = RunConfig(), RunConfig(storage_path="/mine", name="mine")
    scaling = ScalingConfig(num_workers=2)
    print(json.dumps({
        "unsaid": [unsaid.storage_path, unsaid.name],
        "said": [said.storage_path, said.name],
        "resources": scaling._resources_per_worker_not_none,
    }))
    """
)


def test_ray_train_gets_the_platform_s_defaults_where_the_script_says_nothing(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": launch.BOOTSTRAP_FOLDER,
        "SPOTRAIN_CHECKPOINT_URI": "file:///ckpt/job-1",
        "SPOTRAIN_WORKER_RESOURCES": json.dumps({"spotrain-capacity-spot": 0.001}),
    }
    found = subprocess.run(
        [sys.executable, "-c", RAY_TRAIN_CONFIGS],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    configs = json.loads(found.stdout.strip().splitlines()[-1])
    assert configs["unsaid"] == ["file:///ckpt/job-1", "ray-train"]
    assert configs["said"] == ["/mine", "mine"]
    assert configs["resources"] == {"CPU": 1, "spotrain-capacity-spot": 0.001}


@pytest.mark.parametrize(
    ("metrics", "step"),
    [
        pytest.param({"loss": 0.3, "step": 40, "epoch": 2}, 40, id="step-first"),
        pytest.param({"loss": 0.3, "epoch": 7}, 7, id="an-epoch-is-a-step"),
        pytest.param({"loss": 0.3, "training_iteration": 9.0}, 9, id="ray-s-own-count"),
        pytest.param({"loss": 0.3}, None, id="none-named"),
        pytest.param({"step": True}, None, id="not-a-number"),
        pytest.param({"step": float("nan"), "epoch": 3}, 3, id="nan-is-no-step"),
    ],
)
def test_a_ray_train_report_s_step_is_the_metric_that_names_it(
    metrics: dict[str, object], step: int | None
) -> None:
    assert ray_train_runs.step_of(metrics) == step


def test_the_latest_checkpoint_of_a_ray_train_run_gives_its_step(tmp_path: Path) -> None:
    run = tmp_path / "job-1" / "ray-train"
    store = LocalStorage()
    assert ray_train_runs.latest_checkpoint_step(store, str(run)) is None
    run.mkdir(parents=True)
    snapshot = {"latest_checkpoint_result": {"metrics": {"loss": 1.0, "epoch": 17}}}
    (run / ray_train_runs.SNAPSHOT_NAME).write_text(json.dumps(snapshot))
    assert ray_train_runs.latest_checkpoint_step(store, str(run)) == 17
    (run / ray_train_runs.SNAPSHOT_NAME).write_text("{not json")
    assert ray_train_runs.latest_checkpoint_step(store, str(run)) is None


async def test_the_checkpointer_resumes_a_ray_train_run_from_its_own_latest_step(
    tmp_path: Path,
) -> None:
    from services.checkpointer.adapters.checkpoint_store import StorageCheckpoints  # noqa: PLC0415

    run = tmp_path / "job-1" / "ray-train"
    run.mkdir(parents=True)
    snapshot = {"latest_checkpoint_result": {"metrics": {"epoch": 12}}}
    (run / ray_train_runs.SNAPSHOT_NAME).write_text(json.dumps(snapshot))
    latest = await StorageCheckpoints().latest(f"file://{tmp_path}/job-1")
    assert latest is not None
    # No helper checkpoint to hand over: the next driver restores the run by itself.
    assert (latest.uri, latest.step) == (None, 12)


def test_what_the_command_prints_is_passed_on_and_kept_beside_its_checkpoints(
    tmp_path: Path,
) -> None:
    """Ray keeps an attempt's output with its head (or its node): the platform keeps its end
    too, where a head back without its state or a lost node cannot take it."""
    script = tmp_path / "talk.py"
    script.write_text(
        "import sys, time\n"
        "print('to stdout', flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\n"
        "time.sleep(0.5)\n"
        "print('x' * 2_000_000)\n"
        "print('last words')\n"
    )
    launcher = run_launcher(tmp_path, 3, [sys.executable, str(script)])
    output = launcher.communicate(timeout=60)[0]
    assert launcher.returncode == 0, output[-2000:]
    assert "to stdout" in output
    assert "to stderr" in output
    assert output.rstrip().endswith("last words")
    kept = read_attempt_log(f"file://{tmp_path}/store/job-1", 3)
    assert kept is not None
    assert kept.rstrip().endswith("last words")
    assert len(kept.encode()) == KEPT_LOG_BYTES, "its end, no more"
    assert read_attempt_log(f"file://{tmp_path}/store/job-1", 2) is None
