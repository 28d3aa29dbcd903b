"""The training contract: environment, resume, save, report, and the two ways to ask for a stop."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import FrameType

import pytest

from shared.checkpoints import (
    CheckpointIntegrityError,
    CheckpointRequest,
    CheckpointStorage,
    LocalStorage,
    read_progress,
    request_checkpoint,
    save_checkpoint,
)
from shared.training import (
    TrainingContext,
    TrainingEnvironment,
    TrainingEnvironmentError,
    ray_train_scaling,
)
from tests.fakes.clock import FixedClock


class FakeMonotonic:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


class CountingStorage(LocalStorage):
    """A local storage that counts reads and can be made to fail them."""

    def __init__(self) -> None:
        self.gets = 0
        self.failing = False

    def get(self, key: str) -> bytes | None:
        self.gets += 1
        if self.failing:
            msg = "store unreachable"
            raise OSError(msg)
        return super().get(key)


@pytest.fixture
def job_uri(tmp_path: Path) -> str:
    return f"file://{tmp_path}/job-7"


def context_for(
    job_uri: str,
    attempt: int = 1,
    resume_from: str | None = None,
    *,
    storage: CheckpointStorage | None = None,
    clock: FixedClock | None = None,
    request_poll_interval_s: float = 1.0,
    monotonic: FakeMonotonic | None = None,
    progress_interval_s: float | None = None,
) -> TrainingContext:
    environment = TrainingEnvironment(
        job_id="job-7", attempt=attempt, checkpoint_uri=job_uri, resume_from=resume_from
    )
    fake_time = monotonic if monotonic is not None else FakeMonotonic()
    return TrainingContext(
        environment,
        storage=storage,
        clock=clock,
        request_poll_interval_s=request_poll_interval_s,
        monotonic=fake_time,
        sleep=fake_time.sleep,
        progress_interval_s=progress_interval_s,
    )


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    """Whatever a test does to SIGTERM, the next test finds it as it was."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


