"""The submitter's decisions, pure: admission under quotas, what to submit to Ray, and
how a job's record moves when Ray reports on an attempt. No I/O, no clock, no ids."""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from services.submitter.model import (
    Attempt,
    AttemptState,
    FailureKind,
    JobRecord,
    JobState,
    RayJobState,
    RayJobStatus,
    SubmissionPlan,
)
from shared.checkpoints import ProgressReport
from shared.events.data import (
    EventData,
    InterruptionCause,
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobPlaced,
    JobProgress,
    JobQueued,
    JobRequested,
    JobResized,
    JobResumed,
    JobStarted,
    JobSucceeded,
    RejectionReason,
    ResizeReason,
)
from shared.events.types import CapacityClass, Frozen
from shared.fairshare import (
    Ask,
    Holding,
    Never,
    Preempt,
    PreemptionCause,
    Wait,
    budget_refusal,
    place,
    worst_case_usd,
)
from shared.jobs import bundles_of, deadline_refusal, work_left_s
from shared.resources import NODE_LABEL, RESOURCE_PER_JOB, capacity_resource
from shared.teams import TeamHold, TeamHolds, Teams, TeamSpec, TeamsStatus, quota_class


class Quotas(Frozen):
    max_gpus_per_job: int = 8
    max_gpus_per_owner: int = 16
    """GPUs one owner's admitted jobs may hold at once; past it, a request waits."""
    max_waiting_per_owner: int = 1000
    """Jobs of one owner that may wait for their quota at once (room for a sweep of
    1,000); past it, a request is refused with the numbers."""


@dataclass(frozen=True)
class Accept:
    gpus: int
    preempting: tuple[str, ...] = ()
    """Jobs asked to checkpoint and give way for this one (their holds are its now)."""
    cause: InterruptionCause | None = None


@dataclass(frozen=True)
class Reject:
    reason: RejectionReason
    detail: str


@dataclass(frozen=True)
class WaitForQuota:
    """Accepted, but its team's quota is taken: it gets its attempt once quota frees."""

    reason: str


Admission = Accept | Reject | WaitForQuota


RAY_TRAIN_ON_SPOT = {
    # A worker group waits this long for its placement before Ray Train decides again: on
    # a notice, the group restarts at the deadline while the going node still counts as
    # alive, and the first try, which wants it too, must not hold the job for a minute.
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "3",
    # How soon the workers hear of a drained node (Ray's default is 5 s of a 15 s notice).
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
    # How often the controller polls the workers: a lost one is seen, and a checkpoint
    # saved on a notice registered, within a second (Ray's default is 2 s).
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1",
}
"""Ray Train's settings for multi-node jobs on capacity that goes (Ray Train reads them in
the driver and passes them to its controller)."""


def admit(
    request: JobRequested,
    *,
    owner_gpus_in_use: int,
    quotas: Quotas,
    now: datetime,
    owner_waiting: int = 0,
) -> Admission:
    """Accept a request within the quotas and with a deadline it can meet. One past its
    owner's GPU quota waits for it (queued, with the reason), up to the owner's queue
    depth; one past that, or larger than any job may be, is refused with the numbers.
    `owner_waiting`: the owner's jobs already waiting for quota."""
    if request.deadline is not None:
        refusal = deadline_refusal(
            now=now, deadline=request.deadline, estimate_s=request.estimate_s
        )
        if refusal is not None:
            return Reject(RejectionReason.DEADLINE_UNREACHABLE, refusal)
    gpus = request.worker.gpus * request.num_workers
    if gpus > quotas.max_gpus_per_job:
        return Reject(
            RejectionReason.QUOTA_EXCEEDED,
            f"the job asks for {gpus} GPUs; the limit per job is {quotas.max_gpus_per_job}",
        )
    if gpus > quotas.max_gpus_per_owner:
        return Reject(
            RejectionReason.QUOTA_EXCEEDED,
            f"the job asks for {gpus} GPUs; {request.owner} may hold "
            f"{quotas.max_gpus_per_owner} at once",
        )
    over = owner_over_quota(request, owner_gpus_in_use, quotas)
    if over is None:
        # A smaller job may pass a larger one of the same owner that waits: the quota it
        # takes is free now, and the waiting ones take quota in priority order as it frees.
        return Accept(gpus=gpus)
    if owner_waiting >= quotas.max_waiting_per_owner:
        return Reject(
            RejectionReason.QUOTA_EXCEEDED,
            f"{request.owner} already has {owner_waiting} jobs waiting for quota, the most "
            f"one person may queue ({quotas.max_waiting_per_owner}); cancel some or wait",
        )
    return WaitForQuota(over)


def owner_over_quota(request: JobRequested, in_use: int, quotas: Quotas) -> str | None:
    """Why the request must wait for its owner's GPU quota, if it must."""
    gpus = request.worker.gpus * request.num_workers
    if in_use + gpus <= quotas.max_gpus_per_owner:
        return None
    return (
        f"{request.owner} holds {in_use} GPUs; with this job's {gpus} that is "
        f"{in_use + gpus}, over their quota of {quotas.max_gpus_per_owner}: it waits for "
        "their running jobs to end"
    )


