"""The Slack bot's reactions: a `/train` command from Slack, and a job's events from the
bus. Read → decide (policy) → act (ports) → log, nothing else."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict

from shared.clock import Clock
from shared.events import Event, EventData
from shared.events.data import JobRequested
from shared.messaging import HandlerWithDeps, RetryLater, Unhandleable
from shared.policy.teams import Teams
from shared.slack import policy, replies
from shared.slack.commands import Cancel, Command, CommandError, Cost, Help, Status, Submit, parse
from shared.slack.model import ChannelId, Origin, Project, SlackUserId
from shared.slack.policy import Post, Refusal, Refused, Skip
from shared.slack.ports import (
    Chat,
    ChatRefusedError,
    ChatUnavailableError,
    CostSource,
    Platform,
    PlatformUnavailableError,
)

SERVICE = "slack"
log = structlog.get_logger()


class SlashCommand(BaseModel):
    """The fields of Slack's slash-command payload that the bot reads (Slack sends more)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    command: str
    text: str = ""
    user_id: SlackUserId
    channel_id: ChannelId


@dataclass(frozen=True)
class Deps:
    platform: Platform
    chat: Chat
    costs: CostSource
    clock: Clock
    owners: Mapping[str, str]
    """Slack user id → platform owner; nobody else may act."""
    projects: Mapping[str, Project]
    new_job_id: Callable[[str], str]
    """A fresh job id from a project's name (ids come from outside the policy)."""
    command: str = "/train"
    answer_within_s: float = 2.5
    """Slack shows an error unless it has an answer within 3 s."""
    recent_jobs: int = 10
    teams: Teams | None = None
    """The platform's teams, whose admins may cancel their team's jobs; None without."""


@dataclass(frozen=True)
class Pending:
    """A submission to carry out once Slack has its answer: announce it in the channel,
    then publish the request with the announcement as the job's thread."""

    request: JobRequested
    origin: Origin
    project: str


@dataclass(frozen=True)
class Answer:
    """The reply that only the user sees, and what is left to do after it."""

    text: str
    pending: Pending | None = None


async def answer(slash: SlashCommand, deps: Deps) -> Answer:
    """Everything a command needs before Slack's 3 s are up."""
    try:
        command = parse(slash.text)
    except CommandError as error:
        return Answer(replies.command_error(str(error), deps.command))
    if isinstance(command, Help):
        return Answer(replies.usage(deps.command, deps.projects))
    owner = policy.owner_of(slash.user_id, deps.owners)
    if owner is None:
        log.info("slack.refused", user=slash.user_id, reason=Refusal.UNMAPPED_USER.value)
        return Answer(replies.unmapped_user(slash.user_id))
    try:
        async with asyncio.timeout(deps.answer_within_s):
            return await _answer(command, owner, slash, deps)
    except (TimeoutError, PlatformUnavailableError) as error:
        log.warning("slack.platform_unreachable", error=str(error) or type(error).__name__)
        return Answer(replies.platform_unreachable())


async def _answer(command: Command, owner: str, slash: SlashCommand, deps: Deps) -> Answer:
    log_ = log.bind(user=slash.user_id, owner=owner)
    match command:
        case Submit():
            origin = Origin(channel=slash.channel_id, user=slash.user_id)
            plan = policy.plan_submission(
                command,
                owner=owner,
                origin=origin,
                projects=deps.projects,
                job_id=deps.new_job_id(command.project),
            )
            if isinstance(plan, Refused):
                log_.info(
                    "slack.refused", reason=plan.reason.value, detail=plan.detail or plan.subject
                )
                return Answer(_refusal(plan, deps))
            return Answer(replies.submitting(plan.job_id), Pending(plan, origin, command.project))
        case Status(job_id=None):
            records = await deps.platform.jobs_of(owner, deps.recent_jobs)
            return Answer(replies.jobs_list(records, deps.clock.now(), deps.command))
        case Status(job_id=str(job_id)):
            access = policy.may_see(owner, job_id, await deps.platform.job(job_id))
            if isinstance(access, Refused):
                log_.info("slack.refused", job_id=job_id, reason=access.reason.value)
                return Answer(_refusal(access, deps))
            return Answer(replies.status(access.record, deps.clock.now()))
        case Cancel(job_id=job_id):
            access = policy.may_cancel(
                owner, job_id, await deps.platform.job(job_id), teams=deps.teams
            )
            if isinstance(access, Refused):
                log_.info("slack.refused", job_id=job_id, reason=access.reason.value)
                return Answer(_refusal(access, deps))
            await deps.platform.cancel(job_id, requested_by=owner, source=_source(slash.user_id))
            log_.info("slack.cancel_requested", job_id=job_id)
            return Answer(replies.cancel_requested(job_id))
        case Cost(job_id=None):
            costs = await deps.costs.experiment_costs(owner)
            if costs is None:
                return Answer(replies.cost_unavailable(await deps.platform.spend()))
            return Answer(replies.experiment_costs(costs))
        case Cost(job_id=str(job_id)):
            access = policy.may_see(owner, job_id, await deps.platform.job(job_id))
            if isinstance(access, Refused):
                return Answer(_refusal(access, deps))
            cost = await deps.costs.job_cost(job_id)
            if cost is None:
                return Answer(replies.cost_unavailable(await deps.platform.spend()))
            return Answer(replies.job_cost(cost))
    return Answer(replies.usage(deps.command, deps.projects))


