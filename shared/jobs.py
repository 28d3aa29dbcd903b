"""A job's record as the `jobs` bucket holds it: written by the submitter alone, read by
clients (`spotrain ls`, `show`, notebooks) and dashboards."""

from __future__ import annotations

from enum import StrEnum

from pydantic import AwareDatetime, Field

from shared.events.data import InterruptionCause, JobRequested, RejectionReason
from shared.events.types import CapacityClass, Frozen


def jobs_bucket(prefix: str) -> str:
    """The key-value bucket of job records: one key per job id."""
    return f"{prefix}-jobs"


class JobState(StrEnum):
    REJECTED = "rejected"
    QUEUED = "queued"
    """Accepted and submitted: waiting for capacity or for Ray to start it."""
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    """Its capacity went away; the checkpointer decides what happens next."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset(
    {JobState.REJECTED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
)


class AttemptState(StrEnum):
    SUBMITTED = "submitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    """Its capacity went away under it (preempted, node lost): not the job's fault."""
    STOPPED = "stopped"


class FailureKind(StrEnum):
    """Whose fault an ended attempt is: the user's code, or the capacity under it."""

    USER_ERROR = "user-error"
    NODE_LOST = "node-lost"


class Attempt(Frozen):
    number: int
    submission_id: str
    state: AttemptState = AttemptState.SUBMITTED
    submitted_at: AwareDatetime
    started_at: AwareDatetime | None = None
    ended_at: AwareDatetime | None = None
    message: str | None = None
    step: int | None = None
    """The last training step the attempt reported."""
    total_steps: int | None = None
    """The steps the run will take, when its script says."""
    eta_s: float | None = None
    """Time left when it last reported, at its own pace since it started."""
    metrics: dict[str, float] = Field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    """The nodes it runs on, as far as Ray told (its driver's node)."""
    pool: str | None = None
    capacity: CapacityClass | None = None
    """The capacity it was pinned to, when the checkpointer moved it off the requested one."""
    resumed_from: str | None = None
    """The checkpoint it resumes from; None for a fresh start."""
    from_step: int = 0
    cause: InterruptionCause | None = None
    """Why a LOST attempt was lost."""


class JobRecord(Frozen):
    """Everything the platform knows of one job; the `jobs` bucket holds one per job id."""

    request: JobRequested
    request_event_id: str
    state: JobState
    accepted_at: AwareDatetime
    updated_at: AwareDatetime
    attempts: tuple[Attempt, ...] = ()
    rejection: RejectionReason | None = None
    detail: str | None = None
    cancel_requested: bool = False
    checkpoint_uri: str | None = None
    """Where the job checkpoints and reports progress (`<checkpoint root>/<job id>`)."""

    @property
    def job_id(self) -> str:
        return self.request.job_id

    @property
    def gpus(self) -> int:
        return self.request.worker.gpus * self.request.num_workers

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def is_active(self) -> bool:
        return self.state not in TERMINAL_STATES

    @property
    def interruptions(self) -> int:
        """Attempts whose capacity went away under them."""
        return sum(1 for attempt in self.attempts if attempt.state is AttemptState.LOST)

    def capacity_of(self, attempt: Attempt) -> CapacityClass:
        return attempt.capacity or self.request.capacity