def owner_gpus_in_use(records: Iterable[JobRecord], owner: str) -> int:
    """GPUs held by an owner's admitted, active jobs (a job waiting for quota holds none)."""
    return sum(
        record.gpus
        for record in records
        if record.is_active
        and record.request.owner == owner
        and record.attempts
        and record.waiting_for is None
    )


def owner_waiting(records: Iterable[JobRecord], owner: str) -> int:
    """An owner's active jobs waiting for quota."""
    return sum(
        1
        for record in records
        if record.is_active and record.request.owner == owner and record.waiting_for is not None
    )


def admit_in_team(  # the decision's inputs, each named
    request: JobRequested,
    teams: Teams,
    holds: TeamHolds,
    now: datetime,
    *,
    records: Mapping[str, JobRecord],
    min_runtime_s: float,
    money: Money | None = None,
) -> tuple[Admission, TeamHolds]:
    """A request under the teams file: refused when its owner has no team, it is larger
    than the team can ever hold, or its worst-case cost does not fit what is left of the
    team's monthly budget; admitted with a hold on the team's quota (guaranteed or
    borrowed), at once or by taking the holds of jobs that must give way (borrowed work
    reclaimed, lower priority work of its team), which are then asked to checkpoint and
    stop; else it waits, with the reason. Returns the holds to write back."""
    team = teams.team_of(request.owner)
    if team is None:
        detail = f"{request.owner} is in no team of the teams file; ask an admin to add them"
        return Reject(RejectionReason.NO_TEAM, detail), holds
    gpus = request.worker.gpus * request.num_workers
    held = holds.holds.get(request.job_id)
    if held is not None:
        return Accept(gpus=gpus), holds  # a repeat delivery: admitted the first time
    capacity = quota_class(request.capacity)
    ask = Ask(team=team.name, capacity=capacity, gpus=gpus, priority=request.priority)
    decision = place(ask, teams, holdings_of(holds, records, now), min_runtime_s=min_runtime_s)
    if isinstance(decision, Never):
        return Reject(RejectionReason.QUOTA_EXCEEDED, decision.reason), holds
    worst = 0.0
    if team.monthly_budget_usd is not None:
        price = money.gpu_hour_usd.get(request.capacity) if money is not None else None
        if money is None or price is None:
            return WaitForQuota(_UNPRICED), holds
        worst = worst_case_usd(gpus, price, request.max_hours or money.default_max_hours)
        refused = _over_budget(team, holds, money, worst)
        if refused is not None:
            return refused, holds
    if isinstance(decision, Wait):
        return WaitForQuota(decision.reason), holds
    victims: tuple[str, ...] = ()
    cause = None
    if isinstance(decision, Preempt):
        victims = tuple(v.job_id for v in decision.victims)
        cause = (
            InterruptionCause.RECLAIMED
            if decision.cause is PreemptionCause.RECLAIMED
            else InterruptionCause.PRIORITY
        )
        holds = released(holds, victims)
    hold = TeamHold(
        job_id=request.job_id,
        team=team.name,
        owner=request.owner,
        capacity=capacity,
        gpus=gpus,
        priority=request.priority,
        borrowed=decision.borrowed,
        since=now,
        worst_case_usd=worst,
    )
    admitted = Accept(gpus=gpus, preempting=victims, cause=cause)
    return admitted, TeamHolds(holds={**holds.holds, request.job_id: hold})


@dataclass(frozen=True)
class Money:
    """What team budgets are weighed with: the ledger's spend per owner this month (the
    scaler's), the dearest GPU-hour per requested capacity (its pools), and the hours a job
    without `--max-hours` is held to on a team with a budget."""

    spent_by_owner: Mapping[str, float]
    gpu_hour_usd: Mapping[CapacityClass, float | None]
    default_max_hours: float


def max_hours_of(request: JobRequested, team: TeamSpec | None, default: float) -> float | None:
    """The hours the platform stops a job at: its own `--max-hours`, else, on a team with a
    budget, the default (its worst case must be bounded to be admitted)."""
    if request.max_hours is not None:
        return request.max_hours
    return default if team is not None and team.monthly_budget_usd is not None else None


_UNPRICED = (
    "its team has a budget and the platform does not know its GPU prices or spend yet (the "
    "scaler reports them)"
)


def _over_budget(
    team: TeamSpec, holds: TeamHolds, money: Money, worst: float
) -> Reject | WaitForQuota | None:
    """Refused when even with nothing else running the job does not fit the budget; waits
    while the worst cases of the team's running jobs are what does not fit."""
    spent = sum(money.spent_by_owner.get(member, 0.0) for member in team.members)
    reserved = sum(h.worst_case_usd for h in holds.holds.values() if h.team == team.name)
    refusal = budget_refusal(team, spent_usd=spent, reserved_usd=reserved, worst_case_usd=worst)
    if refusal is None:
        return None
    if budget_refusal(team, spent_usd=spent, reserved_usd=0.0, worst_case_usd=worst):
        return Reject(RejectionReason.OVER_BUDGET, refusal)
    return WaitForQuota(refusal)