# The environment


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {
                "SPOTRAIN_JOB_ID": "job-7",
                "SPOTRAIN_ATTEMPT": "3",
                "SPOTRAIN_CHECKPOINT_URI": "gs://b/jobs/job-7",
                "SPOTRAIN_RESUME_FROM": "gs://b/jobs/job-7/step-000000000010",
            },
            TrainingEnvironment(
                job_id="job-7",
                attempt=3,
                checkpoint_uri="gs://b/jobs/job-7",
                resume_from="gs://b/jobs/job-7/step-000000000010",
            ),
            id="as-the-platform-sets-it",
        ),
        pytest.param(
            {"SPOTRAIN_CHECKPOINT_URI": "/tmp/run", "SPOTRAIN_RESUME_FROM": ""},
            TrainingEnvironment(job_id="local", attempt=1, checkpoint_uri="/tmp/run"),
            id="by-hand-defaults-to-local-attempt-1",
        ),
    ],
)
def test_the_environment_is_read_from_spotrain_variables(
    environ: dict[str, str], expected: TrainingEnvironment
) -> None:
    assert TrainingEnvironment.from_mapping(environ) == expected


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param({}, "SPOTRAIN_CHECKPOINT_URI is not set", id="no-checkpoint-uri"),
        pytest.param(
            {"SPOTRAIN_CHECKPOINT_URI": "  "}, "SPOTRAIN_CHECKPOINT_URI is not set", id="blank"
        ),
        pytest.param(
            {"SPOTRAIN_CHECKPOINT_URI": "/tmp/run", "SPOTRAIN_ATTEMPT": "two"},
            "SPOTRAIN_ATTEMPT='two'",
            id="attempt-not-a-number",
        ),
        pytest.param(
            {"SPOTRAIN_CHECKPOINT_URI": "/tmp/run", "SPOTRAIN_ATTEMPT": "0"},
            "SPOTRAIN_ATTEMPT='0'",
            id="attempt-zero",
        ),
        pytest.param(
            {"SPOTRAIN_CHECKPOINT_URI": "s3://bucket/run"},
            "SPOTRAIN_CHECKPOINT_URI: .*not supported",
            id="unknown-scheme",
        ),
    ],
)
def test_a_bad_environment_is_refused_with_the_variable_named(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(TrainingEnvironmentError, match=message):
        TrainingContext.from_env(environ, install_signal_handler=False)


# Resume, save, report


def test_a_new_job_has_nothing_to_resume(job_uri: str) -> None:
    assert context_for(job_uri).resume() is None


def test_resume_returns_the_latest_saved_step_and_its_files(job_uri: str) -> None:
    """A second attempt picks up what the first one saved last."""
    first = context_for(job_uri, attempt=1)
    first.save(10, {"w": b"ten"})
    first.save(20, {"w": b"twenty"})
    assert context_for(job_uri, attempt=2).resume() == (20, {"w": b"twenty"})


def test_resume_from_the_platforms_choice_wins_over_the_latest(
    job_uri: str, tmp_path: Path
) -> None:
    """SPOTRAIN_RESUME_FROM may name an older step, or another job's checkpoint."""
    context = context_for(job_uri)
    older = context.save(10, {"w": b"ten"})
    context.save(20, {"w": b"twenty"})
    assert context_for(job_uri, attempt=2, resume_from=older.uri).resume() == (10, {"w": b"ten"})
    other_job = save_checkpoint(str(tmp_path / "job-1"), "job-1", 4, 99, {"w": b"other"})
    assert context_for(job_uri, resume_from=other_job.uri).resume() == (99, {"w": b"other"})


def test_resume_from_an_incomplete_checkpoint_is_an_error_not_a_fresh_start(
    job_uri: str, tmp_path: Path
) -> None:
    """Silently starting over would throw away the work the platform meant to keep."""
    (tmp_path / "half" / "step-000000000005").mkdir(parents=True)
    context = context_for(job_uri, resume_from=f"file://{tmp_path}/half/step-000000000005")
    with pytest.raises(CheckpointIntegrityError, match="not a complete checkpoint"):
        context.resume()


def test_save_records_job_attempt_and_the_clocks_time(job_uri: str) -> None:
    clock = FixedClock()
    checkpoint = context_for(job_uri, attempt=4, clock=clock).save(30, {"w": b"x"})
    assert checkpoint.step == 30
    assert checkpoint.manifest.job_id == "job-7"
    assert checkpoint.manifest.attempt == 4
    assert checkpoint.manifest.created_at == clock.now()


def test_report_publishes_progress_at_the_jobs_root(job_uri: str) -> None:
    """The first report is written at once; one within the interval waits for `close`."""
    clock = FixedClock()
    context = context_for(job_uri, attempt=2, clock=clock, progress_interval_s=1.0)
    context.report(40, {"loss": 0.25, "accuracy": 0.9}, total_steps=200)
    context.report(50, {"loss": 0.2, "accuracy": 0.92}, total_steps=200)
    written = read_progress(job_uri)
    assert written is not None
    assert written.step == 40
    context.close()
    progress = read_progress(job_uri)
    assert progress is not None
    assert (progress.job_id, progress.attempt, progress.step, progress.total_steps) == (
        "job-7",
        2,
        50,
        200,
    )
    assert progress.metrics == {"loss": 0.2, "accuracy": 0.92}
    assert progress.updated_at == clock.now()


class RateLimitedStorage(LocalStorage):
    """GCS's limit on one object: a second write within a second is refused (429)."""

    def __init__(self, monotonic: FakeMonotonic) -> None:
        self._monotonic = monotonic
        self._written_at: dict[str, float] = {}
        self.writes: list[str] = []

    def put(self, key: str, data: bytes) -> None:
        at = self._monotonic()
        if at - self._written_at.get(key, float("-inf")) < 1.0:
            msg = f"429 The object {key} exceeded the rate limit for object mutation operations"
            raise OSError(msg)
        self._written_at[key] = at
        self.writes.append(key)
        if key.startswith("/"):  # a local folder's key; a bucket's is only counted
            super().put(key, data)


def test_progress_every_step_stays_within_the_storages_rate(job_uri: str) -> None:
    """Issue 20: a report every 50 ms writes progress.json once a second, never past the
    rate GCS takes; closing writes the last step."""
    monotonic = FakeMonotonic()
    storage = RateLimitedStorage(monotonic)
    context = context_for(job_uri, storage=storage, monotonic=monotonic, progress_interval_s=1.0)
    for step in range(1, 101):
        context.report(step, {"loss": 1 / step}, total_steps=100)
        monotonic.now_s += 0.05
    progress = [key for key in storage.writes if key.endswith("progress.json")]
    assert len(progress) == 5
    context.close()  # waits out the second since the last write, then writes the last
    last = read_progress(job_uri, storage=storage)
    assert last is not None
    assert last.step == 100


def test_a_refused_progress_write_is_tried_again_and_never_raises(job_uri: str) -> None:
    monotonic = FakeMonotonic()
    storage = RateLimitedStorage(monotonic)
    context = context_for(job_uri, storage=storage, monotonic=monotonic, progress_interval_s=1.0)
    storage.put("job-7/progress.json", b"{}")  # someone else just wrote it
    context.report(1, {"loss": 1.0})
    monotonic.now_s += 1.5
    context.report(2, {"loss": 0.5})
    written = read_progress(job_uri, storage=storage)
    assert written is not None
    assert written.step == 2


# Asking the run to checkpoint and stop


@pytest.mark.usefixtures("sigterm_restored")
def test_sigterm_sets_checkpoint_requested_and_the_process_lives_on(job_uri: str) -> None:
    """The handler only raises the flag: the loop saves and exits in its own time."""
    context = TrainingContext.from_env({"SPOTRAIN_CHECKPOINT_URI": job_uri})
    assert not context.checkpoint_requested
    os.kill(os.getpid(), signal.SIGTERM)
    assert context.checkpoint_requested
    assert context.checkpoint_requested, "the request stays raised"
    context.close()


@pytest.mark.usefixtures("sigterm_restored")
def test_close_gives_sigterm_back_to_the_previous_handler(job_uri: str) -> None:
    received: list[int] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, previous)
    with context_for(job_uri) as context:
        context.install_signal_handler()
        assert signal.getsignal(signal.SIGTERM) != previous
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == []
    assert signal.getsignal(signal.SIGTERM) == previous
    os.kill(os.getpid(), signal.SIGTERM)
    assert received == [signal.SIGTERM]


