"""The Slack bot's decisions, pure: who a Slack user is on the platform, what a submit
becomes, who may see or cancel a job, and what to post about a job's event.

No I/O, no clock, no ids: ids and time come in as arguments. Each decision is a value
that carries its reason; refusing is a decision too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import ValidationError

from shared.events.data import (
    EventData,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobRejected,
    JobRequested,
    JobResumed,
    JobStarted,
    JobSucceeded,
)
from shared.events.types import Bundle
from shared.jobs import JobRecord
from shared.policy.teams import Teams
from shared.slack import replies
from shared.slack.commands import Submit
from shared.slack.model import JobCost, Origin, Project

POSTED_EVENTS: tuple[type[EventData], ...] = (
    JobAccepted,
    JobRejected,
    JobStarted,
    JobInterrupted,
    JobResumed,
    JobSucceeded,
    JobFailed,
    JobCancelled,
)
"""The state changes a job's Slack thread hears about (not queued, progress, checkpoints:
they are many, and `/train status` shows them)."""

TERMINAL_EVENTS: tuple[type[EventData], ...] = (JobSucceeded, JobFailed, JobCancelled)
"""The events whose post carries the job's cost, when cost is known."""


class Refusal(StrEnum):
    UNMAPPED_USER = "unmapped-user"
    UNKNOWN_PROJECT = "unknown-project"
    INVALID_REQUEST = "invalid-request"
    NO_SUCH_JOB = "no-such-job"
    NOT_YOUR_JOB = "not-your-job"
    ALREADY_ENDED = "already-ended"


@dataclass(frozen=True)
class Refused:
    reason: Refusal
    subject: str = ""
    """What was refused: a job id, a project's name."""
    detail: str = ""


@dataclass(frozen=True)
class Allowed:
    record: JobRecord


Access = Allowed | Refused


class SkipReason(StrEnum):
    NOT_POSTED = "not-posted"
    """An event type the thread does not hear about."""
    UNKNOWN_JOB = "unknown-job"
    NOT_FROM_SLACK = "not-from-slack"
    """The job's labels name no Slack channel: it was submitted some other way."""
    ORIGIN_NOT_OWNER = "origin-not-owner"
    """The labels name a Slack user who is not the job's owner: labels anyone can set
    never make the bot speak about one owner's job on another's behalf."""


@dataclass(frozen=True)
class Skip:
    reason: SkipReason


@dataclass(frozen=True)
class Post:
    channel: str
    thread_ts: str | None
    text: str


Notice = Post | Skip


def owner_of(user_id: str, owners: Mapping[str, str]) -> str | None:
    """The platform owner a Slack user acts as; None for a user nobody mapped."""
    return owners.get(user_id)


def plan_submission(
    command: Submit,
    *,
    owner: str,
    origin: Origin,
    projects: Mapping[str, Project],
    job_id: str,
) -> JobRequested | Refused:
    """The request a `/train submit` becomes: the registered project's entrypoint followed
    by the user's arguments, owned by the mapped owner, labelled with its Slack origin."""
    project = projects.get(command.project)
    if project is None:
        return Refused(Refusal.UNKNOWN_PROJECT, subject=command.project)
    try:
        return JobRequested(
            job_id=job_id,
            owner=owner,
            experiment=command.experiment or command.project,
            entrypoint=(*project.entrypoint, *command.args),
            worker=Bundle(
                gpus=command.gpus,
                cpus=command.cpus,
                memory_gb=command.memory_gb,
                gpu_type=command.gpu_type,
            ),
            num_workers=command.workers,
            capacity=command.capacity,
            priority=command.priority,
            max_restarts=command.max_restarts,
            labels=origin.labels(),
            env=dict(project.env),
        )
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        return Refused(Refusal.INVALID_REQUEST, detail=f"{where}: {problem['msg']}")


def may_see(owner: str, job_id: str, record: JobRecord | None) -> Access:
    """A user sees their own jobs only; another owner's job is refused like a missing one
    would be, but saying so, so that nobody wonders whether they mistyped."""
    if record is None:
        return Refused(Refusal.NO_SUCH_JOB, subject=job_id)
    if record.request.owner != owner:
        return Refused(Refusal.NOT_YOUR_JOB, subject=job_id)
    return Allowed(record)


def may_cancel(
    owner: str, job_id: str, record: JobRecord | None, teams: Teams | None = None
) -> Access:
    """Cancel: the owner's own job, or as an admin of its owner's team (the submitter's
    rule too, which decides in the end), while it has not ended."""
    if record is not None and teams is not None and record.request.owner != owner:
        team = teams.team_of(record.request.owner)
        if team is not None and owner in team.admins:
            owner = record.request.owner  # an admin acts on the team's jobs as on their own
    access = may_see(owner, job_id, record)
    if isinstance(access, Allowed) and not access.record.is_active:
        return Refused(Refusal.ALREADY_ENDED, subject=job_id, detail=access.record.state.value)
    return access


def notice_for(
    data: EventData,
    record: JobRecord | None,
    owners: Mapping[str, str],
    cost: JobCost | None = None,
) -> Notice:
    """What to post about one of a job's events, and where: the channel and thread its
    labels name, when the Slack user they name is the job's owner."""
    if not isinstance(data, POSTED_EVENTS):
        return Skip(SkipReason.NOT_POSTED)
    if record is None:
        return Skip(SkipReason.UNKNOWN_JOB)
    origin = Origin.from_labels(record.request.labels)
    if origin is None:
        return Skip(SkipReason.NOT_FROM_SLACK)
    if owner_of(origin.user, owners) != record.request.owner:
        return Skip(SkipReason.ORIGIN_NOT_OWNER)
    text = replies.job_event(data, record, origin, cost)
    return Post(channel=origin.channel, thread_ts=origin.thread_ts, text=text)


SIGNATURE_WINDOW_S = 5 * 60
"""How long Slack's signature of a request stays good: Bolt refuses an older timestamp."""


@dataclass
class SeenSignatures:
    """The signatures of the requests taken in the last `SIGNATURE_WINDOW_S` (and a little
    more, for clocks that differ): a request sent again within its validity is refused,
    so a captured request makes no second job."""

    seen: dict[str, float]

    def first_time(self, signature: str, timestamp: float, now: float) -> bool:
        """Whether this signed request is new; it is remembered from now on."""
        horizon = now - 2 * SIGNATURE_WINDOW_S
        for old in [s for s, at in self.seen.items() if at < horizon]:
            del self.seen[old]
        if signature in self.seen:
            return False
        self.seen[signature] = timestamp
        return True