def holdings_of(holds: TeamHolds, records: Mapping[str, JobRecord], now: datetime) -> list[Holding]:
    """The holds as fair share weighs them, with how long each job's attempt has run and
    the work since its last checkpoint (at its checkpoint interval, else all it ran). A
    job not on a node yet has run 0 s: it gives way at once, losing nothing. One whose
    record this replica has not seen yet (another wrote it a moment ago) is left alone."""
    holdings = []
    for hold in holds.holds.values():
        record = records.get(hold.job_id)
        attempt = record.current if record is not None else None
        if record is None or attempt is None:
            ran_s = _NOT_SEEN_S
        elif attempt.state is AttemptState.RUNNING and attempt.started_at is not None:
            ran_s = max((now - attempt.started_at).total_seconds(), _NOT_SEEN_S)
        else:
            ran_s = 0.0
        interval = record.request.checkpoint_interval_s if record is not None else None
        holdings.append(
            Holding(
                job_id=hold.job_id,
                team=hold.team,
                capacity=hold.capacity,
                gpus=hold.gpus,
                priority=hold.priority,
                borrowed=hold.borrowed,
                ran_s=ran_s,
                since_checkpoint_s=ran_s % interval if interval else ran_s,
            )
        )
    return holdings


_NOT_SEEN_S = 1e-6
"""Run time of a job fair share must not preempt: more than 0 (not "waiting for a node")
and less than any minimum runtime."""


def released(holds: TeamHolds, job_ids: Iterable[str]) -> TeamHolds:
    gone = set(job_ids)
    return TeamHolds(holds={k: h for k, h in holds.holds.items() if k not in gone})


def stale_holds(
    holds: TeamHolds, records: Mapping[str, JobRecord], now: datetime, *, grace_s: float
) -> list[str]:
    """Holds to drop: of jobs that ended (a release that a crash lost), or whose record
    never came (a crash between the hold and the record) after `grace_s`. A waiting job's
    hold stays: it is being given its quota, and its next pass finds the hold its own."""
    stale = []
    for job_id, hold in holds.holds.items():
        record = records.get(job_id)
        if record is None:
            if (now - hold.since).total_seconds() > grace_s:
                stale.append(job_id)
        elif not record.is_active:
            stale.append(job_id)
    return stale


def waiting_order(records: Iterable[JobRecord]) -> list[JobRecord]:
    """Jobs waiting for quota, in the order they get it: higher priority, then older."""
    waiting = [r for r in records if r.is_active and r.waiting_for is not None]
    return sorted(waiting, key=lambda r: (-r.request.priority, r.accepted_at, r.job_id))


def teams_status(
    teams: Teams,
    holds: TeamHolds,
    records: Iterable[JobRecord],
    now: datetime,
    spent_by_owner: Mapping[str, float] | None = None,
) -> TeamsStatus:
    waiting: dict[str, int] = {}
    for record in records:
        if record.is_active and record.waiting_for is not None and record.team is not None:
            waiting[record.team] = waiting.get(record.team, 0) + 1
    spent = {}
    if spent_by_owner is not None:
        spent = {
            name: sum(spent_by_owner.get(member, 0.0) for member in team.members)
            for name, team in teams.teams.items()
        }
    return TeamsStatus(teams=teams, holds=holds, waiting=waiting, spent_usd=spent, at=now)


def quota_freed(record: JobRecord, now: datetime) -> JobRecord:
    """A waiting job given its quota, ready to submit: its first attempt, or the one it
    resumes with after it gave way."""
    current = record.current
    if current is not None and current.state is AttemptState.QUEUED:
        return record.model_copy(update={"waiting_for": None, "updated_at": now})
    return record.model_copy(
        update={
            "waiting_for": None,
            "attempts": (_first_attempt(record.job_id, now),),
            "updated_at": now,
        }
    )


def _first_attempt(job_id: str, now: datetime) -> Attempt:
    return Attempt(
        number=1,
        submission_id=submission_id(job_id, 1),
        submitted_at=now,
        state=AttemptState.QUEUED,
    )


def unknown_secrets_detail(names: Iterable[str]) -> str:
    listed = ", ".join(names)
    return (
        f"the platform has no secret {listed} (a file of ~/.spotrain/secrets on the local "
        "stack, a key of the chart's submitter secret on GKE)"
    )


def new_record(
    request: JobRequested,
    request_event_id: str,
    decision: Admission,
    now: datetime,
    *,
    checkpoint_uri: str,
    team: str | None = None,
    max_hours: float | None = None,
) -> JobRecord:
    """The first record of a job: rejected with its reason, waiting for its team's quota
    (no attempt yet), or queued with attempt 1."""
    queued = JobRecord(
        request=request,
        request_event_id=request_event_id,
        state=JobState.QUEUED,
        accepted_at=now,
        updated_at=now,
        checkpoint_uri=checkpoint_uri,
        team=team,
        max_hours=max_hours,
    )
    if isinstance(decision, WaitForQuota):
        return queued.model_copy(update={"waiting_for": decision.reason})
    if isinstance(decision, Reject):
        return queued.model_copy(
            update={
                "state": JobState.REJECTED,
                "rejection": decision.reason,
                "detail": decision.detail,
            }
        )
    return queued.model_copy(update={"attempts": (_first_attempt(request.job_id, now),)})


