"""A job's record as the `jobs` bucket holds it: written by the submitter alone, read by
clients (`spotrain ls`, `show`, notebooks) and dashboards."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from pydantic import AwareDatetime, Field

from shared.events.data import InterruptionCause, JobRequested, RejectionReason
from shared.events.types import Bundle, CapacityClass, Frozen
from shared.messaging.ports import KeyValue


def jobs_bucket(prefix: str) -> str:
    """The key-value bucket of job records: one key per job id."""
    return f"{prefix}-jobs"


def refusals_bucket(jobs: str) -> str:
    """Where the refused requests of the jobs bucket `jobs` are kept, for a while."""
    return f"{jobs}-refused"


class JobState(StrEnum):
    REJECTED = "rejected"
    QUEUED = "queued"
    """Accepted: waiting in the platform's queue for room (or for its team's quota), or
    placed and handed to Ray, which has not started it yet."""
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
    QUEUED = "queued"
    """In the platform's queue: nothing of it is in Ray until the scaler places it."""
    SUBMITTED = "submitted"
    """Placed on named nodes and handed to Ray, which has not said it runs yet."""
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
    reported_at: AwareDatetime | None = None
    """When the report the record last took was written (its `updated_at`): a report is
    news once, and one read again later says nothing Ray has not said since."""
    total_steps: int | None = None
    """The steps the run will take, when its script says."""
    eta_s: float | None = None
    """Time left when it last reported, at its own pace since it started."""
    metrics: dict[str, float] = Field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    """The nodes it runs on, as far as Ray told (its driver's node)."""
    workers: int | None = None
    """How many workers a multi-node attempt has now, as its training last reported."""
    worker_nodes: tuple[str, ...] = ()
    """The nodes that hold a multi-node attempt's workers, one per worker, as Ray last
    said (the last `job.resized`)."""
    short_of_workers_since: datetime | None = None
    """Since when a multi-node attempt's group has had fewer than its MIN workers alive,
    as Ray's state API said; None while it has enough (or nobody looked)."""
    placed_on: tuple[str, ...] = ()
    """The nodes the scaler placed it on (one per bundle) and held for it: Ray got it
    pinned there. Empty while it waits in the platform's queue."""
    requeued: int = 0
    """How often it went back to the queue for want of room before it ran (Ray could not
    start it where it was placed): never a failure, nor a restart."""
    resubmitted: int = 0
    """How often it was handed to Ray again under a new Ray id (Ray keeps the id of a job
    it failed or stopped): after going back to the queue, or placed again elsewhere."""
    pool: str | None = None
    capacity: CapacityClass | None = None
    """The capacity it was pinned to, when the checkpointer moved it off the requested one."""
    resumed_from: str | None = None
    """The checkpoint it resumes from; None for a fresh start."""
    from_step: int = 0
    cause: InterruptionCause | None = None
    """Why a LOST attempt was lost."""
    give_way: InterruptionCause | None = None
    """The platform asked it to checkpoint and stop for other work (`reclaimed` or
    `priority`), at `give_way_asked_at`; its end is then that preemption."""
    give_way_asked_at: AwareDatetime | None = None
    give_way_for: str | None = None
    """The job it makes room for."""


PLATFORM_STOPS = frozenset(
    {
        InterruptionCause.MOVED,
        InterruptionCause.RECLAIMED,
        InterruptionCause.PRIORITY,
        InterruptionCause.HEAD_LOST,
    }
)
"""Attempts that ended for the platform's own doing, not their capacity's: stopped on
purpose, checkpoint first, or lost with the platform's own Ray head. They spend no restart
budget, and go on on the capacity they had."""


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
    team: str | None = None
    """The owner's team when it was admitted, on a platform with a teams file."""
    waiting_for: str | None = None
    """Why a queued job has no attempt yet: its team's quota is taken. It gets its first
    attempt once the quota frees; None once admitted."""
    max_hours: float | None = None
    """The run time, all attempts together, at which the platform stops it (its
    `--max-hours`, or on a team with a budget the default): what bounds its worst case."""

    def ran_s(self, now: datetime) -> float:
        """Run time of all its attempts so far."""
        return sum(
            ((a.ended_at or now) - a.started_at).total_seconds()
            for a in self.attempts
            if a.started_at is not None
        )

    @property
    def job_id(self) -> str:
        return self.request.job_id

    @property
    def gpus(self) -> int:
        return self.request.most_gpus

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def is_active(self) -> bool:
        return self.state not in TERMINAL_STATES

    @property
    def interruptions(self) -> int:
        """Attempts whose capacity went away under them; a move is not one."""
        return sum(
            1
            for attempt in self.attempts
            if attempt.state is AttemptState.LOST and attempt.cause not in PLATFORM_STOPS
        )

    def capacity_of(self, attempt: Attempt) -> CapacityClass:
        return attempt.capacity or self.request.capacity


