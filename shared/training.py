"""The training contract a user's script imports: where to resume from, how to save and report,
and when the platform wants the run to checkpoint and stop (SIGTERM or a CHECKPOINT_NOW file)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from types import FrameType, TracebackType
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.checkpoints import (
    Checkpoint,
    CheckpointStorage,
    ProgressReport,
    checkpoint_request_applies,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
    read_checkpoint_request,
    save_by,
    save_checkpoint,
    storage_for,
    write_progress,
)
from shared.clock import Clock, SystemClock

ENV_JOB_ID: Final = "SPOTRAIN_JOB_ID"
ENV_ATTEMPT: Final = "SPOTRAIN_ATTEMPT"
ENV_CHECKPOINT_URI: Final = "SPOTRAIN_CHECKPOINT_URI"
ENV_RESUME_FROM: Final = "SPOTRAIN_RESUME_FROM"

# Outside the platform only the checkpoint folder is needed; the platform always sets all four.
LOCAL_JOB_ID: Final = "local"
FIRST_ATTEMPT: Final = 1

_Handler = Callable[[int, FrameType | None], object] | int | None

logger = logging.getLogger(__name__)
PROGRESS_INTERVAL_S: Final = 1.0
"""The least time between two writes of a job's progress: GCS's rate for one object."""


class TrainingEnvironmentError(RuntimeError):
    """The environment the platform sets for a training process is missing or malformed."""


class TrainingEnvironment(BaseModel):
    """What the platform tells a training process through SPOTRAIN_* variables."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(min_length=1)
    attempt: int = Field(ge=1)
    checkpoint_uri: str = Field(min_length=1)
    resume_from: str | None = None

    @classmethod
    def from_mapping(cls, environ: Mapping[str, str]) -> TrainingEnvironment:
        """Read the SPOTRAIN_* variables; job id and attempt default to "local" and 1."""
        checkpoint_uri = environ.get(ENV_CHECKPOINT_URI, "").strip()
        if not checkpoint_uri:
            msg = (
                f"{ENV_CHECKPOINT_URI} is not set. The platform sets it for every job; to run "
                f"by hand, point it at a folder, e.g. {ENV_CHECKPOINT_URI}=file:///tmp/my-run"
            )
            raise TrainingEnvironmentError(msg)
        raw_attempt = environ.get(ENV_ATTEMPT, "").strip() or str(FIRST_ATTEMPT)
        try:
            return cls(
                job_id=environ.get(ENV_JOB_ID, "").strip() or LOCAL_JOB_ID,
                attempt=int(raw_attempt),
                checkpoint_uri=checkpoint_uri,
                resume_from=environ.get(ENV_RESUME_FROM, "").strip() or None,
            )
        except (ValueError, ValidationError) as error:
            msg = f"{ENV_ATTEMPT}={raw_attempt!r} is not a whole number of 1 or more"
            raise TrainingEnvironmentError(msg) from error