def submission_id(job_id: str, attempt: int, requeued: int = 0) -> str:
    """Ray's id of an attempt; one that went back to the queue gets a new one each time,
    since Ray keeps the id of a job it failed."""
    return f"{job_id}-{attempt}" if requeued == 0 else f"{job_id}-{attempt}-r{requeued}"


def checkpoint_uri(checkpoint_root: str, job_id: str) -> str:
    """Each job checkpoints (and reports progress) under its own folder of the root."""
    return f"{checkpoint_root.rstrip('/')}/{job_id}"


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
        return Transition(Reason.SUBMITTED, _with_attempt(record, handed, JobState.QUEUED, now))
    if attempt.state is AttemptState.SUBMITTED and attempt.placed_on != placement.nodes:
        again = attempt.requeued + 1
        update |= {
            "requeued": again,
            "submission_id": submission_id(record.job_id, attempt.number, again),
        }
        moved = attempt.model_copy(update=update)
        return Transition(Reason.REPLACED, _with_attempt(record, moved, JobState.QUEUED, now))
    return Transition(Reason.UNCHANGED, record)


def plan_submission(record: JobRecord, attempt: Attempt, *, checkpoint_uri: str) -> SubmissionPlan:
    """What Ray gets for one attempt: a quoted command, its pinning, the training contract."""
    request = record.request
    single_node = request.num_workers == 1
    pin = capacity_resource(record.capacity_of(attempt))
    env = {
        **request.env,
        "SPOTRAIN_JOB_ID": request.job_id,
        "SPOTRAIN_ATTEMPT": str(attempt.number),
        "SPOTRAIN_CHECKPOINT_URI": checkpoint_uri,
        "SPOTRAIN_NUM_WORKERS": str(request.num_workers),
        "SPOTRAIN_MAX_WORKERS": str(request.max_workers or request.num_workers),
        "SPOTRAIN_GPUS_PER_WORKER": str(request.worker.gpus),
        "SPOTRAIN_CPUS_PER_WORKER": str(request.worker.cpus),
    }
    if not single_node and pin:
        # The workers, not the driver, go on the attempt's capacity: the training helper
        # hands this to Ray Train as each worker's resources.
        env["SPOTRAIN_WORKER_RESOURCES"] = json.dumps({pin: RESOURCE_PER_JOB})
    if not single_node:
        env |= RAY_TRAIN_ON_SPOT
    if attempt.resumed_from:
        env["SPOTRAIN_RESUME_FROM"] = attempt.resumed_from
    metadata = {"job_id": request.job_id, "attempt": str(attempt.number), "owner": request.owner}
    selector: dict[str, str] = {}
    if single_node and attempt.placed_on:
        # The room the scaler holds for this attempt, and no other: Ray's own choice of a
        # node would take room held for the next attempt in the platform's order.
        selector = {NODE_LABEL: f"in({','.join(sorted(set(attempt.placed_on)))})"}
    elif lost := lost_nodes(record):
        selector = {NODE_LABEL: f"!in({','.join(lost)})"}
    if request.experiment:
        metadata["experiment"] = request.experiment
    return SubmissionPlan(
        submission_id=attempt.submission_id,
        # An argv list, quoted here: no user string reaches a shell unquoted.
        entrypoint=shlex.join(request.entrypoint),
        # A single-node job's driver is its worker, on the attempt's capacity. A multi-node
        # driver only coordinates the workers it places itself (Ray Train): it asks for
        # nothing, so Ray runs it on the head (on-demand, never resized), and losing any
        # spot node never loses the attempt.
        entrypoint_num_cpus=request.worker.cpus if single_node else 0,
        entrypoint_num_gpus=request.worker.gpus if single_node else 0,
        entrypoint_memory_bytes=int(request.worker.memory_gb * 1024**3) if single_node else 0,
        entrypoint_resources={pin: RESOURCE_PER_JOB} if pin and single_node else {},
        entrypoint_label_selector=selector,
        env_vars=env,
        pip=request.pip,
        metadata=metadata,
    )


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


# Ray reports these when the process supervising the job vanished with its node. The
# last: Ray's job manager looks a running job's supervisor up and finds none, which is
# what it sees once the supervisor's node was killed (ray/dashboard/modules/job/
# job_manager.py, "failed to get job supervisor"); user code cannot cause it.
_NODE_LOSS_ERRORS = frozenset(
    {
        "JOB_SUPERVISOR_ACTOR_DIED",
        "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE",
        "JOB_SUPERVISOR_ACTOR_START_FAILURE",
    }
)


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
    queued_again = attempt.model_copy(
        update={
            "state": AttemptState.QUEUED,
            "placed_on": (),
            "pool": None,
            "nodes": (),
            "requeued": again,
            "submission_id": submission_id(record.job_id, attempt.number, again),
        }
    )
    moved = _with_attempt(record, queued_again, JobState.QUEUED, now)
    queued = queued_event(moved, queued_again, now)
    key = f"queued-{record.job_id}-{attempt.number}-r{again}"
    return Transition(Reason.REQUEUED, moved, (Fact(key, queued),))


