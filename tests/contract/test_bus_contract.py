"""The bus contract: JetStream (real nats-server) and the in-memory bus pass the same tests."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.events import Event, decode, dlq_subject, subject_for, subject_of
from shared.events.data import JobAccepted, JobRequested
from shared.messaging import (
    EventBus,
    RedeliveryPolicy,
    RetryLater,
    Subscription,
    Unhandleable,
)
from shared.messaging.dead_letters import DELIVERIES, ORIGINAL_SUBJECT, REASON, SERVICE
from shared.messaging.memory import InMemoryBus
from shared.messaging.ports import (
    Asked,
    BucketMissingError,
    NoAnswerError,
    ObjectStoreMissingError,
)
from tests.async_helpers import consuming, eventually
from tests.events import job_requested

FAST_RETRIES = RedeliveryPolicy(max_deliveries=3, base_delay_s=0.05, max_delay_s=0.1)


@pytest.fixture(params=["memory", "jetstream"])
def bus(request: pytest.FixtureRequest) -> EventBus:
    if request.param == "memory":
        return InMemoryBus(prefix="contract")
    bus: EventBus = request.getfixturevalue("jetstream_bus")
    return bus


class Recorder:
    """A handler that records what it saw and can be told to fail."""

    def __init__(self, failures: list[BaseException] | None = None) -> None:
        self.seen: list[Event[Any]] = []
        self._failures = list(failures or [])

    async def __call__(self, event: Event[Any]) -> None:
        self.seen.append(event)
        if self._failures:
            raise self._failures.pop(0)

    def job_ids(self) -> list[str]:
        return [e.data.job_id for e in self.seen]


def subscription(handler: Recorder, **kwargs: Any) -> Subscription:
    kwargs.setdefault("redelivery", FAST_RETRIES)
    return Subscription(service="svc", routes={JobRequested: handler}, **kwargs)


async def dead_letters(bus: EventBus) -> list[Any]:
    return await bus.read(dlq_subject("svc", bus.prefix))


async def test_delivers_a_published_event_to_its_handler(bus: EventBus) -> None:
    """The handler receives the event as its typed model, with the envelope intact."""
    handler = Recorder()
    sent = job_requested("job-a", num_workers=2)
    await bus.publish(sent)
    async with consuming(bus, subscription(handler)):
        await eventually(lambda: len(handler.seen) == 1)
    assert handler.seen[0] == sent
    assert isinstance(handler.seen[0].data, JobRequested)


async def test_the_same_event_published_twice_is_stored_once(bus: EventBus) -> None:
    event = job_requested("job-dup")
    first = await bus.publish(event)
    second = await bus.publish(event)
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.seq == first.seq
    assert len(await bus.read(subject_for(JobRequested, bus.prefix))) == 1


VALID = job_requested("job-ok").model_dump_json().encode()

BAD_MESSAGES = [
    pytest.param(b"this is not json", "not-json", id="not-json"),
    pytest.param(b"\xff\xfe\x00garbage", "not-json", id="not-utf8"),
    pytest.param(b'{"hello": "world"}', "not-an-event", id="missing-envelope-fields"),
    pytest.param(
        VALID.replace(b"spotrain.job.requested.v1", b"spotrain.job.exploded.v1"),
        "unknown-type",
        id="unknown-type",
    ),
    pytest.param(
        VALID.replace(b"spotrain.job.requested.v1", b"spotrain.job.requested.v9"),
        "unknown-version",
        id="unknown-version",
    ),
    pytest.param(VALID.replace(b'"alice"', b'"al; rm -rf /"'), "invalid-data", id="hostile-owner"),
    pytest.param(
        VALID.replace(b'"num_workers":1', b'"num_workers":"1"'), "invalid-data", id="wrong-type"
    ),
    pytest.param(VALID[:-1] + b',"padding":"' + b"x" * 70_000 + b'"}', "too-large", id="oversize"),
]


@pytest.mark.parametrize(("payload", "reason"), BAD_MESSAGES)
async def test_invalid_messages_are_dead_lettered_with_their_reason(
    bus: EventBus, payload: bytes, reason: str
) -> None:
    """The bad message goes to the DLQ untouched, and the valid one behind it is handled."""
    handler = Recorder()
    subject = subject_for(JobRequested, bus.prefix)
    await bus.publish_raw(subject, payload)
    await bus.publish(job_requested("job-after"))
    async with consuming(bus, subscription(handler)):
        await eventually(lambda: handler.job_ids() == ["job-after"])
        await eventually(lambda: _count(dead_letters(bus), 1))
    [letter] = await dead_letters(bus)
    assert letter.data == payload
    assert letter.headers[REASON] == reason
    assert letter.headers[SERVICE] == "svc"
    assert letter.headers[ORIGINAL_SUBJECT] == subject


async def test_retry_later_redelivers_until_the_handler_succeeds(bus: EventBus) -> None:
    handler = Recorder(failures=[RetryLater(0.05), RetryLater(0.05)])
    await bus.publish(job_requested("job-retry"))
    async with consuming(bus, subscription(handler)):
        await eventually(lambda: len(handler.seen) == 3)
        await asyncio.sleep(0.3)
    assert handler.job_ids() == ["job-retry"] * 3
    assert await dead_letters(bus) == []


async def test_a_handler_that_keeps_failing_is_dead_lettered_after_the_limit(bus: EventBus) -> None:
    handler = Recorder(failures=[RuntimeError("boom")] * 10)
    await bus.publish(job_requested("job-doomed"))
    async with consuming(bus, subscription(handler)):
        await eventually(lambda: _count(dead_letters(bus), 1))
        await asyncio.sleep(0.3)
    assert len(handler.seen) == FAST_RETRIES.max_deliveries
    [letter] = await dead_letters(bus)
    assert letter.headers[REASON] == "delivery-limit"
    assert letter.headers[DELIVERIES] == "3"
    assert "RuntimeError: boom" in letter.headers["Spotrain-Dlq-Detail"]


async def test_an_unhandleable_event_is_dead_lettered_at_once(bus: EventBus) -> None:
    handler = Recorder(failures=[Unhandleable("job spec names a pool that does not exist")])
    await bus.publish(job_requested("job-odd"))
    async with consuming(bus, subscription(handler)):
        await eventually(lambda: _count(dead_letters(bus), 1))
    assert len(handler.seen) == 1
    [letter] = await dead_letters(bus)
    assert letter.headers[REASON] == "unhandleable"
    assert "does not exist" in letter.headers["Spotrain-Dlq-Detail"]


async def test_an_event_on_the_wrong_subject_is_dead_lettered(bus: EventBus) -> None:
    handler = Recorder()
    accepted_subject = subject_for(JobAccepted, bus.prefix)
    requested_subject = subject_of(decode(VALID).data, bus.prefix)
    # A job.requested envelope sent where job.accepted belongs, seen by a consumer of both.
    await bus.publish_raw(accepted_subject, VALID)
    sub = Subscription(
        service="svc", routes={JobRequested: handler, JobAccepted: handler}, redelivery=FAST_RETRIES
    )
    async with consuming(bus, sub):
        await eventually(lambda: _count(dead_letters(bus), 1))
    assert handler.seen == []
    [letter] = await dead_letters(bus)
    assert letter.headers[REASON] == "wrong-subject"
    assert requested_subject in letter.headers["Spotrain-Dlq-Detail"]


@pytest.mark.parametrize(
    ("sender", "reason"),
    [
        pytest.param("alice", None, id="on-its-senders-own-subject"),
        pytest.param("mallory", "not-the-sender", id="sent-by-another"),
        pytest.param(None, "wrong-subject", id="on-no-senders-subject"),
    ],
)
async def test_a_request_is_taken_only_from_its_senders_own_subject(
    bus: EventBus, sender: str | None, reason: str | None
) -> None:
    """The owner a request names must be the one its subject names: a credential may
    publish only on its own name, so the subject is the proof of who sent it."""
    request = decode(VALID)
    assert isinstance(request.data, JobRequested)
    assert request.data.owner == "alice"
    base = f"{bus.prefix}.job.requested"
    await bus.publish_raw(base if sender is None else f"{base}.{sender}", VALID)
    handler = Recorder()
    sub = Subscription(service="svc", routes={JobRequested: handler}, redelivery=FAST_RETRIES)
    async with consuming(bus, sub):
        if reason is None:
            await eventually(lambda: len(handler.seen) == 1)
        else:
            await eventually(lambda: _count(dead_letters(bus), 1))
    if reason is None:
        assert await dead_letters(bus) == []
        return
    assert handler.seen == []
    [letter] = await dead_letters(bus)
    assert letter.headers[REASON] == reason
    if sender is not None:
        assert "sent as mallory names alice as its owner" in letter.headers["Spotrain-Dlq-Detail"]


async def test_handlers_run_concurrently_up_to_the_limit(bus: EventBus) -> None:
    running = 0
    peak = 0
    done: list[str] = []

    async def slow(event: Event[Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.1)
        running -= 1
        done.append(event.data.job_id)

    for n in range(6):
        await bus.publish(job_requested(f"job-{n}"))
    sub = Subscription(service="svc", routes={JobRequested: slow}, max_concurrency=2)
    async with consuming(bus, sub):
        await eventually(lambda: len(done) == 6)
    assert peak == 2


async def test_stopping_lets_the_in_flight_handler_finish_and_ack(bus: EventBus) -> None:
    """A handler running when the consumer stops completes; its event is not redelivered."""
    started = asyncio.Event()
    finished: list[str] = []

    async def slow(event: Event[Any]) -> None:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(event.data.job_id)

    await bus.publish(job_requested("job-inflight"))
    async with consuming(bus, Subscription(service="svc", routes={JobRequested: slow})):
        await started.wait()
    assert finished == ["job-inflight"]

    again = Recorder()
    async with consuming(bus, subscription(again)):
        await asyncio.sleep(0.5)
    assert again.seen == []


async def _count_is(awaitable: Any, n: int) -> bool:
    return len(await awaitable) == n


def _count(awaitable: Any, n: int) -> Any:
    return _count_is(awaitable, n)


async def test_a_batch_is_published_in_order_and_deduplicated(bus: EventBus) -> None:
    events = [job_requested(f"job-{n}") for n in range(20)]
    first = await bus.publish_many(events)
    again = await bus.publish_many(events[:5])
    assert [ack.duplicate for ack in first] == [False] * 20
    assert [ack.duplicate for ack in again] == [True] * 5
    stored = await bus.read(subject_for(JobRequested, bus.prefix))
    assert [m.headers["Nats-Msg-Id"] for m in stored] == [e.id for e in events]


async def test_a_bucket_is_declared_by_its_writer_and_read_empty_before(bus: EventBus) -> None:
    """What a reader started before the bucket's writer sees: nothing, and no bucket of
    its own making; then the writer's values, through the same handle."""
    name = f"b{secrets.token_hex(4)}"
    reader = bus.bucket(name)
    assert await reader.get("status") is None
    assert await reader.entries() == []
    with pytest.raises(BucketMissingError):
        await reader.put("status", b"mine")
    writer = await bus.declare_bucket(name, history=2)
    assert await bus.declare_bucket(name, history=2) is not None  # idempotent
    first = await writer.put("demand.a", b"1")
    assert await writer.put("demand.a", b"2") > first
    await writer.put("demand.b", b"3")
    await writer.put("status", b"up")
    entry = await reader.get("demand.a")
    assert entry is not None
    assert entry.value == b"2"
    assert sorted(e.key for e in await reader.entries("demand.")) == ["demand.a", "demand.b"]
    assert len(await reader.entries()) == 3
    with pytest.raises(ValueError, match="ends with"):
        await reader.entries("demand")