async def carry_out(pending: Pending, deps: Deps) -> str | None:
    """Announce the submission in the channel and publish the request, labelled with the
    announcement as the job's thread. Returns what the user should be told when that
    failed; None when the request is on the bus."""
    request, origin = pending.request, pending.origin
    log_ = log.bind(job_id=request.job_id, user=origin.user, channel=origin.channel)
    try:
        ts = await deps.chat.post(
            origin.channel, replies.announcement(request, origin, pending.project)
        )
    except (ChatRefusedError, ChatUnavailableError) as error:
        # A job whose updates could never be posted is not worth starting from Slack.
        log_.warning("slack.announce_failed", error=str(error))
        return replies.cannot_post(str(error), deps.command)
    threaded = Origin(channel=origin.channel, user=origin.user, thread_ts=ts)
    request = request.model_copy(update={"labels": {**request.labels, **threaded.labels()}})
    try:
        await deps.platform.submit(request, source=_source(origin.user))
    except PlatformUnavailableError as error:
        log_.warning("slack.submit_failed", error=str(error))
        # Best effort: the user hears it in the ephemeral answer anyway.
        with contextlib.suppress(ChatRefusedError, ChatUnavailableError):
            await deps.chat.post(origin.channel, replies.not_submitted(), thread_ts=ts)
        return replies.not_submitted()
    log_.info("slack.submitted", owner=request.owner, thread_ts=ts, gpus=request.worker.gpus)
    return None


async def on_job_event(event: Event[Any], deps: Deps) -> None:
    """Post a job's state change in the Slack thread its labels name, if any."""
    data: EventData = event.data
    job_id: str = getattr(data, "job_id", "")
    try:
        record = await deps.platform.job(job_id)
        cost = (
            await deps.costs.job_cost(job_id) if isinstance(data, policy.TERMINAL_EVENTS) else None
        )
    except PlatformUnavailableError as error:
        raise RetryLater(1.0, f"the jobs bucket did not answer: {error}") from error
    notice = policy.notice_for(data, record, deps.owners, cost)
    log_ = log.bind(job_id=job_id, type=data.event_type())
    match notice:
        case Skip(reason=reason):
            log_.debug("slack.not_posted", reason=reason.value)
        case Post(channel=channel, thread_ts=thread_ts, text=text):
            try:
                await deps.chat.post(channel, text, thread_ts=thread_ts)
            except ChatUnavailableError as error:
                raise RetryLater(error.retry_after_s, f"Slack: {error}") from error
            except ChatRefusedError as error:
                msg = f"Slack refused the post in {channel}: {error.error}"
                raise Unhandleable(msg) from error
            log_.info("slack.posted", channel=channel, thread_ts=thread_ts)


def _refusal(refused: Refused, deps: Deps) -> str:
    match refused.reason:
        case Refusal.UNKNOWN_PROJECT:
            return replies.unknown_project(refused.subject, deps.projects)
        case Refusal.INVALID_REQUEST:
            return replies.invalid_request(refused.detail)
        case Refusal.NO_SUCH_JOB:
            return replies.no_such_job(refused.subject)
        case Refusal.NOT_YOUR_JOB:
            return replies.not_your_job(refused.subject)
        case Refusal.ALREADY_ENDED:
            return replies.already_ended(refused.subject, refused.detail)
        case Refusal.UNMAPPED_USER:
            return replies.unmapped_user(refused.subject)


def _source(user_id: str) -> str:
    """The CloudEvents `source` of what a Slack user asked for."""
    return f"slack/{user_id}"


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = dict.fromkeys(
    policy.POSTED_EVENTS, on_job_event
)
"""What the bot reacts to on the bus: the job events its threads hear about."""
