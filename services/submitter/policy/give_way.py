"""Give-way: a job asked to checkpoint and stop for other work (borrowed quota taken back,
a higher priority job of its team), and what its end is then. Pure."""

from __future__ import annotations

from datetime import datetime

from services.submitter.model import (
    Attempt,
    AttemptState,
    JobRecord,
)
from services.submitter.policy.transitions import Transition, interrupt, with_attempt
from shared.events.data import (
    InterruptionCause,
)

GIVE_WAY = frozenset({InterruptionCause.RECLAIMED, InterruptionCause.PRIORITY})
"""Why the platform stops a job, checkpoint first, for other work (`shared.policy.fairshare`)."""


_WHY_GIVE_WAY = {
    InterruptionCause.RECLAIMED: "its team's borrowed quota was taken back",
    InterruptionCause.PRIORITY: "a higher priority job of its team needed the room",
}


def gave_way_message(attempt: Attempt) -> str:
    """What an attempt asked to give way says of its end (its record, `job.interrupted`)."""
    cause = attempt.give_way or attempt.cause
    why = _WHY_GIVE_WAY.get(cause, "the platform needed its GPUs") if cause else "asked to stop"
    return f"gave way to {attempt.give_way_for or 'another job'}: {why}"


def give_way(
    record: JobRecord, cause: InterruptionCause, for_job: str, now: datetime
) -> JobRecord | None:
    """The record with its current attempt asked to checkpoint and stop for `for_job`;
    None when there is no live attempt to ask (or it was asked already)."""
    attempt = record.current
    if (
        not record.is_active
        or attempt is None
        or attempt.state not in (AttemptState.SUBMITTED, AttemptState.RUNNING)
        or attempt.give_way is not None
    ):
        return None
    asked = attempt.model_copy(
        update={"give_way": cause, "give_way_asked_at": now, "give_way_for": for_job}
    )
    return with_attempt(record, asked, record.state, now)


def gave_way_queued(
    record: JobRecord, cause: InterruptionCause, for_job: str, now: datetime
) -> Transition | None:
    """A job asked to give way while its attempt waits in the platform's queue: nothing of
    it runs, so it ends at once as that preemption (losing nothing) and goes on as any job
    that gave way; None when its attempt is not queued."""
    attempt = record.current
    if not record.is_active or attempt is None or attempt.state is not AttemptState.QUEUED:
        return None
    asked = attempt.model_copy(
        update={"give_way": cause, "give_way_asked_at": now, "give_way_for": for_job}
    )
    return interrupt(record, asked, cause, now, gave_way_message(asked))


def give_way_overdue(attempt: Attempt, now: datetime, grace_s: float) -> bool:
    """An attempt asked to give way that has not stopped within the grace period: Ray
    stops it, and it goes on from the last checkpoint it wrote."""
    asked = attempt.give_way_asked_at
    return (
        asked is not None
        and attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING)
        and (now - asked).total_seconds() >= grace_s
    )
