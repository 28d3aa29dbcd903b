"""The Slack bot's handlers through the real `Deps`, with fakes of its ports."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.events import Event, new_event
from shared.events.data import EventData, JobFailed, JobRequested, JobStarted
from shared.events.types import CapacityClass
from shared.jobs import JobRecord, JobState
from shared.messaging import RetryLater, Unhandleable
from shared.policy.teams import parse_teams
from shared.pools import PoolsStatus
from shared.slack.handlers import Deps, SlashCommand, answer, carry_out, on_job_event
from shared.slack.model import ExperimentCost, JobCost, Origin, Project
from shared.slack.ports import ChatRefusedError, ChatUnavailableError, PlatformUnavailableError
from tests.fakes.clock import FixedClock

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ALICE, BOB, EVE = "UALICE001", "UBOB00001", "UEVE00001"
CHANNEL = "CTRAINING1"


@dataclass
class FakePlatform:
    records: dict[str, JobRecord] = field(default_factory=dict)
    submitted: list[tuple[JobRequested, str]] = field(default_factory=list)
    cancelled: list[tuple[str, str, str]] = field(default_factory=list)
    pools: PoolsStatus | None = None
    unavailable: bool = False
    delay_s: float = 0.0

    async def _reach(self) -> None:
        await asyncio.sleep(self.delay_s)
        if self.unavailable:
            raise PlatformUnavailableError("no NATS")

    async def submit(self, request: JobRequested, *, source: str) -> None:
        await self._reach()
        self.submitted.append((request, source))

    async def cancel(self, job_id: str, *, requested_by: str, source: str) -> None:
        await self._reach()
        self.cancelled.append((job_id, requested_by, source))

    async def job(self, job_id: str) -> JobRecord | None:
        await self._reach()
        return self.records.get(job_id)

    async def jobs_of(self, owner: str, limit: int) -> Sequence[JobRecord]:
        await self._reach()
        return [r for r in self.records.values() if r.request.owner == owner][:limit]

    async def spend(self) -> PoolsStatus | None:
        await self._reach()
        return self.pools


@dataclass
class FakeChat:
    posts: list[tuple[str, str, str | None]] = field(default_factory=list)
    refuse: str | None = None
    unavailable: bool = False

    async def post(self, channel: str, text: str, *, thread_ts: str | None = None) -> str:
        if self.refuse is not None:
            raise ChatRefusedError(self.refuse)
        if self.unavailable:
            raise ChatUnavailableError("ratelimited", 7.0)
        self.posts.append((channel, text, thread_ts))
        return f"1764500000.{len(self.posts):06d}"


@dataclass
class FakeCosts:
    per_job: dict[str, JobCost] | None = None
    per_experiment: list[ExperimentCost] | None = None

    async def job_cost(self, job_id: str) -> JobCost | None:
        return None if self.per_job is None else self.per_job.get(job_id)

    async def experiment_costs(self, owner: str) -> Sequence[ExperimentCost] | None:
        return self.per_experiment


@pytest.fixture
def deps() -> Deps:
    return Deps(
        platform=FakePlatform(),
        chat=FakeChat(),
        costs=FakeCosts(),
        clock=FixedClock(NOW),
        owners={ALICE: "alice", BOB: "bob"},
        projects={"digits": Project(entrypoint=("python", "examples/train_digits.py"))},
        new_job_id=lambda project: f"{project}-3f9a1c",
        answer_within_s=0.2,
    )


def platform(deps: Deps) -> FakePlatform:
    assert isinstance(deps.platform, FakePlatform)
    return deps.platform


def chat(deps: Deps) -> FakeChat:
    assert isinstance(deps.chat, FakeChat)
    return deps.chat


def slash(text: str, user: str = ALICE) -> SlashCommand:
    return SlashCommand(command="/train", text=text, user_id=user, channel_id=CHANNEL)


def record(job_id: str, owner: str, labels: dict[str, str] | None = None) -> JobRecord:
    request = JobRequested(
        job_id=job_id, owner=owner, entrypoint=("python", "train.py"), labels=labels or {}
    )
    return JobRecord(
        request=request,
        request_event_id="e1",
        state=JobState.RUNNING,
        accepted_at=NOW,
        updated_at=NOW,
    )


def event(data: EventData) -> Event[Any]:
    return new_event(data, source="tests", time=NOW)


async def test_help_lists_the_commands_and_the_registered_projects(deps: Deps) -> None:
    reply = await answer(slash("help", user=EVE), deps)
    assert "/train submit PROJECT" in reply.text
    assert "`digits`: `python examples/train_digits.py`" in reply.text


async def test_an_unmapped_user_is_told_how_to_get_mapped(deps: Deps) -> None:
    reply = await answer(slash("status", user=EVE), deps)
    assert "not mapped" in reply.text
    assert f"`{EVE}`" in reply.text
    assert reply.pending is None


async def test_a_bad_command_is_answered_with_the_problem(deps: Deps) -> None:
    reply = await answer(slash("submit digits --gpus 99"), deps)
    assert reply.text.startswith(":warning: `--gpus`: input should be less than or equal to 16")


async def test_submit_answers_at_once_and_leaves_the_submission_pending(deps: Deps) -> None:
    reply = await answer(slash("submit digits --gpus 1 --spot -- --lr 0.1"), deps)
    assert reply.text.startswith("Submitting `digits-3f9a1c`")
    assert reply.pending is not None
    assert reply.pending.request.capacity is CapacityClass.SPOT
    assert platform(deps).submitted == [], "nothing is published before Slack has its answer"


async def test_a_pending_submission_is_announced_then_published_with_its_thread(
    deps: Deps,
) -> None:
    reply = await answer(slash("submit digits"), deps)
    assert reply.pending is not None

    assert await carry_out(reply.pending, deps) is None

    [(channel, text, thread)] = chat(deps).posts
    assert (channel, thread) == (CHANNEL, None)
    assert text.startswith(f"<@{ALICE}> submitted `digits-3f9a1c`")
    [(request, source)] = platform(deps).submitted
    assert request.labels == {
        "slack-channel": CHANNEL,
        "slack-user": ALICE,
        "slack-thread": "1764500000.000001",
    }
    assert source == f"slack/{ALICE}"


async def test_a_submission_the_bot_cannot_announce_is_not_published(deps: Deps) -> None:
    reply = await answer(slash("submit digits"), deps)
    assert reply.pending is not None
    chat(deps).refuse = "not_in_channel"

    told = await carry_out(reply.pending, deps)

    assert told is not None
    assert "not_in_channel" in told
    assert platform(deps).submitted == []


async def test_a_submission_the_bus_refuses_is_reported_in_its_thread(deps: Deps) -> None:
    reply = await answer(slash("submit digits"), deps)
    assert reply.pending is not None
    platform(deps).unavailable = True

    told = await carry_out(reply.pending, deps)

    assert told is not None
    assert "not submitted" in told
    assert chat(deps).posts[-1][2] == "1764500000.000001", "said in the job's thread"


async def test_status_of_my_jobs_lists_only_mine(deps: Deps) -> None:
    platform(deps).records = {
        "mine-1": record("mine-1", "alice"),
        "bobs-1": record("bobs-1", "bob"),
    }
    text = (await answer(slash("status"), deps)).text
    assert "`mine-1`" in text
    assert "bobs-1" not in text


async def test_cancel_of_my_job_is_published_as_me(deps: Deps) -> None:
    platform(deps).records = {"mine-1": record("mine-1", "alice")}
    text = (await answer(slash("cancel mine-1"), deps)).text
    assert text.startswith("Cancel requested for `mine-1`")
    assert platform(deps).cancelled == [("mine-1", "alice", f"slack/{ALICE}")]


async def test_cancel_of_another_owners_job_is_refused_and_not_published(deps: Deps) -> None:
    platform(deps).records = {"bobs-1": record("bobs-1", "bob")}
    text = (await answer(slash("cancel bobs-1"), deps)).text
    assert "belongs to another user" in text
    assert platform(deps).cancelled == []


async def test_a_team_admin_cancels_a_team_members_job_as_themselves(deps: Deps) -> None:
    """As the submitter's rule has it: the request says who asked (the admin), and the
    submitter, which checks the teams file again, decides."""
    platform(deps).records = {"bobs-1": record("bobs-1", "bob")}
    teams = parse_teams('[teams.vision]\nmembers = ["alice", "bob"]\nadmins = ["alice"]\n')
    text = (await answer(slash("cancel bobs-1"), replace(deps, teams=teams))).text
    assert text.startswith("Cancel requested for `bobs-1`")
    assert platform(deps).cancelled == [("bobs-1", "alice", f"slack/{ALICE}")]


@pytest.mark.parametrize(
    "trouble",
    [pytest.param({"unavailable": True}, id="bus-down"), pytest.param({"delay_s": 5}, id="slow")],
)
async def test_a_platform_that_does_not_answer_in_time_gets_an_honest_reply(
    deps: Deps, trouble: dict[str, Any]
) -> None:
    deps = replace(deps, platform=FakePlatform(**trouble))
    text = (await answer(slash("status job-1"), deps)).text
    assert text.startswith(":warning: The platform did not answer in time")


async def test_cost_without_a_cost_source_says_so_with_the_current_spend(deps: Deps) -> None:
    platform(deps).pools = PoolsStatus(
        updated_at=NOW, budget_per_hour_usd=20, cost_per_hour_usd=2.5, pools=(), blocked_jobs=0
    )
    text = (await answer(slash("cost"), deps)).text
    assert "Cost per experiment is not available right now" in text
    assert "$2.50/h of a $20.00/h budget" in text


async def test_cost_from_a_cost_source_once_there_is_one(deps: Deps) -> None:
    platform(deps).records = {"mine-1": record("mine-1", "alice")}
    deps = replace(
        deps,
        costs=FakeCosts(
            per_job={"mine-1": JobCost(job_id="mine-1", total_usd=3.5, gpu_hours=4)},
            per_experiment=[ExperimentCost(experiment="digits", jobs=2, total_usd=7, gpu_hours=8)],
        ),
    )
    assert "has cost $3.50 (4.0 GPU-hours)" in (await answer(slash("cost mine-1"), deps)).text
    assert "digits: $7.00 (8.0 GPU-hours) over 2 job(s)" in (await answer(slash("cost"), deps)).text


SLACK_LABELS = Origin(channel=CHANNEL, user=ALICE, thread_ts="1764500000.000009").labels()


async def test_a_slack_jobs_event_is_posted_in_its_thread(deps: Deps) -> None:
    platform(deps).records = {"job-1": record("job-1", "alice", SLACK_LABELS)}
    await on_job_event(event(JobStarted(job_id="job-1", attempt=1, submission_id="s")), deps)
    assert chat(deps).posts == [(CHANNEL, ":rocket: `job-1` is running.", "1764500000.000009")]


async def test_a_cli_jobs_event_is_not_posted(deps: Deps) -> None:
    platform(deps).records = {"job-1": record("job-1", "alice")}
    await on_job_event(event(JobStarted(job_id="job-1", attempt=1, submission_id="s")), deps)
    assert chat(deps).posts == []


async def test_a_rate_limited_post_is_retried_after_slacks_delay(deps: Deps) -> None:
    platform(deps).records = {"job-1": record("job-1", "alice", SLACK_LABELS)}
    chat(deps).unavailable = True
    with pytest.raises(RetryLater) as raised:
        await on_job_event(event(JobFailed(job_id="job-1", attempt=1, message="oom")), deps)
    assert raised.value.delay_s == 7.0


async def test_a_post_slack_refuses_for_good_is_dead_lettered(deps: Deps) -> None:
    platform(deps).records = {"job-1": record("job-1", "alice", SLACK_LABELS)}
    chat(deps).refuse = "channel_not_found"
    with pytest.raises(Unhandleable, match="channel_not_found"):
        await on_job_event(event(JobFailed(job_id="job-1", attempt=1, message="oom")), deps)


async def test_an_event_whose_job_cannot_be_read_now_is_retried(deps: Deps) -> None:
    deps = replace(deps, platform=FakePlatform(unavailable=True))
    with pytest.raises(RetryLater):
        await on_job_event(event(JobStarted(job_id="job-1", attempt=1, submission_id="s")), deps)