def classify_failure(status: RayJobStatus, *, checkpoint_requested: bool) -> FailureKind:
    """A failed attempt is the user's unless Ray says its node went away under it, or the
    platform itself asked it to checkpoint and stop (its node is being preempted)."""
    if checkpoint_requested or status.error_type in _NODE_LOSS_ERRORS:
        return FailureKind.NODE_LOST
    return FailureKind.USER_ERROR


def on_ray_status(
    record: JobRecord,
    status: RayJobStatus | None,
    now: datetime,
    *,
    checkpoint_requested: bool = False,
    moving: bool = False,
) -> Transition:
    """How the record moves given what Ray says of its current attempt.

    `checkpoint_requested`: whether the platform asked this attempt to checkpoint and stop
    (CHECKPOINT_NOW names it); `moving`: whether it asked so to move the job to other
    capacity (then its end is a move, not a loss). Only looked at when Ray says the
    attempt failed.
    """
    attempt = record.current
    if attempt is None or attempt.state not in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        return Transition(Reason.UNCHANGED, record)
    if status is None:
        return Transition(Reason.NOT_SUBMITTED, record)
    job_id, n = record.job_id, attempt.number
    match status.state:
        case RayJobState.PENDING:
            return Transition(Reason.UNCHANGED, record)
        case RayJobState.RUNNING:
            placed = _placed(attempt, status)
            if attempt.state is AttemptState.RUNNING:
                if placed == attempt:
                    return Transition(Reason.UNCHANGED, record)
                return Transition(Reason.PLACED, _with_attempt(record, placed, record.state, now))
            started = placed.model_copy(update={"state": AttemptState.RUNNING, "started_at": now})
            return Transition(
                Reason.STARTED,
                _with_attempt(record, started, JobState.RUNNING, now),
                (_started(started, job_id),),
            )
        case RayJobState.SUCCEEDED:
            ended = _ended(attempt, AttemptState.SUCCEEDED, now, status.message)
            return Transition(
                Reason.SUCCEEDED,
                _with_attempt(record, ended, JobState.SUCCEEDED, now),
                (
                    *_unseen_start(attempt, job_id),
                    Fact(f"succeeded-{job_id}-{n}", JobSucceeded(job_id=job_id, attempt=n)),
                ),
            )
        case RayJobState.STOPPED | RayJobState.FAILED if (
            attempt.give_way is not None and not record.cancel_requested
        ):
            # Asked to give way: its end, by its own checkpoint-and-exit or by Ray's stop
            # after the grace, is that preemption, whatever Ray calls it.
            placed = _placed(attempt, status)
            return _interrupted(record, placed, attempt.give_way, now, _gave_way(attempt))
        case RayJobState.STOPPED:
            return _cancelled(record, attempt, now, status.message)
        case RayJobState.FAILED:
            if record.cancel_requested:
                return _cancelled(record, attempt, now, status.message)
            if never_started(status, attempt):
                return requeue(record, now)
            return _failed(
                record, attempt, status, now, checkpoint_requested=checkpoint_requested,
                moving=moving,
            )  # fmt: skip


def _failed(  # on_ray_status's inputs, passed on
    record: JobRecord,
    attempt: Attempt,
    status: RayJobStatus,
    now: datetime,
    *,
    checkpoint_requested: bool,
    moving: bool,
) -> Transition:
    """Ray says the attempt failed: its capacity went (a preemption, a move, a lost node)
    or its own code failed."""
    job_id, n = record.job_id, attempt.number
    message = status.message or "the job failed"
    kind = classify_failure(status, checkpoint_requested=checkpoint_requested)
    if kind is FailureKind.NODE_LOST:
        cause = InterruptionCause.PREEMPTED if checkpoint_requested else InterruptionCause.NODE_LOST
        if checkpoint_requested and moving:
            cause = InterruptionCause.MOVED
        return _interrupted(record, _placed(attempt, status), cause, now, message)
    failed = _ended(attempt, AttemptState.FAILED, now, message)
    failure = JobFailed(job_id=job_id, attempt=n, message=message[-8000:])
    return Transition(
        Reason.USER_ERROR,
        _with_attempt(record, failed, JobState.FAILED, now),
        (*_unseen_start(attempt, job_id), Fact(f"failed-{job_id}-{n}", failure)),
    )


def is_multi_node(record: JobRecord) -> bool:
    request = record.request
    return request.num_workers > 1 or (request.max_workers or 0) > 1


def wants_worker_nodes(record: JobRecord, report: ProgressReport | None) -> bool:
    """Whether this report is worth asking Ray where a multi-node attempt's workers are:
    before the first count, and whenever its group may have restarted (a new count, or
    the step went back). Not on every step: Ray's state API is not free."""
    attempt = record.current
    if (
        report is None
        or attempt is None
        or attempt.state is not AttemptState.RUNNING
        or report.attempt != attempt.number
        or not is_multi_node(record)
    ):
        return False
    return (
        attempt.workers is None
        or (report.workers is not None and report.workers != attempt.workers)
        or (attempt.step is not None and report.step < attempt.step)
    )