def deadline_refusal(*, now: datetime, deadline: datetime, estimate_s: float | None) -> str | None:
    """Why a job with this deadline cannot be taken, with the arithmetic; None if it can.
    Pure. On-demand capacity, never taken back, is the best case: a job whose estimate
    does not fit before its deadline there fits nowhere."""
    left_s = (deadline - now).total_seconds()
    if left_s <= 0:
        return f"the deadline {_moment(deadline)} has passed ({span_text(-left_s)} ago)"
    if estimate_s is not None and estimate_s > left_s:
        return (
            f"the job needs {span_text(estimate_s)} at its estimate, but only {span_text(left_s)} "
            f"remain until {_moment(deadline)}: even on on-demand, never preempted, it would "
            f"end {span_text(estimate_s - left_s)} late"
        )
    return None


class DeadlineBasis(StrEnum):
    PACE = "pace"
    """The running attempt's own reported pace (its ETA)."""
    ESTIMATE = "estimate"
    """The submitter's estimate, less the time the job has run."""
    UNKNOWN = "unknown"


class DeadlineOutlook(Frozen):
    deadline: AwareDatetime
    left_s: float
    """Until the deadline; negative once past."""
    needed_s: float | None
    """Run time still needed, by `basis`."""
    basis: DeadlineBasis
    on_track: bool | None
    """None when nothing says how long the job still needs."""


def deadline_outlook(record: JobRecord, now: datetime) -> DeadlineOutlook | None:
    """Whether a job with a deadline will make it, from what it said of its pace, else its
    estimate; for a finished job, whether it did. None without a deadline. Pure."""
    deadline = record.request.deadline
    if deadline is None:
        return None
    left_s = (deadline - now).total_seconds()
    if not record.is_active:
        ended = max((a.ended_at for a in record.attempts if a.ended_at), default=record.updated_at)
        done = record.state is JobState.SUCCEEDED
        return DeadlineOutlook(
            deadline=deadline,
            left_s=left_s,
            needed_s=0.0 if done else None,
            basis=DeadlineBasis.PACE,
            on_track=done and ended <= deadline,
        )
    attempt = record.current
    if attempt is not None and attempt.eta_s is not None and attempt.state is AttemptState.RUNNING:
        needed, basis = attempt.eta_s, DeadlineBasis.PACE
    elif record.request.estimate_s is not None:
        ran = sum(
            ((a.ended_at or now) - a.started_at).total_seconds()
            for a in record.attempts
            if a.started_at is not None
        )
        needed, basis = max(0.0, record.request.estimate_s - ran), DeadlineBasis.ESTIMATE
    else:
        return DeadlineOutlook(
            deadline=deadline,
            left_s=left_s,
            needed_s=None,
            basis=DeadlineBasis.UNKNOWN,
            on_track=None if left_s > 0 else False,
        )
    return DeadlineOutlook(
        deadline=deadline, left_s=left_s, needed_s=needed, basis=basis, on_track=needed <= left_s
    )


def bundles_of(request: JobRequested) -> tuple[Bundle, ...]:
    """The job's demand: one bundle per worker, to be placed all or none."""
    return (request.worker,) * request.num_workers


def steps_lost(attempt: Attempt, resumed: Attempt) -> int | None:
    """The steps `attempt` reached that `resumed`, the attempt after it, runs again (the
    checkpointer's `job.resumed` count, from the record); None if it never reported. Pure."""
    if attempt.step is None:
        return None
    return max(attempt.step - resumed.from_step, 0)


def work_left_s(record: JobRecord, now: datetime) -> float | None:
    """Run time the job still needs, from where its current attempt starts (or stands): at
    the pace its attempts last reported (seconds per step, from their ETA), else its
    estimate less the time it has run; None when nothing says. Pure."""
    current = record.current
    paced = [
        (a, a.eta_s, a.step, a.total_steps)
        for a in record.attempts
        if a.eta_s is not None and a.step is not None and a.total_steps and a.step < a.total_steps
    ]
    if paced:
        last, eta_s, step, total = paced[-1]
        if current is None or current is last:
            return eta_s
        return eta_s / (total - step) * max(0, total - current.from_step)
    if record.request.estimate_s is None:
        return None
    ran = sum(
        ((a.ended_at or now) - a.started_at).total_seconds()
        for a in record.attempts
        if a.started_at is not None
    )
    return max(0.0, record.request.estimate_s - ran)


def _moment(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def span_text(seconds: float) -> str:
    """A duration in its two largest units: 42s, 5m12s, 3h07m, 2d04h."""
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class JobsBucket:
    """The jobs bucket, read (by the checkpointer, the client): the submitter, its only
    writer, declares it, and until then it reads empty. A refused request's record is kept
    for a while in a bucket of its own (`refusals_bucket`), which `get` looks in too when
    it is given."""

    def __init__(self, jobs: KeyValue, refusals: KeyValue | None = None) -> None:
        self._jobs = jobs
        self._refusals = refusals

    async def get(self, job_id: str) -> JobRecord | None:
        entry = await self._jobs.get(job_id)
        if entry is None and self._refusals is not None:
            entry = await self._refusals.get(job_id)
        return JobRecord.model_validate_json(entry.value) if entry else None

    async def all(self) -> list[JobRecord]:
        """Every admitted job's record, in no order."""
        return [JobRecord.model_validate_json(entry.value) for entry in await self._jobs.entries()]

    async def active(self) -> list[JobRecord]:
        """Every job that has not ended."""
        return [record for record in await self.all() if record.is_active]