@pytest.mark.parametrize(
    ("request_attempt", "requested"),
    [
        pytest.param(2, True, id="names-this-attempt"),
        pytest.param(1, False, id="left-by-the-preempted-attempt"),
    ],
)
def test_a_checkpoint_now_file_asks_the_attempt_it_names(
    job_uri: str, request_attempt: int, requested: bool
) -> None:
    context = context_for(job_uri, attempt=2, request_poll_interval_s=0.0)
    assert not context.checkpoint_requested
    request = CheckpointRequest(
        job_id="job-7", attempt=request_attempt, requested_at=FixedClock().now()
    )
    request_checkpoint(job_uri, request)
    assert context.checkpoint_requested is requested


def test_a_notice_says_by_when_the_checkpoint_must_be_saved(job_uri: str) -> None:
    """Issue 36, 4: the checkpointer's request carries the node's end, so a script on a node
    pool with the longer notice knows it has 105 s, not 15."""
    context = context_for(job_uri, attempt=2, request_poll_interval_s=0.0)
    assert context.save_by is None
    noticed = FixedClock().now()
    request = CheckpointRequest(
        job_id="job-7",
        attempt=2,
        requested_at=noticed,
        save_by=noticed + timedelta(seconds=105),
    )
    request_checkpoint(job_uri, request)
    assert context.checkpoint_requested
    assert context.save_by == noticed + timedelta(seconds=105)


def test_a_checkpoint_now_file_touched_by_hand_counts(job_uri: str, tmp_path: Path) -> None:
    context = context_for(job_uri, request_poll_interval_s=0.0)
    assert not context.checkpoint_requested
    (tmp_path / "job-7").mkdir()
    (tmp_path / "job-7" / "CHECKPOINT_NOW").touch()
    assert context.checkpoint_requested
    (tmp_path / "job-7" / "CHECKPOINT_NOW").unlink()
    assert context.checkpoint_requested, "the request stays raised once seen"