class TrainingContext:
    """One attempt of one job, as seen from inside the training script.

    A loop asks `checkpoint_requested` once per step; when it turns True the script saves and
    exits within the notice window. The context never exits the process itself.
    """

    def __init__(
        self,
        environment: TrainingEnvironment,
        *,
        storage: CheckpointStorage | None = None,
        clock: Clock | None = None,
        request_poll_interval_s: float = 1.0,
        progress_interval_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.environment = environment
        # Built once: a GCS client costs a credential lookup, too much for every step.
        self._storage = (
            storage if storage is not None else storage_for(environment.checkpoint_uri)[0]
        )
        self._clock = clock if clock is not None else SystemClock()
        self._poll_interval_s = request_poll_interval_s
        self._monotonic = monotonic
        self._next_poll_at = float("-inf")
        if progress_interval_s is None:
            # GCS's limit is per object; a local folder has none to keep to.
            remote = environment.checkpoint_uri.startswith("gs://")
            progress_interval_s = PROGRESS_INTERVAL_S if remote else 0.0
        self._progress_interval_s = progress_interval_s
        self._sleep = sleep
        self._next_progress_at = float("-inf")
        self._unwritten: ProgressReport | None = None
        """The latest report not yet written: `report` writes at most once an interval."""
        self._requested = threading.Event()
        self._save_by: datetime | None = None
        self._previous_handler: _Handler = None
        self._handler_installed = False

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, install_signal_handler: bool = True
    ) -> TrainingContext:
        """The context the platform described in the environment, with SIGTERM caught.

        Catching SIGTERM needs the main thread; pass `install_signal_handler=False` elsewhere.
        """
        environment = TrainingEnvironment.from_mapping(os.environ if environ is None else environ)
        try:
            context = cls(environment)
        except ValueError as error:
            msg = f"{ENV_CHECKPOINT_URI}: {error}"
            raise TrainingEnvironmentError(msg) from error
        if install_signal_handler:
            context.install_signal_handler()
        return context

    @property
    def job_id(self) -> str:
        return self.environment.job_id

    @property
    def attempt(self) -> int:
        return self.environment.attempt

    @property
    def checkpoint_uri(self) -> str:
        return self.environment.checkpoint_uri

    def install_signal_handler(self) -> None:
        """Turn SIGTERM into `checkpoint_requested` until `close`, instead of an exit."""
        if self._handler_installed:
            return
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._handler_installed = True

    def close(self) -> None:
        """Write the last progress report if it waits (once the interval since the last
        write is over), and give SIGTERM back to whichever handler it had before."""
        if self._unwritten is not None:
            self._sleep(max(0.0, self._next_progress_at - self._monotonic()))
            self.flush_progress()
        if self._handler_installed:
            # None means a handler set outside Python; the default is the closest we can restore.
            previous = self._previous_handler
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            self._handler_installed = False

    def __enter__(self) -> TrainingContext:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the loop is mid-step, and saving from here could tear its state.
        self._requested.set()

    @property
    def checkpoint_requested(self) -> bool:
        """True once SIGTERM arrived or CHECKPOINT_NOW names this attempt; it stays True.

        The file is looked at no more than once per poll interval, so asking every step is cheap.
        """
        if self._requested.is_set():
            return True
        now = self._monotonic()
        if now >= self._next_poll_at:
            self._next_poll_at = now + self._poll_interval_s
            if self._checkpoint_file_asks():
                self._requested.set()
        return self._requested.is_set()

    @property
    def save_by(self) -> datetime | None:
        """When the checkpoint asked for must be saved by: the node's end, as the platform's
        notice says (15 s away on GKE by default, up to 105 s on a node pool with the
        longer shutdown grace); None when it said no time (a move, or SIGTERM alone). A
        script that knows its full save takes longer may save less, or sooner."""
        return self._save_by

    def _checkpoint_file_asks(self) -> bool:
        try:
            raw = read_checkpoint_request(self.checkpoint_uri, storage=self._storage)
        except OSError as error:
            # A store that hiccups must not kill a healthy run; the next poll asks again.
            logger.warning("could not read the checkpoint request: %s", error)
            return False
        asks = checkpoint_request_applies(raw, self.attempt)
        if asks:
            self._save_by = save_by(raw, self.attempt)
        return asks

    def resume(self) -> tuple[int, dict[str, bytes]] | None:
        """The step and files to resume from, or None to start fresh.

        SPOTRAIN_RESUME_FROM, when set, is the platform's choice and must be a complete,
        intact checkpoint (else CheckpointIntegrityError); otherwise the job's latest one.
        """
        checkpoint: Checkpoint | None
        if self.environment.resume_from is not None:
            checkpoint = read_checkpoint(self.environment.resume_from)
            return checkpoint.step, load_checkpoint(checkpoint)
        checkpoint = latest_checkpoint(self.checkpoint_uri, storage=self._storage)
        if checkpoint is None:
            return None
        return checkpoint.step, load_checkpoint(checkpoint, storage=self._storage)

    def save(self, step: int, files: Mapping[str, bytes]) -> Checkpoint:
        """Save `files` as this job's checkpoint of `step`; it is complete when this returns."""
        return save_checkpoint(
            self.checkpoint_uri,
            self.job_id,
            self.attempt,
            step,
            files,
            storage=self._storage,
            now=self._clock.now(),
        )

    def report(
        self,
        step: int,
        metrics: Mapping[str, float],
        total_steps: int | None = None,
        *,
        workers: int | None = None,
    ) -> None:
        """Publish progress (progress.json at the job's root) for the platform and the user;
        a multi-node run says how many workers it has now (`workers`, its world size).

        Called every step, it writes at most once per `progress_interval_s` (by default a
        second on GCS, which takes one write a second to an object and past it answers
        429, which its client retries, stalling the step; none on a local folder): a
        report between two writes waits, and the latest one goes at the next write, at
        `flush_progress`, or at `close` (which waits out the interval). A write that fails
        is logged and tried again at the next; training never stops for progress.
        """
        self._unwritten = ProgressReport(
            job_id=self.job_id,
            attempt=self.attempt,
            step=step,
            total_steps=total_steps,
            metrics=dict(metrics),
            updated_at=self._clock.now(),
            workers=workers,
        )
        if self._monotonic() >= self._next_progress_at:
            self.flush_progress()

    def flush_progress(self) -> None:
        """Write the latest progress report now, if one waits (within the interval since
        the last write, GCS may refuse it: it is then tried again at the next)."""
        report = self._unwritten
        if report is None:
            return
        self._next_progress_at = self._monotonic() + self._progress_interval_s
        try:
            write_progress(self.checkpoint_uri, report, storage=self._storage)
        except OSError as error:
            logger.warning("progress of step %s not written: %s", report.step, error)
            return
        self._unwritten = None


