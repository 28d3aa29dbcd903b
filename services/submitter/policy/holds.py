"""Team quotas and budgets, pure: a request under the teams file holds quota by
compare-and-set on the team holds, waits for it, or takes the holds of jobs that give way;
waiting jobs get it in order as it frees."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from services.submitter.model import (
    AttemptState,
    JobRecord,
)
from services.submitter.policy.admission import (
    Accept,
    Admission,
    Reject,
    WaitForQuota,
    first_attempt,
)
from shared.events.data import (
    InterruptionCause,
    JobRequested,
    RejectionReason,
)
from shared.events.types import CapacityClass
from shared.policy.fairshare import (
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
from shared.policy.teams import TeamHold, TeamHolds, Teams, TeamSpec, TeamsStatus, quota_class


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
    gpus = request.most_gpus
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
            "attempts": (first_attempt(record.job_id, now),),
            "updated_at": now,
        }
    )


WaitingClass = tuple[str | None, CapacityClass]
"""A team and the quota class of its capacity: waiting jobs that compete for one quota."""


def waits_behind(record: JobRecord, blocked: Mapping[WaitingClass, tuple[int, int]]) -> bool:
    """Whether a waiting job must wait because an earlier one of its team and class, no
    larger and no lower in priority, had to (`blocked`: its GPUs and priority): one quota
    decision per class and pass, not one per waiting job."""
    seen = blocked.get(waiting_class(record))
    return seen is not None and record.gpus >= seen[0] and record.request.priority <= seen[1]


def waiting_class(record: JobRecord) -> WaitingClass:
    return record.team, quota_class(record.request.capacity)
