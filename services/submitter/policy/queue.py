"""The platform's queue, the submitter's side: what `job.queued` says of an attempt, the
scaler's placement handing it to Ray, and an attempt Ray never started going back to the
queue. Pure."""

from __future__ import annotations

from datetime import datetime

from services.submitter.model import (
    Attempt,
    AttemptState,
    JobRecord,
    JobState,
    RayJobState,
    RayJobStatus,
)
from services.submitter.policy.give_way import GIVE_WAY
from services.submitter.policy.transitions import (
    Fact,
    Reason,
    Transition,
    submission_id,
    with_attempt,
)
from shared.events.data import (
    JobPlaced,
    JobQueued,
)
from shared.jobs import bundles_of, work_left_s


def queued_event(record: JobRecord, attempt: Attempt, now: datetime) -> JobQueued:
    request = record.request
    return JobQueued(
        job_id=request.job_id,
        attempt=attempt.number,
        bundles=bundles_of(request),
        capacity=record.capacity_of(attempt),
        priority=request.priority,
        deadline=request.deadline,
        work_left_s=work_left_s(record, now) if request.deadline is not None else None,
        avoid_nodes=lost_nodes(record),
        requeued=attempt.requeued,
    )


def lost_nodes(record: JobRecord) -> tuple[str, ...]:
    """Nodes that went away under the job: its next attempts are placed elsewhere (Ray may
    count one as alive for a while). One it left to give way is healthy, and may be the
    very node its team's quota and the scaler keep for it: no avoiding that one."""
    return tuple(
        sorted(
            {
                node
                for a in record.attempts
                if a.state is AttemptState.LOST and a.cause not in GIVE_WAY
                for node in a.nodes
            }
        )
    )


def placed(record: JobRecord, placement: JobPlaced, now: datetime) -> Transition:
    """The scaler placed a queued attempt on named nodes: it is handed to Ray, pinned there.

    Only the attempt and queueing it answers, while the job still wants it. A placement
    that comes again with other nodes for an attempt Ray has not started (its first nodes
    went) moves it there under a new Ray id; the caller stops the old one."""
    attempt = record.current
    if (
        not record.is_active
        or record.cancel_requested
        or record.waiting_for is not None
        or attempt is None
        or attempt.number != placement.attempt
        or attempt.requeued != placement.requeued
    ):
        return Transition(Reason.UNCHANGED, record)
    update: dict[str, object] = {"placed_on": placement.nodes, "pool": placement.pool}
    if attempt.state is AttemptState.QUEUED:
        update["state"] = AttemptState.SUBMITTED
        handed = attempt.model_copy(update=update)
        return Transition(Reason.SUBMITTED, with_attempt(record, handed, JobState.QUEUED, now))
    if attempt.state is AttemptState.SUBMITTED and attempt.placed_on != placement.nodes:
        # The same queueing (the scaler's demand still answers it), a new Ray id.
        again = attempt.resubmitted + 1
        update |= {
            "resubmitted": again,
            "submission_id": submission_id(record.job_id, attempt.number, again),
        }
        moved = attempt.model_copy(update=update)
        return Transition(Reason.REPLACED, with_attempt(record, moved, JobState.QUEUED, now))
    return Transition(Reason.UNCHANGED, record)


_NEVER_STARTED_ERRORS = frozenset({"JOB_SUPERVISOR_ACTOR_START_TIMEOUT"})
"""Ray could not start the attempt where it was placed (no room there after all, or the
node went before it started): the platform's capacity failed, not the job. Not
`JOB_SUPERVISOR_ACTOR_START_FAILURE`: Ray also says that of a supervisor that ran and
went with its node, whose job may have written checkpoints since (a loss, resumed)."""


def never_started(status: RayJobStatus, attempt: Attempt) -> bool:
    """Whether Ray failed an attempt that never ran for want of room, so that it goes back
    to the platform's queue: no `job.started`, no failure, no restart spent."""
    return (
        attempt.state is AttemptState.SUBMITTED
        and status.state is RayJobState.FAILED
        and status.error_type in _NEVER_STARTED_ERRORS
    )


def requeue(record: JobRecord, now: datetime) -> Transition:
    """The current attempt, which Ray never started, back in the platform's queue under a
    new Ray id, queued again as demand (the scaler places it anew)."""
    attempt = record.current
    if attempt is None or attempt.state is not AttemptState.SUBMITTED:
        return Transition(Reason.UNCHANGED, record)
    again = attempt.requeued + 1
    new_id = attempt.resubmitted + 1
    queued_again = attempt.model_copy(
        update={
            "state": AttemptState.QUEUED,
            "placed_on": (),
            "pool": None,
            "nodes": (),
            "requeued": again,
            "resubmitted": new_id,
            "submission_id": submission_id(record.job_id, attempt.number, new_id),
        }
    )
    moved = with_attempt(record, queued_again, JobState.QUEUED, now)
    queued = queued_event(moved, queued_again, now)
    key = f"queued-{record.job_id}-{attempt.number}-r{again}"
    return Transition(Reason.REQUEUED, moved, (Fact(key, queued),))


def answers_request(record: JobRecord) -> bool:
    """Whether a request of an admitted job is answered (accepted, queued) when it comes
    again: while its first attempt waits in the queue. A job that moved on answered it
    before: a replay, days later, must not queue demand again for a job that ran."""
    first = record.attempts[0] if record.attempts else None
    return first is not None and record.current is first and first.state is AttemptState.QUEUED
