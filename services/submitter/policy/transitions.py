"""How a job's record moves, the shared parts: a transition is the next record and the
facts to publish, in order, each with the key its event id is derived from. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from services.submitter.model import (
    Attempt,
    AttemptState,
    JobRecord,
    JobState,
    RayJobStatus,
)
from shared.events.data import (
    EventData,
    InterruptionCause,
    JobCancelled,
    JobInterrupted,
    JobStarted,
)


def submission_id(job_id: str, attempt: int, resubmitted: int = 0) -> str:
    """Ray's id of an attempt; one handed to Ray again gets a new one each time, since Ray
    keeps the id of a job it failed or stopped."""
    return f"{job_id}-{attempt}" if resubmitted == 0 else f"{job_id}-{attempt}-r{resubmitted}"


def checkpoint_uri(checkpoint_root: str, job_id: str) -> str:
    """Each job checkpoints (and reports progress) under its own folder of the root."""
    return f"{checkpoint_root.rstrip('/')}/{job_id}"


class Reason(StrEnum):
    NOT_SUBMITTED = "not-submitted"
    UNCHANGED = "unchanged"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    USER_ERROR = "user-error"
    NODE_LOST = "node-lost"
    CANCELLED = "cancelled"
    PROGRESSED = "progressed"
    PLACED = "placed"
    SUBMITTED = "submitted"
    """The scaler placed a queued attempt: it goes to Ray."""
    REPLACED = "replaced"
    """Placed again, elsewhere, before Ray started it: it goes to Ray anew."""
    REQUEUED = "requeued"
    """Ray could not start it where it was placed: back to the platform's queue."""
    RESUMED = "resumed"
    ABANDONED = "abandoned"
    SHORT_OF_WORKERS = "short-of-workers"


@dataclass(frozen=True)
class Fact:
    """An event to publish, with the key its id is derived from (so a repeat is a duplicate)."""

    key: str
    data: EventData


@dataclass(frozen=True)
class Transition:
    """A job's next record and the facts to publish about it, in order."""

    reason: Reason
    record: JobRecord
    facts: tuple[Fact, ...] = ()


def interrupt(
    record: JobRecord, attempt: Attempt, cause: InterruptionCause, now: datetime, message: str
) -> Transition:
    lost = end_attempt(attempt, AttemptState.LOST, now, message).model_copy(update={"cause": cause})
    interrupted = JobInterrupted(
        job_id=record.job_id,
        attempt=attempt.number,
        node=attempt.nodes[0] if attempt.nodes else "unknown",
        cause=cause,
    )
    return Transition(
        Reason.NODE_LOST,
        with_attempt(record, lost, JobState.INTERRUPTED, now),
        (
            *unseen_start(attempt, record.job_id),
            Fact(f"interrupted-{record.job_id}-{attempt.number}", interrupted),
        ),
    )


def with_driver_node(attempt: Attempt, status: RayJobStatus) -> Attempt:
    """The attempt with the node Ray placed its driver on, once Ray says."""
    if status.node is None or attempt.nodes:
        return attempt
    return attempt.model_copy(update={"nodes": (status.node,), "pool": status.pool})


def cancel_attempt(
    record: JobRecord, attempt: Attempt, now: datetime, message: str | None
) -> Transition:
    stopped = end_attempt(attempt, AttemptState.STOPPED, now, message)
    cancelled = JobCancelled(job_id=record.job_id, attempt=attempt.number)
    return Transition(
        Reason.CANCELLED,
        with_attempt(record, stopped, JobState.CANCELLED, now),
        (Fact(f"cancelled-{record.job_id}", cancelled),),
    )


def started_fact(attempt: Attempt, job_id: str) -> Fact:
    started = JobStarted(
        job_id=job_id,
        attempt=attempt.number,
        submission_id=attempt.submission_id,
        pool=attempt.pool,
        nodes=attempt.nodes,
    )
    return Fact(f"started-{job_id}-{attempt.number}", started)


def unseen_start(attempt: Attempt, job_id: str) -> tuple[Fact, ...]:
    """An attempt that ended between two looks did start: say so first, once."""
    return (started_fact(attempt, job_id),) if attempt.state is AttemptState.SUBMITTED else ()


def end_attempt(
    attempt: Attempt, state: AttemptState, now: datetime, message: str | None
) -> Attempt:
    return attempt.model_copy(update={"state": state, "ended_at": now, "message": message})


def with_attempt(record: JobRecord, attempt: Attempt, state: JobState, now: datetime) -> JobRecord:
    attempts = (*record.attempts[:-1], attempt)
    return record.model_copy(update={"attempts": attempts, "state": state, "updated_at": now})


def in_ray(attempt: Attempt | None) -> bool:
    """Whether Ray holds the attempt (handed to it, or running): only then is there
    anything to stop or to ask Ray about."""
    return attempt is not None and attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING)