def workers_stalled(
    record: JobRecord, report: ProgressReport | None, now: datetime, *, after_s: float
) -> bool:
    """A running multi-node attempt whose group ran (it was counted) and has not reported
    for `after_s`: its group may be down, waiting for workers it cannot get. Before its
    first count it waits for its first gang, which is the scaler's to find, not a loss."""
    attempt = record.current
    if (
        attempt is None
        or attempt.state is not AttemptState.RUNNING
        or attempt.started_at is None
        or attempt.workers is None
        or not is_multi_node(record)
    ):
        return False
    last = attempt.started_at
    if report is not None and report.attempt == attempt.number:
        last = max(last, report.updated_at)
    return (now - last).total_seconds() >= after_s


def on_workers_seen(
    record: JobRecord, alive: tuple[str, ...] | None, now: datetime, *, fallback_after_s: float
) -> Transition:
    """Ray says how many workers a silent multi-node attempt holds (`alive`: one node per
    live worker; None: it could not say). Fewer than its MIN since `fallback_after_s` ago:
    Ray Train waits for room that has not come, so the attempt ends as lost
    (`short-of-workers`) and the checkpointer takes it on from its latest checkpoint, as
    for any lost attempt, with its budget and its fallback to on-demand."""
    attempt = record.current
    if alive is None or attempt is None or attempt.state is not AttemptState.RUNNING:
        return Transition(Reason.UNCHANGED, record)
    least = record.request.num_workers
    if len(alive) >= least:
        if attempt.short_of_workers_since is None:
            return Transition(Reason.UNCHANGED, record)
        enough = attempt.model_copy(update={"short_of_workers_since": None})
        return Transition(Reason.SHORT_OF_WORKERS, _with_attempt(record, enough, record.state, now))
    since = attempt.short_of_workers_since or now
    if (now - since).total_seconds() < fallback_after_s:
        if attempt.short_of_workers_since is not None:
            return Transition(Reason.UNCHANGED, record)
        short = attempt.model_copy(update={"short_of_workers_since": now})
        return Transition(Reason.SHORT_OF_WORKERS, _with_attempt(record, short, record.state, now))
    message = (
        f"{len(alive)} of its {least} workers (MIN) could be held for "
        f"{(now - since).total_seconds():.0f} s: it goes on as a new attempt from its latest "
        "checkpoint"
    )
    return _interrupted(record, attempt, InterruptionCause.SHORT_OF_WORKERS, now, message)


def on_progress(
    record: JobRecord,
    report: ProgressReport | None,
    now: datetime,
    *,
    worker_nodes: tuple[str, ...] | None = None,
) -> Transition:
    """Training reported a step: publish it once, for the attempt that is running now; and
    when a multi-node attempt has a new number of workers (as its training reports, else as
    many as `worker_nodes`, where Ray says they are), or the same number on other nodes,
    that it was resized. Ray Train resizes by restarting the group from its latest
    checkpoint: the step may go back, and the attempt is at that step from then on."""
    attempt = record.current
    if (
        report is None
        or attempt is None
        or attempt.state is not AttemptState.RUNNING
        or report.attempt != attempt.number
    ):
        return Transition(Reason.UNCHANGED, record)
    workers = report.workers
    if workers is None and worker_nodes and is_multi_node(record):
        workers = len(worker_nodes)
    moved = bool(worker_nodes) and worker_nodes != attempt.worker_nodes
    resized = workers is not None and (workers != attempt.workers or moved)
    if attempt.step is not None and report.step <= attempt.step and not resized:
        return Transition(Reason.UNCHANGED, record)
    # Events carry finite numbers under well-formed names; a NaN loss stays in the file.
    metrics = {
        name: value
        for name, value in report.metrics.items()
        if math.isfinite(value) and _METRIC_NAME.match(name)
    }
    eta = eta_s(attempt, report.step, report.total_steps, report.updated_at)
    nodes = worker_nodes or ()
    update: dict[str, object] = {
        "step": report.step,
        "metrics": metrics,
        "total_steps": report.total_steps,
        "eta_s": eta,
        "short_of_workers_since": None,  # it reports: its group is up
    }
    if resized:
        update |= {"workers": workers, "worker_nodes": nodes}
    progress = JobProgress(
        job_id=record.job_id,
        attempt=attempt.number,
        step=report.step,
        total_steps=report.total_steps,
        metrics=dict(sorted(metrics.items())[:64]),
        eta_s=eta,
    )
    facts = [Fact(f"progress-{record.job_id}-{attempt.number}-{report.step}", progress)]
    if resized:
        assert workers is not None
        facts.insert(0, _resized(record, attempt, workers, report.step, nodes))
    return Transition(
        Reason.PROGRESSED,
        _with_attempt(record, attempt.model_copy(update=update), record.state, now),
        tuple(facts),
    )


def _resized(
    record: JobRecord, attempt: Attempt, workers: int, step: int, nodes: tuple[str, ...]
) -> Fact:
    request = record.request
    previous = attempt.workers
    if previous is None:
        reason = ResizeReason.COUNTED
    elif workers == previous:
        reason = ResizeReason.MOVED
    else:
        reason = ResizeReason.GREW if workers > previous else ResizeReason.SHRANK
    went_back = attempt.step is not None and step < attempt.step
    resized = JobResized(
        job_id=record.job_id,
        attempt=attempt.number,
        workers=workers,
        previous=previous,
        min_workers=request.num_workers,
        max_workers=max(request.max_workers or request.num_workers, workers),
        reason=reason,
        worker=request.worker,
        capacity=attempt.capacity or request.capacity,
        priority=request.priority,
        step=step,
        nodes=nodes,
        steps_lost=attempt.step - step if went_back and attempt.step is not None else 0,
    )
    key = f"resized-{record.job_id}-{attempt.number}-{previous or 0}-{workers}-{step}"
    return Fact(key, resized)


