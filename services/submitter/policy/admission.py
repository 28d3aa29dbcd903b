"""Admission, pure: a request within the per-job and per-owner quotas and with a deadline
it can meet is accepted; past its owner's GPU quota it waits, up to the owner's queue
depth; the first record of a job."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from services.submitter.model import (
    Attempt,
    AttemptState,
    JobRecord,
    JobState,
)
from services.submitter.policy.transitions import submission_id
from shared.events.data import (
    InterruptionCause,
    JobRequested,
    RejectionReason,
)
from shared.events.types import Frozen
from shared.jobs import deadline_refusal
from shared.policy.teams import TeamSpec
from shared.workspace import workspace_object_name


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
    gpus = request.most_gpus
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
    gpus = request.most_gpus
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


def max_hours_of(request: JobRequested, team: TeamSpec | None, default: float) -> float | None:
    """The hours the platform stops a job at: its own `--max-hours`, else, on a team with a
    budget, the default (its worst case must be bounded to be admitted)."""
    if request.max_hours is not None:
        return request.max_hours
    return default if team is not None and team.monthly_budget_usd is not None else None


def first_attempt(job_id: str, now: datetime) -> Attempt:
    return Attempt(
        number=1,
        submission_id=submission_id(job_id, 1),
        submitted_at=now,
        state=AttemptState.QUEUED,
    )


def workspace_refusal(request: JobRequested, bucket: str) -> str | None:
    """Why the request may not run the workspace it names: only its owner's, in the
    platform's own store. A request names its workspace by hash, and a hash another team's
    job ran is no key to that team's code."""
    ref = request.working_dir
    if ref is None:
        return None
    if ref.bucket != bucket or ref.name != workspace_object_name(request.owner, ref.sha256):
        return (
            f"the working directory {ref.bucket}/{ref.name} is not one {request.owner} "
            "uploaded; submit with the CLI, the notebook or the SDK, which upload it"
        )
    return None


def unknown_secrets_detail(names: Iterable[str], team: str | None = None) -> str:
    listed = ", ".join(names)
    if team is not None:
        return (
            f"team {team} has no secret {listed} (a file of ~/.spotrain/secrets/{team} on the "
            f"local stack, a key of the chart's secret for team {team} on GKE); a job gets its "
            "own team's secrets only"
        )
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
    return queued.model_copy(update={"attempts": (first_attempt(request.job_id, now),)})
