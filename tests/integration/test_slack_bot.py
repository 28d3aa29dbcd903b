"""The Slack bot against signed HTTP requests, a fake Slack Web API and a real NATS:
the real Bolt app on a free port, in this process, and once as its own process."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from nats.js.api import KeyValueConfig

from shared.events import Event, EventData, decode, new_event, subject_for
from shared.events.data import (
    JobCancelRequested,
    JobRequested,
    JobStarted,
    JobSucceeded,
)
from shared.jobs import JobRecord, JobState, jobs_bucket
from shared.localstack.ports import free_port
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.runtime import serve
from shared.slack.bootstrap import bootstrap_for
from shared.slack.handlers import SERVICE
from shared.slack.model import Project
from shared.slack.settings import SlackSettings
from tests.async_helpers import eventually
from tests.fakes.slack_api import FakeSlackApi

pytestmark = pytest.mark.integration

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # noqa: S105  # the test signs with it itself
TOKEN = "xoxb-test-token"  # noqa: S105  # what the fake Slack API expects
ALICE, BOB, EVE = "UALICE001", "UBOB00001", "UEVE00001"
CHANNEL = "CTRAINING1"
OWNERS = {ALICE: "alice", BOB: "bob"}
PROJECTS = {"digits": Project(entrypoint=("python", "examples/train_digits.py"))}
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Bot:
    url: str
    api: FakeSlackApi
    bus: JetStreamBus
    http: aiohttp.ClientSession


@pytest.fixture
async def bot(bus_settings: BusSettings, jetstream_bus: JetStreamBus) -> AsyncIterator[Bot]:
    async with FakeSlackApi(token=TOKEN) as api, aiohttp.ClientSession() as http:
        settings = SlackSettings(
            signing_secret=SECRET,  # type: ignore[arg-type]  # validated into a SecretStr
            bot_token=TOKEN,  # type: ignore[arg-type]
            owners=OWNERS,
            projects=PROJECTS,
            port=free_port(),
            http_port=free_port(),
            api_base_url=api.url,
            grace_period_s=5,
        )
        stop = asyncio.Event()
        service = asyncio.create_task(
            serve(
                SERVICE,
                bootstrap_for(settings),
                bus_settings=bus_settings,
                runtime=settings,
                stop=stop,
            )
        )
        health = f"http://127.0.0.1:{settings.http_port}/healthz"
        await eventually(lambda: _status(http, health), timeout_s=10)
        yield Bot(
            url=f"http://127.0.0.1:{settings.port}/slack/events",
            api=api,
            bus=jetstream_bus,
            http=http,
        )
        stop.set()
        await asyncio.wait_for(service, timeout=10)


async def _status(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


def signature(body: str, timestamp: str, secret: str = SECRET) -> str:
    """Slack's v0 signature, computed here rather than by the library under test."""
    base = f"v0:{timestamp}:{body}".encode()
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def command_form(bot: Bot, text: str, user: str = ALICE, channel: str = CHANNEL) -> str:
    return urlencode(
        {
            "token": "deprecated-verification-token",
            "team_id": FakeSlackApi.TEAM_ID,
            "team_domain": "spotrain-test",
            "channel_id": channel,
            "channel_name": "training",
            "user_id": user,
            "user_name": user.lower(),
            "command": "/train",
            "text": text,
            "api_app_id": "A0TEST001",
            "response_url": bot.api.response_url(user),
            "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        }
    )


async def post(
    bot: Bot, body: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    if headers is None:
        timestamp = str(int(time.time()))
        headers = {
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": signature(body, timestamp),
        }
    headers = {"Content-Type": "application/x-www-form-urlencoded", **headers}
    async with bot.http.post(bot.url, data=body.encode(), headers=headers) as response:
        text = await response.text()
        return response.status, json.loads(text) if text.startswith("{") else {"raw": text}


async def slash(bot: Bot, text: str, user: str = ALICE) -> str:
    """A signed `/train` from `user`; the text of the answer only they see."""
    status, answer = await post(bot, command_form(bot, text, user))
    assert status == 200, answer
    assert answer["response_type"] == "ephemeral"
    return str(answer["text"])


async def stored(bus: JetStreamBus, model: type[EventData]) -> list[Event[Any]]:
    return [decode(m.data) for m in await bus.read(subject_for(model, bus.prefix))]


async def the_published_request(bot: Bot) -> Event[Any]:
    """The one `job.requested` on the bus, once the bot has published it."""

    async def published() -> bool:
        return len(await stored(bot.bus, JobRequested)) == 1

    await eventually(published)
    [event] = await stored(bot.bus, JobRequested)
    return event


async def put_record(bus: JetStreamBus, request: JobRequested, state: JobState) -> None:
    """Play the submitter: the only writer of the jobs bucket."""
    js = bus.client.jetstream()
    kv = await js.create_key_value(KeyValueConfig(bucket=jobs_bucket(bus.prefix), history=16))
    record = JobRecord(
        request=request,
        request_event_id=f"request-{request.job_id}",
        state=state,
        accepted_at=NOW,
        updated_at=NOW,
    )
    await kv.put(request.job_id, record.model_dump_json().encode())


def request_of(job_id: str, owner: str, **labels: str) -> JobRequested:
    return JobRequested(
        job_id=job_id,
        owner=owner,
        entrypoint=("python", "train.py"),
        labels=labels,
    )


async def test_a_signed_submit_publishes_the_request_with_the_mapped_owner_and_its_thread(
    bot: Bot,
) -> None:
    """The announcement in the channel is the job's thread; the request names both."""
    answer = await slash(bot, "submit digits --gpus 2 --spot --experiment lr-sweep -- --lr 0.1")
    assert answer.startswith("Submitting `digits-")

    event = await the_published_request(bot)
    request = event.data
    [announcement] = bot.api.posted_in(CHANNEL)
    assert answer == f"Submitting `{request.job_id}`… Updates follow in a thread in this channel."
    assert request.owner == "alice"
    assert request.entrypoint == ("python", "examples/train_digits.py", "--lr", "0.1")
    assert request.worker.gpus == 2
    assert request.capacity.value == "spot"
    assert request.experiment == "lr-sweep"
    assert request.working_dir is None
    assert request.labels == {
        "slack-channel": CHANNEL,
        "slack-user": ALICE,
        "slack-thread": announcement.ts,
    }
    assert event.source == f"slack/{ALICE}"
    assert announcement.thread_ts is None
    assert f"<@{ALICE}> submitted `{request.job_id}`" in announcement.text


async def test_the_jobs_thread_hears_when_it_starts_and_succeeds(bot: Bot) -> None:
    """Posts go to the channel and thread in the job's labels, and only for Slack jobs."""
    await slash(bot, "submit digits -- --epochs 1")
    request: JobRequested = (await the_published_request(bot)).data
    [announcement] = bot.api.posted_in(CHANNEL)
    await put_record(bot.bus, request, JobState.RUNNING)
    from_cli = request_of("from-cli", "alice")
    await put_record(bot.bus, from_cli, JobState.RUNNING)

    for job_id in ("from-cli", request.job_id):
        started = JobStarted(job_id=job_id, attempt=1, submission_id=f"{job_id}-1", pool="spot")
        await bot.bus.publish(new_event(started, source="submitter", time=NOW, subject=job_id))
        await bot.bus.publish(
            new_event(JobSucceeded(job_id=job_id, attempt=1), source="submitter", time=NOW)
        )

    await eventually(lambda: len(bot.api.posts) == 3)
    thread = [p for p in bot.api.posts if p.thread_ts == announcement.ts]
    assert [p.channel for p in thread] == [CHANNEL, CHANNEL]
    assert thread[0].text == f":rocket: `{request.job_id}` is running on spot."
    assert thread[1].text == f":white_check_mark: <@{ALICE}> `{request.job_id}` succeeded."
    assert not any("from-cli" in p.text for p in bot.api.posts)


FORGERIES = (
    "signed-with-another-secret",
    "timestamp-ten-minutes-old",
    "timestamp-ten-minutes-ahead",
    "body-changed-after-signing",
    "no-signature-headers",
    "timestamp-not-a-number",
)


def forged(bot: Bot, case: str) -> tuple[str, dict[str, str]]:
    """A `/train submit` as someone other than Slack, right now, might send it."""
    body = command_form(bot, "submit digits")
    now = int(time.time())
    timestamp = str({"timestamp-ten-minutes-old": now - 600,
                     "timestamp-ten-minutes-ahead": now + 600}.get(case, now))  # fmt: skip
    secret = "not-the-secret" if case == "signed-with-another-secret" else SECRET
    headers = {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature(body, timestamp, secret),
    }
    if case == "body-changed-after-signing":
        body = command_form(bot, "cancel someone-elses-job")
    if case == "no-signature-headers":
        headers = {}
    if case == "timestamp-not-a-number":
        headers["X-Slack-Request-Timestamp"] = "soon"
    return body, headers


async def test_a_request_not_signed_by_slack_just_now_gets_401_and_changes_nothing(
    bot: Bot,
) -> None:
    """Bolt's verification is on: a signature over the body, a timestamp within 5 min."""
    for case in FORGERIES:
        status, _ = await post(bot, *forged(bot, case))
        assert status == 401, case

    await asyncio.sleep(0.2)
    assert await stored(bot.bus, JobRequested) == []
    assert bot.api.posts == []
    assert bot.api.calls == [], "not even Bolt's auth.test: verification comes first"


async def test_a_signed_request_sent_again_within_its_window_makes_no_second_job(
    bot: Bot,
) -> None:
    """A captured request, replayed while its signature still holds: refused, one job."""
    body = command_form(bot, "submit digits --gpus 1")
    timestamp = str(int(time.time()))
    headers = {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature(body, timestamp),
    }
    first, _ = await post(bot, body, headers)
    assert first == 200
    await the_published_request(bot)
    again, answer = await post(bot, body, headers)
    assert again == 401, answer
    await asyncio.sleep(0.5)
    assert len(await stored(bot.bus, JobRequested)) == 1
    # The same command signed anew (a second /train) is a second request, as it should be.
    later = str(int(time.time()) + 1)
    fresh = {"X-Slack-Request-Timestamp": later, "X-Slack-Signature": signature(body, later)}
    assert (await post(bot, body, fresh))[0] == 200


async def test_status_and_cancel_of_another_owners_job_are_refused(bot: Bot) -> None:
    """Alice cannot see or stop Bob's job; Bob can."""
    await put_record(bot.bus, request_of("bobs-job", "bob"), JobState.RUNNING)

    assert "belongs to another user" in await slash(bot, "status bobs-job")
    assert "belongs to another user" in await slash(bot, "cancel bobs-job")
    assert "belongs to another user" in await slash(bot, "cost bobs-job")
    assert await stored(bot.bus, JobCancelRequested) == []

    assert (await slash(bot, "status bobs-job", user=BOB)).startswith("`bobs-job`: *running*")
    assert "Cancel requested" in await slash(bot, "cancel bobs-job", user=BOB)
    [cancel] = await stored(bot.bus, JobCancelRequested)
    assert cancel.data == JobCancelRequested(job_id="bobs-job", requested_by="bob")
    assert cancel.source == f"slack/{BOB}"


async def test_an_unmapped_slack_user_is_refused_and_nothing_is_published(bot: Bot) -> None:
    answer = await slash(bot, "submit digits --gpus 1", user=EVE)

    assert "not mapped to a spotrain user" in answer
    assert EVE in answer
    await asyncio.sleep(0.2)
    assert await stored(bot.bus, JobRequested) == []
    assert bot.api.posts == []


async def test_cost_answers_from_the_platforms_ledger(bot: Bot) -> None:
    # Nothing ran yet: the ledger knows it, and says so rather than showing a zero.
    assert "None of your experiments has cost anything yet" in await slash(bot, "cost")


async def test_a_channel_the_bot_cannot_post_in_gets_an_explanation_and_no_job(
    bot: Bot,
) -> None:
    """Without a thread for its updates, a job is not submitted from Slack at all."""
    bot.api.refuse(CHANNEL, "not_in_channel")

    await slash(bot, "submit digits")

    await eventually(lambda: len(bot.api.responses) == 1)
    [response] = bot.api.responses
    assert "not_in_channel" in response.text
    assert response.response_type == "ephemeral"
    assert await stored(bot.bus, JobRequested) == []


async def test_the_bot_runs_as_its_own_process_and_stops_on_sigterm(
    bus_settings: BusSettings, jetstream_bus: JetStreamBus
) -> None:
    """`python -m shared.slack`, configured from SPOTRAIN_SLACK_* with JSON maps."""
    port, http_port = free_port(), free_port()
    async with FakeSlackApi(token=TOKEN) as api, aiohttp.ClientSession() as http:
        env = {
            **os.environ,
            "SPOTRAIN_NATS_URL": bus_settings.nats_url,
            "SPOTRAIN_SUBJECT_PREFIX": bus_settings.subject_prefix,
            "SPOTRAIN_SLACK_SIGNING_SECRET": SECRET,
            "SPOTRAIN_SLACK_BOT_TOKEN": TOKEN,
            "SPOTRAIN_SLACK_OWNERS": json.dumps(OWNERS),
            "SPOTRAIN_SLACK_PROJECTS": json.dumps(
                {"digits": {"entrypoint": ["python", "examples/train_digits.py"]}}
            ),
            "SPOTRAIN_SLACK_PORT": str(port),
            "SPOTRAIN_SLACK_HTTP_PORT": str(http_port),
            "SPOTRAIN_SLACK_API_BASE_URL": api.url,
        }
        process = subprocess.Popen(  # noqa: ASYNC220  # started once; the loop never waits on it
            [sys.executable, "-m", "shared.slack"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            health = f"http://127.0.0.1:{http_port}/healthz"
            await eventually(lambda: _status(http, health), timeout_s=20)
            bot = Bot(
                url=f"http://127.0.0.1:{port}/slack/events", api=api, bus=jetstream_bus, http=http
            )
            assert "`digits`" in await slash(bot, "help")
            status, _ = await post(bot, command_form(bot, "help"), {"X-Slack-Signature": "v0=0"})
            assert status == 401

            process.send_signal(signal.SIGTERM)
            output, _ = await asyncio.to_thread(process.communicate, timeout=15)
        finally:
            process.kill()
            process.wait()
    assert process.returncode == 0, output.decode()
    lines = output.decode().splitlines()
    assert any('"event": "slack.listening"' in line for line in lines)
    assert all(line.startswith("{") for line in lines), "the bot logs JSON lines"
