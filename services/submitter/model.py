"""The submitter's value types: a job's record, its attempts, what Ray says of an attempt."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import AwareDatetime

from shared.events.data import JobRequested, RejectionReason
from shared.events.types import Frozen


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


class RayJobState(StrEnum):
    """Ray's own job states, as the Job Submission API reports them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class RayJobStatus(Frozen):
    state: RayJobState
    message: str | None = None
    error_type: str | None = None
    exit_code: int | None = None
    start_time: datetime | None = None


class SubmissionPlan(Frozen):
    """What to hand Ray for one attempt; built by the policy, carried out by the adapter."""

    submission_id: str
    entrypoint: str
    entrypoint_num_cpus: float
    entrypoint_num_gpus: float
    entrypoint_memory_bytes: int
    entrypoint_resources: dict[str, float]
    env_vars: dict[str, str]
    pip: tuple[str, ...]
    metadata: dict[str, str]
