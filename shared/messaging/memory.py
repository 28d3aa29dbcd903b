"""The bus in memory, for unit tests: same semantics as JetStream, no server.

It stores, de-duplicates by message id, delivers at least once to durable consumers,
counts deliveries, honours nak delays and dead-letters through the same `settle`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from shared.events import (
    DEFAULT_PREFIX,
    Event,
    dlq_subject,
    encode,
    subject_matches,
    subject_of,
)
from shared.messaging.dead_letters import MSG_ID, dead_letter_headers
from shared.messaging.delivery import (
    Ack,
    DeadLetter,
    Delivery,
    HandlerTasks,
    Nak,
    Subscription,
    settle,
)
from shared.messaging.kv_store import InMemoryKeyValue
from shared.messaging.ports import (
    KeyValue,
    Listening,
    NoAnswerError,
    OnMessage,
    PublishAck,
    StoredMessage,
    StreamRecord,
)

log = structlog.get_logger()


@dataclass
class _Consumer:
    filters: list[str]
    next_seq: int = 1
    deliveries: dict[int, int] = field(default_factory=dict)
    ready: asyncio.Queue[int] = field(default_factory=asyncio.Queue)


@dataclass
class _Listener:
    subject: str
    on_message: OnMessage
    listeners: list[_Listener]

    async def stop(self) -> None:
        if self in self.listeners:
            self.listeners.remove(self)


class InMemoryBus:
    """`EventBus` in one process; `messages` is the whole stream, for assertions."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self._prefix = prefix
        self.messages: list[StoredMessage] = []
        self._stored_at: list[datetime] = []
        self._ids: set[str] = set()
        self._consumers: dict[str, _Consumer] = {}
        self._stored = asyncio.Event()
        self._followed = asyncio.Event()
        """Set at each store, for followers (consumers have `_stored`, cleared as they read)."""
        self._buckets: dict[str, InMemoryKeyValue] = {}
        self._listeners: list[_Listener] = []
        self.answerers: dict[str, Callable[[bytes], Awaitable[bytes]]] = {}
        """Who answers a request on each subject: a test's stand-in for a service."""

    @property
    def prefix(self) -> str:
        return self._prefix

    async def publish(self, event: Event[Any]) -> PublishAck:
        subject = subject_of(event.data, self._prefix)
        return await self.publish_raw(subject, encode(event), {MSG_ID: event.id})

    async def publish_many(self, events: Sequence[Event[Any]]) -> list[PublishAck]:
        return [await self.publish(event) for event in events]

    async def publish_raw(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> PublishAck:
        headers = dict(headers or {})
        msg_id = headers.get(MSG_ID)
        if msg_id is not None and msg_id in self._ids:
            seq = next(m.seq for m in self.messages if m.headers.get(MSG_ID) == msg_id)
            return PublishAck(seq=seq, duplicate=True)
        if msg_id is not None:
            self._ids.add(msg_id)
        seq = len(self.messages) + 1
        self.messages.append(StoredMessage(seq=seq, subject=subject, data=data, headers=headers))
        self._stored_at.append(datetime.now(UTC))
        self._stored.set()
        self._followed.set()
        for listener in list(self._listeners):
            if subject_matches(listener.subject, subject):
                await listener.on_message(data)
        return PublishAck(seq=seq, duplicate=False)

    async def read(self, subject: str) -> list[StoredMessage]:
        return [m for m in self.messages if subject_matches(subject, m.subject)]

    async def declare_bucket(
        self, bucket: str, *, history: int = 1, ttl_s: float | None = None
    ) -> KeyValue:
        kv = self._buckets.setdefault(bucket, InMemoryKeyValue())
        kv.declared = True
        return kv

    def bucket(self, bucket: str) -> KeyValue:
        return self._buckets.setdefault(bucket, InMemoryKeyValue(declared=False))

    async def follow(
        self, subjects: Sequence[str], stop: asyncio.Event, *, since: datetime | None = None
    ) -> AsyncGenerator[StreamRecord, None]:
        if since is None:
            seq = len(self.messages)
        else:
            seq = next(
                (i for i, at in enumerate(self._stored_at) if at >= since), len(self._stored_at)
            )
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                while seq < len(self.messages):
                    message = self.messages[seq]
                    seq += 1
                    if any(subject_matches(s, message.subject) for s in subjects):
                        yield StreamRecord(
                            seq=message.seq,
                            subject=message.subject,
                            data=message.data,
                            headers=message.headers,
                            stored_at=self._stored_at[message.seq - 1],
                        )
                self._followed.clear()
                if seq < len(self.messages):
                    continue
                stored = asyncio.ensure_future(self._followed.wait())
                await asyncio.wait({stored, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stored.cancel()
        finally:
            stopping.cancel()

    async def listen(self, subject: str, on_message: OnMessage) -> Listening:
        listener = _Listener(subject, on_message, self._listeners)
        self._listeners.append(listener)
        return listener

    async def request(self, subject: str, data: bytes, *, timeout_s: float) -> bytes:
        answerer = self.answerers.get(subject)
        if answerer is None:
            raise NoAnswerError(subject)
        return await asyncio.wait_for(answerer(data), timeout=timeout_s)

    async def consume(self, subscription: Subscription, stop: asyncio.Event) -> None:
        consumer = self._consumers.setdefault(
            subscription.durable,
            _Consumer(filters=subscription.filter_subjects(self._prefix)),
        )
        stopping = asyncio.create_task(stop.wait())
        try:
            async with HandlerTasks(subscription.max_concurrency) as handlers:
                while not stop.is_set():
                    self._admit_new(consumer)
                    if consumer.ready.empty():
                        self._stored.clear()
                        waiting = asyncio.create_task(self._next_ready(consumer))
                        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                        waiting.cancel()
                        continue
                    await handlers.wait_for_slot()
                    seq = consumer.ready.get_nowait()
                    handlers.start(self._handle(seq, consumer, subscription))
        finally:
            stopping.cancel()

    def _admit_new(self, consumer: _Consumer) -> None:
        while consumer.next_seq <= len(self.messages):
            message = self.messages[consumer.next_seq - 1]
            if any(subject_matches(f, message.subject) for f in consumer.filters):
                consumer.ready.put_nowait(message.seq)
            consumer.next_seq += 1

    async def _next_ready(self, consumer: _Consumer) -> None:
        while consumer.ready.empty():
            await self._stored.wait()
            self._stored.clear()
            self._admit_new(consumer)

    async def _handle(self, seq: int, consumer: _Consumer, subscription: Subscription) -> None:
        message = self.messages[seq - 1]
        consumer.deliveries[seq] = consumer.deliveries.get(seq, 0) + 1
        delivery = Delivery(
            subject=message.subject,
            data=message.data,
            num_delivered=consumer.deliveries[seq],
            stream_seq=seq,
        )
        outcome = await settle(delivery, subscription, self._prefix)
        match outcome:
            case Ack():
                pass
            case Nak(delay_s=delay_s):
                loop = asyncio.get_running_loop()
                loop.call_later(delay_s, self._redeliver, consumer, seq)
            case DeadLetter():
                await self.publish_raw(
                    dlq_subject(subscription.service, self._prefix),
                    message.data,
                    dead_letter_headers(delivery, outcome, subscription.service),
                )
                log.warning(
                    "event.dead_lettered", reason=outcome.reason.value, detail=outcome.detail
                )

    def _redeliver(self, consumer: _Consumer, seq: int) -> None:
        consumer.ready.put_nowait(seq)
        self._stored.set()