RESIZE_INTERVAL_S: Final = 10.0
"""How often an elastic Ray Train job looks for room to grow back toward its MAX."""


def ray_train_scaling(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Ray Train's `ScalingConfig` arguments for this attempt, as the platform placed it:
    `ray.train.ScalingConfig(**ray_train_scaling())`.

    - `num_workers`: the job's count, or `(MIN, MAX)` for `--workers MIN..MAX`, which Ray
      Train's elastic training resizes within: it goes on with fewer workers when a node
      goes and grows back as capacity returns.
    - `resources_per_worker`: each worker's CPUs and GPUs, and the attempt's capacity (spot
      or on-demand), so the workers land there; the driver, which asks for nothing, runs
      on the head, and losing a spot node never loses the attempt.
    Outside the platform (no SPOTRAIN_ variables) it is one worker of one CPU.
    """
    env = os.environ if environ is None else environ
    low = int(env.get("SPOTRAIN_NUM_WORKERS", "1"))
    high = int(env.get("SPOTRAIN_MAX_WORKERS", str(low)))
    gpus = float(env.get("SPOTRAIN_GPUS_PER_WORKER", "0"))
    cpus = float(env.get("SPOTRAIN_CPUS_PER_WORKER", "1"))
    pinned: dict[str, float] = json.loads(env.get("SPOTRAIN_WORKER_RESOURCES") or "{}")
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **pinned}
    scaling: dict[str, Any] = {
        "num_workers": (low, high) if high > low else low,
        "use_gpu": gpus > 0,
        "resources_per_worker": resources,
    }
    if high > low:
        # How often a healthy group looks for room to grow (Ray's default is a minute):
        # a job that shrank when a node went is back to MAX soon after a node returns.
        scaling["elastic_resize_monitor_interval_s"] = float(
            env.get("SPOTRAIN_RESIZE_INTERVAL_S", str(RESIZE_INTERVAL_S))
        )
    return scaling
