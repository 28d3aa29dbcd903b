"""The gce-pubsub source through the real google-cloud-pubsub client's streaming pull, over
gRPC, against a local fake of the Subscriber service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.pubsub_v1 import SubscriberClient
from structlog.testing import capture_logs

from services.preemption_watcher.adapters.gce_pubsub import (
    PubSubError,
    PubSubNoticeSource,
    connect_subscriber,
)
from services.preemption_watcher.model import NodeSignal
from shared.events.data import NodePreempting, NoticeSource
from tests.async_helpers import eventually
from tests.fakes.pubsub_server import FakeSubscription, serve_fake_pubsub

pytestmark = pytest.mark.integration

SUBSCRIPTION = "projects/spotrain-prod/subscriptions/gce-preemptions"
ACK_DEADLINE_S = 1.0
LEASE_S = 10
"""The client's shortest lease (its receipt modack and each extension, at the least)."""
DATA = Path(__file__).parents[1] / "data" / "gce"
SPOT_NODE = "gke-train-gpu-spot-5f3c2a1b-x7kq"
SPOT_KEY = "systemevent-1773480413000-64d7f2a9c1b3e-8a2f41c7-3e9b5d06"
OTHER_NODE = "gke-train-cpu-spot-0a9e77d2-mm3z"


def recorded(name: str) -> bytes:
    return (DATA / f"{name}.json").read_bytes()


def publish_entry(subscription: FakeSubscription, name: str) -> str:
    """Publishes a recorded entry as a logging sink does: the LogEntry JSON as the data."""
    return subscription.publish(
        recorded(name), {"logging.googleapis.com/timestamp": "2026-03-14T09:26:53.358904Z"}
    )


async def next_signal(signals: AsyncIterator[NodeSignal]) -> NodeSignal:
    return await asyncio.wait_for(anext(signals), timeout=10)


@pytest.fixture
def pubsub() -> Iterator[FakeSubscription]:
    with serve_fake_pubsub(FakeSubscription(SUBSCRIPTION, ack_deadline_s=ACK_DEADLINE_S)) as fake:
        yield fake


@pytest.fixture
def client(pubsub: FakeSubscription) -> Iterator[SubscriberClient]:
    with connect_subscriber(pubsub.endpoint) as subscriber:
        yield subscriber


@pytest.fixture
def source(client: SubscriberClient) -> PubSubNoticeSource:
    return PubSubNoticeSource(client, SUBSCRIPTION, lease_extension_s=LEASE_S)


async def test_a_preemption_entry_becomes_a_node_preempting_signal(
    pubsub: FakeSubscription, source: PubSubNoticeSource
) -> None:
    """The node is the instance, the deadline the entry's time plus 30 s, the key its operation."""
    publish_entry(pubsub, "preempted_spot_node")
    async with aclosing(source.signals(asyncio.Event())) as signals:
        signal = await next_signal(signals)
    assert source.name == "gce-pubsub"
    assert signal.key == SPOT_KEY
    assert signal.data == NodePreempting(
        node=SPOT_NODE,
        pool=None,
        deadline=datetime(2026, 3, 14, 9, 27, 23, 358904, tzinfo=UTC),
        source=NoticeSource.GCE_PUBSUB,
    )


async def test_a_signal_is_acked_only_when_the_consumer_asks_for_the_next(
    pubsub: FakeSubscription, source: PubSubNoticeSource
) -> None:
    """Handing a signal out acks nothing; asking for the next acks it; stop acks the last."""
    first = publish_entry(pubsub, "preempted_spot_node")
    second = publish_entry(pubsub, "preempted_without_operation")
    stop = asyncio.Event()
    async with aclosing(source.signals(stop)) as signals:
        assert (await next_signal(signals)).data.node == SPOT_NODE
        await asyncio.sleep(0.3)  # the client sends acks within 0.1 s
        assert pubsub.acks == []
        assert "Acknowledge" not in pubsub.calls

        assert (await next_signal(signals)).data.node == OTHER_NODE
        await eventually(lambda: pubsub.acks == [first])

        stop.set()
        with pytest.raises(StopAsyncIteration):
            await next_signal(signals)
    await eventually(lambda: pubsub.acks == [first, second])
    assert pubsub.unacked() == []
    assert pubsub.released == []
    assert "StreamingPull" in pubsub.calls
    assert "Pull" not in pubsub.calls


async def test_a_notice_held_longer_than_its_lease_is_not_delivered_again(
    pubsub: FakeSubscription, source: PubSubNoticeSource
) -> None:
    """Issue 20: while the consumer handles a signal, the client extends its message's lease,
    so no other pull gets it however long that takes."""
    message = publish_entry(pubsub, "preempted_spot_node")
    async with aclosing(source.signals(asyncio.Event())) as signals:
        await next_signal(signals)
        await eventually(lambda: len(pubsub.extended) >= 2, timeout_s=LEASE_S * 1.5)
        assert pubsub.deliveries(message) == 1
    assert {m for m, _ in pubsub.extended} == {message}
    assert all(seconds <= LEASE_S for _, seconds in pubsub.extended)