def eta_s(attempt: Attempt, step: int, total_steps: int | None, at: datetime) -> float | None:
    """Seconds left at the pace the attempt kept since it started (from the step it
    resumed at); None without a total, or before a step's worth of pace is known."""
    if total_steps is None or attempt.started_at is None:
        return None
    done = step - attempt.from_step
    took = (at - attempt.started_at).total_seconds()
    if done <= 0 or took <= 0:
        return None
    return round(max(total_steps - step, 0) * took / done, 3)


_METRIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")


def who_may_not_cancel(
    record: JobRecord, requested_by: str, teams: Teams | None = None
) -> str | None:
    """Why `requested_by` may not cancel this job, if they may not: a job is its owner's
    to cancel, and its team admins'. `requested_by` is proven, as the owner was: each is
    the name of the credential that sent the request (`shared.events.catalog.SENT_BY`)."""
    if requested_by == record.request.owner:
        return None
    team = teams.team_of(record.request.owner) if teams is not None else None
    if team is not None and requested_by in team.admins:
        return None
    admins = f" or an admin of team {team.name}" if team is not None else ""
    owner = record.request.owner
    return f"{requested_by} may not cancel {record.job_id}: only {owner}{admins} may"


def may_read(record: JobRecord, reader: str, teams: Teams | None = None) -> bool:
    """Whether `reader` (proven, as the desk's asker is) may read this job's record and
    events, `--env` values included: their own jobs and their team's. The team is the one
    the job was admitted under, else the owner's today."""
    if reader == record.request.owner:
        return True
    if teams is None:
        return False
    readers_team = teams.team_of(reader)
    if readers_team is None:
        return False
    owners_team = record.team
    if owners_team is None:
        found = teams.team_of(record.request.owner)
        owners_team = found.name if found is not None else None
    return owners_team == readers_team.name


def cancel(record: JobRecord, now: datetime) -> Transition:
    """A cancellation request: flag the record; a job with nothing running ends at once."""
    if not record.is_active:
        return Transition(Reason.UNCHANGED, record)
    flagged = record.model_copy(update={"cancel_requested": True, "updated_at": now})
    attempt = record.current
    if attempt is not None and attempt.state is AttemptState.QUEUED:
        # Nothing of it is in Ray: it ends here, and its demand goes with `job.cancelled`.
        flagged = _with_attempt(
            flagged, _ended(attempt, AttemptState.STOPPED, now, "cancelled"), flagged.state, now
        )
    if attempt is None or attempt.state not in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        ended = flagged.model_copy(update={"state": JobState.CANCELLED})
        cancelled = JobCancelled(job_id=record.job_id, attempt=attempt.number if attempt else None)
        return Transition(Reason.CANCELLED, ended, (Fact(f"cancelled-{record.job_id}", cancelled),))
    return Transition(Reason.UNCHANGED, flagged)


def resume(record: JobRecord, resumed: JobResumed, now: datetime) -> Transition:
    """The checkpointer decided that the job carries on as attempt `resumed.attempt`.

    Applies once, and only to the attempt it follows: a repeat, or a decision about an
    attempt that is no longer the current one, changes nothing. An attempt still live in
    the record (its loss was news to us) ends as lost first, so the interruption is said.
    """
    attempt = record.current
    if not record.is_active or attempt is None or resumed.attempt != attempt.number + 1:
        return Transition(Reason.UNCHANGED, record)
    facts: tuple[Fact, ...] = ()
    if attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        cause, message = InterruptionCause.NODE_LOST, "its node was lost"
        if resumed.moved is not None:
            cause = InterruptionCause.MOVED
            message = f"moved to {resumed.capacity.value} capacity ({resumed.moved.value})"
        if attempt.give_way is not None:
            cause, message = attempt.give_way, _gave_way(attempt)
        interrupted = _interrupted(record, attempt, cause, now, message)
        record, facts = interrupted.record, interrupted.facts
    elif attempt.state is not AttemptState.LOST:
        return Transition(Reason.UNCHANGED, record)
    lost = record.attempts[-1]
    following = Attempt(
        number=resumed.attempt,
        submission_id=submission_id(record.job_id, resumed.attempt),
        state=AttemptState.QUEUED,
        submitted_at=now,
        capacity=resumed.capacity if resumed.capacity is not record.request.capacity else None,
        resumed_from=resumed.from_checkpoint,
        from_step=resumed.from_step,
    )
    if lost.cause in GIVE_WAY:
        # It gave its quota away: it waits for quota again, and is no demand until then.
        waiting = record.model_copy(
            update={
                "attempts": (*record.attempts, following),
                "state": JobState.QUEUED,
                "updated_at": now,
                "waiting_for": f"{_gave_way(lost)}; it goes on from its checkpoint once its "
                "team's quota allows",
            }
        )
        return Transition(Reason.RESUMED, waiting, facts)
    moved = record.model_copy(
        update={
            "attempts": (*record.attempts, following),
            "state": JobState.QUEUED,
            "updated_at": now,
        }
    )
    queued = queued_event(moved, following, now)
    return Transition(
        Reason.RESUMED,
        moved,
        (*facts, Fact(f"queued-{record.job_id}-{following.number}", queued)),
    )