async def test_a_listener_hears_what_is_stored_from_now_until_it_stops(bus: EventBus) -> None:
    await bus.publish(job_requested("before"))
    heard: list[str] = []

    async def on_message(data: bytes) -> None:
        heard.append(_job_id(data))

    listening = await bus.listen(subject_for(JobRequested, bus.prefix), on_message)
    await bus.publish(job_requested("after"))
    await eventually(lambda: heard == ["after"])
    await listening.stop()
    await listening.stop()  # twice is fine
    await bus.publish(job_requested("stopped"))
    await bus.publish(job_requested("later"))
    stored = [_job_id(m.data) for m in await bus.read(f"{bus.prefix}.job.>")]
    assert stored[-1] == "later"
    assert heard == ["after"]


async def test_a_follower_reads_from_a_time_then_what_comes(bus: EventBus) -> None:
    await bus.publish(job_requested("old"))
    await asyncio.sleep(0.05)
    since = datetime.now(UTC)
    await bus.publish(job_requested("first"))
    stop = asyncio.Event()
    seen: list[str] = []

    async def follow() -> None:
        records = bus.follow([f"{bus.prefix}.job.>"], stop, since=since)
        async with contextlib.aclosing(records) as followed:
            async for record in followed:
                seen.append(_job_id(record.data))
                assert record.stored_at >= since - timedelta(seconds=1)

    following = asyncio.create_task(follow())
    try:
        await eventually(lambda: seen == ["first"])
        await bus.publish(job_requested("second"))
        await eventually(lambda: seen == ["first", "second"])
    finally:
        stop.set()
        await asyncio.wait_for(following, timeout=10)


