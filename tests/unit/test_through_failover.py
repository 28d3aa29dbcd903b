"""JetStream calls through a cluster's leader election (`through_failover`): tried again on
a timeout, a 503 or a stream with no responder yet until the deadline, never on any other
refusal."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
import pytest
from nats.js.api import ConsumerConfig, ConsumerInfo

from shared.messaging import BusSettings
from shared.messaging.failover import through_failover
from shared.messaging.jetstream import JetStreamBus


class Flaky:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "stored"


def electing() -> Exception:
    return nats.js.errors.ServiceUnavailableError(
        code=503, err_code=10008, description="JetStream system temporarily unavailable"
    )


async def test_a_call_rides_out_an_election() -> None:
    call = Flaky([electing(), nats.errors.TimeoutError()])
    assert await through_failover(10.0, call) == "stored"
    assert call.calls == 3


async def test_a_stream_not_yet_answering_on_its_subjects_is_asked_again() -> None:
    """A bucket created by one server of a cluster: a write through another server finds no
    responder until the stream's interest reaches it (CI saw it once, on the first write)."""
    call = Flaky([nats.js.errors.NoStreamResponseError(), nats.js.errors.NoStreamResponseError()])
    assert await through_failover(10.0, call) == "stored"
    assert call.calls == 3


async def test_past_the_deadline_the_election_is_the_callers_to_say() -> None:
    call = Flaky([electing(), electing(), electing()])
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        await through_failover(0.0, call)
    assert call.calls == 1


async def test_any_other_refusal_is_not_tried_again() -> None:
    refused = nats.js.errors.BadRequestError(code=400, err_code=10071, description="wrong last")
    call = Flaky([refused])
    with pytest.raises(nats.js.errors.BadRequestError):
        await through_failover(10.0, call)
    assert call.calls == 1


class LostPlacement:
    """A cluster that placed the first create of a reading consumer on a server lost
    meanwhile: nobody answers for that name, ever; a new name is placed on one alive."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.deleted: list[str] = []

    async def add_consumer(self, stream: str, config: ConsumerConfig) -> ConsumerInfo:
        assert config.name is not None
        self.asked.append(config.name)
        if config.name == self.asked[0]:
            raise nats.errors.TimeoutError
        return ConsumerInfo(
            name=config.name,
            stream_name=stream,
            config=config,
            created=datetime.now(UTC),
            num_pending=0,
        )

    async def pull_subscribe_bind(self, durable: str, stream: str) -> EmptyPull:
        return EmptyPull(self.asked[-1])

    async def delete_consumer(self, stream: str, name: str) -> bool:
        self.deleted.append(name)
        return True


class EmptyPull:
    """A pull subscription to a consumer with nothing to read."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def consumer_info(self) -> ConsumerInfo:
        config = ConsumerConfig(name=self.name)
        return ConsumerInfo(
            name=self.name, stream_name="SPOTRAIN", config=config, created=datetime.now(UTC),
            num_pending=0,
        )  # fmt: skip

    async def unsubscribe(self) -> None:
        return None


async def test_a_read_asks_again_under_a_new_name_through_a_servers_loss() -> None:
    bus = JetStreamBus(BusSettings(publish_timeout_s=10))
    cluster = LostPlacement()
    bus._js = cluster  # type: ignore[assignment]
    assert await bus.read("spotrain.chaos.mark") == []
    first, second = cluster.asked
    assert first != second
    assert cluster.deleted == [second]


async def test_a_window_of_the_stream_is_read_through_a_servers_loss_too() -> None:
    bus = JetStreamBus(BusSettings(publish_timeout_s=10))
    cluster = LostPlacement()
    bus._js = cluster  # type: ignore[assignment]
    since = datetime(2026, 12, 6, tzinfo=UTC)
    async with contextlib.aclosing(bus.read_window(["spotrain.chaos.mark"], since=since)) as read:
        assert [record async for record in read] == []
    first, second = cluster.asked
    assert first != second
    assert cluster.deleted == [second]
    assert cluster.deleted == [second]
