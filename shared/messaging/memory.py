"""The bus in memory, for unit tests: same semantics as JetStream, no server.

It stores, de-duplicates by message id, delivers at least once to durable consumers,
counts deliveries, honours nak delays and dead-letters through the same `settle`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Mapping, Sequence
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
from shared.messaging.object_store import InMemoryObjectStore
from shared.messaging.ports import (
    Asked,
    KeyValue,
    Listening,
    NoAnswerError,
    ObjectStore,
    OnAsk,
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


@dataclass
class _Server:
    subject: str
    on_ask: OnAsk
    servers: list[_Server]

    async def stop(self) -> None:
        if self in self.servers:
            self.servers.remove(self)


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
        self._stores: dict[str, InMemoryObjectStore] = {}
        self._listeners: list[_Listener] = []
        self._servers: list[_Server] = []
        self._asked: dict[str, asyncio.Future[bytes]] = {}

    @property
    def prefix(self) -> str:
        return self._prefix

    async def close(self) -> None:
        for listener in list(self._listeners):
            await listener.stop()
        for server in list(self._servers):
            await server.stop()

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

    async def read(self, subject: str, *, after_seq: int = 0) -> list[StoredMessage]:
        return [m for m in self.messages[after_seq:] if subject_matches(subject, m.subject)]

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

    async def declare_store(self, store: str, *, ttl_s: float | None = None) -> ObjectStore:
        found = self._stores.setdefault(store, InMemoryObjectStore())
        found.declared = True
        return found

    def store(self, store: str) -> ObjectStore:
        return self._stores.setdefault(store, InMemoryObjectStore(declared=False))

    async def listen(self, subject: str, on_message: OnMessage) -> Listening:
        listener = _Listener(subject, on_message, self._listeners)
        self._listeners.append(listener)
        return listener

    async def request(self, subject: str, data: bytes, *, timeout_s: float) -> bytes:
        server = next((s for s in self._servers if subject_matches(s.subject, subject)), None)
        if server is None:
            raise NoAnswerError(subject)
        reply = f"_INBOX.{secrets.token_hex(8)}"
        answered = self._asked[reply] = asyncio.get_running_loop().create_future()
        try:
            await server.on_ask(Asked(subject=subject, reply=reply, data=data))
            return await asyncio.wait_for(answered, timeout=timeout_s)
        finally:
            self._asked.pop(reply, None)

    async def serve(self, subject: str, on_ask: OnAsk, *, group: str) -> Listening:
        # One process is one member of any group: each request goes to the first server.
        server = _Server(subject, on_ask, self._servers)
        self._servers.append(server)
        return server

    async def answer(self, asked: Asked, data: bytes) -> None:
        answered = self._asked.get(asked.reply or "")
        if answered is not None and not answered.done():
            answered.set_result(data)

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