async def test_a_request_nobody_answers_says_so(bus: EventBus) -> None:
    with pytest.raises(NoAnswerError):
        await bus.request(f"{bus.prefix}-desk.nobody", b"{}", timeout_s=2)


def _job_id(data: bytes) -> str:
    return str(getattr(decode(data).data, "job_id", ""))


async def test_an_object_store_is_declared_by_its_writer_and_found_by_name(bus: EventBus) -> None:
    name = f"o{secrets.token_hex(4)}"
    reader = bus.store(name)
    assert await reader.get("ws.zip") is None
    assert not await reader.has("ws.zip")
    assert await reader.list() == []
    with pytest.raises(ObjectStoreMissingError):
        await reader.put("ws.zip", b"x")
    writer = await bus.declare_store(name)
    await bus.declare_store(name)  # idempotent
    big = secrets.token_bytes(300_000)  # several of JetStream's chunks
    await writer.put("ws.zip", big, description="300000")
    await writer.put("other.zip", b"small")
    assert await reader.get("ws.zip") == big
    assert await reader.has("ws.zip")
    listed = {o.name: o for o in await reader.list()}
    assert set(listed) == {"ws.zip", "other.zip"}
    assert (listed["ws.zip"].size, listed["ws.zip"].description) == (300_000, "300000")
    assert await writer.delete("ws.zip")
    assert not await writer.delete("ws.zip")
    assert not await reader.has("ws.zip")
    assert [o.name for o in await reader.list()] == ["other.zip"]