GIVE_WAY = frozenset({InterruptionCause.RECLAIMED, InterruptionCause.PRIORITY})
"""Why the platform stops a job, checkpoint first, for other work (`shared.fairshare`)."""


_WHY_GIVE_WAY = {
    InterruptionCause.RECLAIMED: "its team's borrowed quota was taken back",
    InterruptionCause.PRIORITY: "a higher priority job of its team needed the room",
}


def _gave_way(attempt: Attempt) -> str:
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
    return _with_attempt(record, asked, record.state, now)


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
    return _interrupted(record, asked, cause, now, _gave_way(asked))


def past_max_hours(record: JobRecord, now: datetime) -> JobRecord | None:
    """The record of a job that ran past its max hours, asked to stop (it ends cancelled,
    with the reason); None while it may run on."""
    if (
        record.max_hours is None
        or record.cancel_requested
        or not record.is_active
        or record.ran_s(now) < record.max_hours * 3600
    ):
        return None
    detail = f"stopped after {record.max_hours:g} h of running, its limit (--max-hours)"
    return record.model_copy(update={"cancel_requested": True, "detail": detail, "updated_at": now})


def give_way_overdue(attempt: Attempt, now: datetime, grace_s: float) -> bool:
    """An attempt asked to give way that has not stopped within the grace period: Ray
    stops it, and it goes on from the last checkpoint it wrote."""
    asked = attempt.give_way_asked_at
    return (
        asked is not None
        and attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING)
        and (now - asked).total_seconds() >= grace_s
    )


def abandon(record: JobRecord, failed: JobFailed, now: datetime) -> Transition:
    """The checkpointer gave up on the job (restart budget spent): it ends as failed.

    The checkpointer published the `job.failed` itself; this only brings the record along.
    """
    attempt = record.current
    if not record.is_active or attempt is None or attempt.number != failed.attempt:
        return Transition(Reason.UNCHANGED, record)
    if attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        attempt = _ended(attempt, AttemptState.LOST, now, failed.message)
    ended = _with_attempt(record, attempt, JobState.FAILED, now)
    return Transition(Reason.ABANDONED, ended.model_copy(update={"detail": failed.message}))


def _interrupted(
    record: JobRecord, attempt: Attempt, cause: InterruptionCause, now: datetime, message: str
) -> Transition:
    lost = _ended(attempt, AttemptState.LOST, now, message).model_copy(update={"cause": cause})
    interrupted = JobInterrupted(
        job_id=record.job_id,
        attempt=attempt.number,
        node=attempt.nodes[0] if attempt.nodes else "unknown",
        cause=cause,
    )
    return Transition(
        Reason.NODE_LOST,
        _with_attempt(record, lost, JobState.INTERRUPTED, now),
        (
            *_unseen_start(attempt, record.job_id),
            Fact(f"interrupted-{record.job_id}-{attempt.number}", interrupted),
        ),
    )


def _placed(attempt: Attempt, status: RayJobStatus) -> Attempt:
    """The attempt with the node Ray placed its driver on, once Ray says."""
    if status.node is None or attempt.nodes:
        return attempt
    return attempt.model_copy(update={"nodes": (status.node,), "pool": status.pool})


def _cancelled(
    record: JobRecord, attempt: Attempt, now: datetime, message: str | None
) -> Transition:
    stopped = _ended(attempt, AttemptState.STOPPED, now, message)
    cancelled = JobCancelled(job_id=record.job_id, attempt=attempt.number)
    return Transition(
        Reason.CANCELLED,
        _with_attempt(record, stopped, JobState.CANCELLED, now),
        (Fact(f"cancelled-{record.job_id}", cancelled),),
    )


def _started(attempt: Attempt, job_id: str) -> Fact:
    started = JobStarted(
        job_id=job_id,
        attempt=attempt.number,
        submission_id=attempt.submission_id,
        pool=attempt.pool,
        nodes=attempt.nodes,
    )
    return Fact(f"started-{job_id}-{attempt.number}", started)


def _unseen_start(attempt: Attempt, job_id: str) -> tuple[Fact, ...]:
    """An attempt that ended between two looks did start: say so first, once."""
    return (_started(attempt, job_id),) if attempt.state is AttemptState.SUBMITTED else ()


def _ended(attempt: Attempt, state: AttemptState, now: datetime, message: str | None) -> Attempt:
    return attempt.model_copy(update={"state": state, "ended_at": now, "message": message})


def _with_attempt(record: JobRecord, attempt: Attempt, state: JobState, now: datetime) -> JobRecord:
    attempts = (*record.attempts[:-1], attempt)
    return record.model_copy(update={"attempts": attempts, "state": state, "updated_at": now})