def test_the_checkpoint_now_file_is_read_at_most_once_a_second(job_uri: str) -> None:
    """A loop may ask every step; the store is asked once per interval."""
    storage, monotonic = CountingStorage(), FakeMonotonic()
    context = context_for(job_uri, attempt=1, storage=storage, monotonic=monotonic)
    for _ in range(1_000):
        assert not context.checkpoint_requested
    assert storage.gets == 1
    request_checkpoint(
        job_uri, CheckpointRequest(job_id="job-7", attempt=1, requested_at=FixedClock().now())
    )
    monotonic.now_s += 0.5
    assert not context.checkpoint_requested, "not looked at again within the second"
    monotonic.now_s += 0.5
    assert context.checkpoint_requested
    assert storage.gets == 2


def test_a_store_that_cannot_be_read_does_not_stop_the_run(
    job_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed look is logged and tried again next interval, never raised into the loop."""
    storage, monotonic = CountingStorage(), FakeMonotonic()
    storage.failing = True
    context = context_for(job_uri, storage=storage, monotonic=monotonic)
    with caplog.at_level(logging.WARNING, logger="shared.training"):
        assert not context.checkpoint_requested
    assert "store unreachable" in caplog.text
    storage.failing = False
    request_checkpoint(
        job_uri, CheckpointRequest(job_id="job-7", attempt=1, requested_at=FixedClock().now())
    )
    monotonic.now_s += 1.0
    assert context.checkpoint_requested


def test_the_context_uses_the_storage_it_is_given(job_uri: str) -> None:
    """Save, report and resume all go through one storage, built once per context."""
    storage = CountingStorage()
    context = context_for(job_uri, storage=storage)
    context.save(1, {"w": b"1"})
    context.report(1, {"loss": 1.0})
    before = storage.gets
    assert context.resume() == (1, {"w": b"1"})
    assert storage.gets > before


def test_progress_waits_only_on_gcs(job_uri: str) -> None:
    """The interval is GCS's limit on one object: on a local folder every report is written
    at once, on gs:// the second of two within a second waits."""
    local = TrainingContext(
        TrainingEnvironment(job_id="job-7", attempt=1, checkpoint_uri=job_uri),
        monotonic=FakeMonotonic(),
    )
    local.report(1, {"loss": 1.0})
    local.report(2, {"loss": 0.5})
    assert getattr(read_progress(job_uri), "step", None) == 2
    storage = RateLimitedStorage(FakeMonotonic())  # counts the writes; time never moves
    remote = TrainingContext(
        TrainingEnvironment(job_id="job-7", attempt=1, checkpoint_uri="gs://acme/jobs/job-7"),
        storage=storage,
        monotonic=FakeMonotonic(),
    )
    remote.report(1, {"loss": 1.0})
    remote.report(2, {"loss": 0.5})
    assert storage.writes == ["jobs/job-7/progress.json"], "the second report waits"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {},
            {"num_workers": 1, "use_gpu": False, "resources_per_worker": {"CPU": 1.0}},
            id="outside-the-platform",
        ),
        pytest.param(
            {
                "SPOTRAIN_NUM_WORKERS": "2",
                "SPOTRAIN_MAX_WORKERS": "4",
                "SPOTRAIN_GPUS_PER_WORKER": "1",
                "SPOTRAIN_CPUS_PER_WORKER": "4",
                "SPOTRAIN_WORKER_RESOURCES": '{"spotrain-capacity-spot": 0.001}',
            },
            {
                "num_workers": (2, 4),
                "use_gpu": True,
                "resources_per_worker": {
                    "CPU": 4.0,
                    "GPU": 1.0,
                    "spotrain-capacity-spot": 0.001,
                },
                # Looks for room to grow every 10 s, not Ray's minute.
                "elastic_resize_monitor_interval_s": 10.0,
            },
            id="elastic-on-spot",
        ),
        pytest.param(
            {"SPOTRAIN_NUM_WORKERS": "3", "SPOTRAIN_MAX_WORKERS": "3"},
            {"num_workers": 3, "use_gpu": False, "resources_per_worker": {"CPU": 1.0}},
            id="fixed-count",
        ),
    ],
)
def test_ray_train_scaling_is_what_the_platform_placed(
    env: dict[str, str], expected: dict[str, object]
) -> None:
    assert ray_train_scaling(env) == expected