async def test_a_request_is_answered_by_one_server_of_the_group(bus: EventBus) -> None:
    subject = f"{bus.prefix}-desk.{secrets.token_hex(3)}"
    taken: list[str] = []

    def server(name: str) -> Any:
        async def on_ask(asked: Asked) -> None:
            taken.append(name)
            await bus.answer(asked, asked.data.upper() + f" from {name}".encode())

        return on_ask

    servers = [await bus.serve(f"{subject}.>", server(n), group="desk") for n in ("a", "b")]
    try:
        answer = await bus.request(f"{subject}.alice", b"hello", timeout_s=5)
        assert answer in (b"HELLO from a", b"HELLO from b")
        assert len(taken) == 1
    finally:
        for serving in servers:
            await serving.stop()
    with pytest.raises(NoAnswerError):
        await bus.request(f"{subject}.alice", b"hello", timeout_s=2)


async def test_a_request_not_answered_in_time_says_so(bus: EventBus) -> None:
    subject = f"{bus.prefix}-desk.{secrets.token_hex(3)}"

    async def silent(asked: Asked) -> None:
        pass

    serving = await bus.serve(subject, silent, group="desk")
    try:
        with pytest.raises(TimeoutError):
            await bus.request(subject, b"hello", timeout_s=0.3)
    finally:
        await serving.stop()


async def test_the_stream_is_read_after_a_sequence(bus: EventBus) -> None:
    acks = [await bus.publish(job_requested(f"r{i}")) for i in range(3)]
    after = await bus.read(f"{bus.prefix}.job.>", after_seq=acks[0].seq)
    assert [_job_id(m.data) for m in after] == ["r1", "r2"]