async def test_a_consumer_that_dies_gets_the_same_signal_again_after_its_lease(
    pubsub: FakeSubscription, client: SubscriberClient
) -> None:
    """A watcher that dies holding a signal (its process gone: its stream and its lease
    extensions with it) has not acked it: once the lease runs out, the next watcher gets
    it again, with the same key."""
    message = publish_entry(pubsub, "preempted_spot_node")
    dead_client = connect_subscriber(pubsub.endpoint)
    dead = PubSubNoticeSource(dead_client, SUBSCRIPTION, lease_extension_s=LEASE_S).signals(
        asyncio.Event()
    )
    try:
        held = await next_signal(dead)
        handed_out_at = time.monotonic()
        dead_client.close()  # the process dies: nothing is released, nothing extended

        restarted = PubSubNoticeSource(client, SUBSCRIPTION, lease_extension_s=LEASE_S)
        async with aclosing(restarted.signals(asyncio.Event())) as signals:
            again = await asyncio.wait_for(anext(signals), timeout=LEASE_S * 3)
            waited_s = time.monotonic() - handed_out_at
    finally:
        with contextlib.suppress(Exception):
            await dead.aclose()

    assert again.key == held.key == SPOT_KEY
    assert again.event_id == held.event_id
    assert waited_s >= LEASE_S * 0.5, "redelivered while the dead watcher's lease held"
    # Released when the restarted watcher closes, it may come back to its stream once more
    # before the stream goes: at least once.
    assert pubsub.deliveries(message) >= 2
    assert pubsub.acks == []
    await eventually(lambda: set(pubsub.released) == {message})


async def test_a_consumer_that_fails_releases_its_signal_for_the_next_at_once(
    pubsub: FakeSubscription, source: PubSubNoticeSource
) -> None:
    """A consumer that fails and closes the iteration releases the message: the retry gets
    it at once, not after the ack deadline."""
    pubsub.ack_deadline_s = 60
    message = publish_entry(pubsub, "preempted_spot_node")

    async def publish_fails() -> None:
        async with aclosing(source.signals(asyncio.Event())) as signals:
            async for _ in signals:
                raise RuntimeError("bus down")

    with pytest.raises(RuntimeError, match="bus down"):
        await publish_fails()
    assert pubsub.acks == []
    await eventually(lambda: set(pubsub.released) == {message})

    async with aclosing(source.signals(asyncio.Event())) as signals:
        again = await asyncio.wait_for(anext(signals), timeout=5)
    assert again.key == SPOT_KEY
    assert pubsub.deliveries(message) >= 2


async def test_stop_releases_received_messages_not_yet_handed_out(
    pubsub: FakeSubscription, source: PubSubNoticeSource
) -> None:
    """Messages received but not handed out before stop go back at once."""
    first = publish_entry(pubsub, "preempted_spot_node")
    second = publish_entry(pubsub, "preempted_without_operation")
    stop = asyncio.Event()
    async with aclosing(source.signals(stop)) as signals:
        await next_signal(signals)
        await eventually(lambda: pubsub.deliveries(second) == 1)
        stop.set()
        with pytest.raises(StopAsyncIteration):
            await next_signal(signals)
    await eventually(lambda: pubsub.acks == [first] and set(pubsub.released) == {second})
    assert pubsub.unacked() == [second]


async def test_non_preemptions_and_malformed_messages_are_acked_and_skipped(
    pubsub: FakeSubscription, source: PubSubNoticeSource
) -> None:
    """Other entries and unreadable ones never become signals; they are acked (they can
    never become valid), and each unreadable one is logged with its id and the reason."""
    skipped = [
        publish_entry(pubsub, "host_maintenance"),
        pubsub.publish(b"\x00 not json"),
        pubsub.publish(recorded("preempted_spot_node").replace(b"resourceName", b"resource")),
        publish_entry(pubsub, "instance_stopped_by_user"),
    ]
    stop = asyncio.Event()
    with capture_logs() as logs:
        async with aclosing(source.signals(stop)) as signals:
            task = asyncio.create_task(next_signal(signals))
            await eventually(lambda: sorted(pubsub.acks) == sorted(skipped), timeout_s=5)
            assert not task.done(), "no message became a signal"
            last = publish_entry(pubsub, "preempted_without_operation")
            signal = await asyncio.wait_for(task, timeout=10)
    assert signal.data.node == OTHER_NODE
    assert pubsub.unacked() == [last]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    # The client hands messages over from a pool of threads: in no set order.
    reasons = {e["message_id"]: e["reason"] for e in warnings}
    assert [e["event"] for e in warnings] == ["pubsub.message_malformed"] * 2
    assert reasons.keys() == {skipped[1], skipped[2]}
    assert "Invalid JSON" in reasons[skipped[1]]
    assert "has no protoPayload.resourceName" in reasons[skipped[2]]


async def test_stop_ends_an_idle_iteration_promptly(source: PubSubNoticeSource) -> None:
    """With nothing to receive, a set stop ends the iteration at once."""
    stop = asyncio.Event()

    async def consume() -> list[NodeSignal]:
        return [signal async for signal in source.signals(stop)]

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.5)  # the stream open, waiting on the server
    assert not task.done()
    stopped_at = time.monotonic()
    stop.set()
    assert await asyncio.wait_for(task, timeout=10) == []
    assert time.monotonic() - stopped_at < 2.0


async def test_a_missing_subscription_is_a_clear_os_error(client: SubscriberClient) -> None:
    """Pub/Sub's NOT_FOUND leaves as a PubSubError naming the subscription, for the runtime
    to restart the source after a pause."""
    missing = "projects/spotrain-prod/subscriptions/nope"
    source = PubSubNoticeSource(client, missing)
    with pytest.raises(PubSubError, match=f"pulling from {missing}: 404") as raised:
        async with aclosing(source.signals(asyncio.Event())) as signals:
            await next_signal(signals)
    assert isinstance(raised.value, OSError)
