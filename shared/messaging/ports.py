"""The bus as every service and client sees it, whatever carries it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from shared.events import Event
from shared.messaging.delivery import Subscription


@dataclass(frozen=True)
class PublishAck:
    """Where the bus stored a message; `duplicate` when its id was already stored."""

    seq: int
    duplicate: bool


@dataclass(frozen=True)
class StoredMessage:
    """A message as the stream holds it: for dead letters, history, replay."""

    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str]


OnMessage = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class StreamRecord:
    """A stored message and when the stream stored it: what windowed reads yield."""

    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str]
    stored_at: datetime


class Listening(Protocol):
    async def stop(self) -> None:
        """Hear no more; safe to call twice, and once the bus is closed."""
        ...


@dataclass(frozen=True)
class Asked:
    """One request, as the service that answers it receives it: `reply` is where the
    answer goes, chosen by whoever asked (check it before answering there)."""

    subject: str
    reply: str | None
    data: bytes


OnAsk = Callable[[Asked], Awaitable[None]]


class NoAnswerError(RuntimeError):
    """Nobody answers on the subject a request was sent to (its service is not up)."""


@dataclass(frozen=True)
class Entry:
    """One key's value as a bucket holds it, and the revision that compare-and-set names."""

    key: str
    value: bytes
    revision: int


class KeyValue(Protocol):
    """A bucket of keys, each written by compare-and-set: NATS KV, or its in-memory twin."""

    async def get(self, key: str) -> Entry | None:
        """The key's latest value; None if it has none (never set, deleted or expired)."""
        ...

    async def create(self, key: str, value: bytes) -> int | None:
        """Set a key that has no value; its revision, or None if it has one already."""
        ...

    async def update(self, key: str, value: bytes, *, revision: int) -> int | None:
        """Set the key if `revision` is still its latest; the new revision, else None."""
        ...

    async def put(self, key: str, value: bytes) -> int:
        """Set the key whatever it holds (one writer's own key): the new revision."""
        ...

    async def delete(self, key: str, *, revision: int | None = None) -> bool:
        """Delete the key (if `revision` is still its latest, when given); False if not."""
        ...

    async def entries(self, prefix: str = "") -> list[Entry]:
        """Every key's latest value, the deleted left out; only keys under `prefix` when
        given (`demand.`: it ends with the dot that separates a key's tokens)."""
        ...


def check_key_prefix(prefix: str) -> None:
    """A key prefix is whole tokens (`demand.`), as a NATS subject filter can name them."""
    if prefix and not prefix.endswith("."):
        msg = f"a key prefix ends with '.', not {prefix!r}"
        raise ValueError(msg)


class BucketMissingError(RuntimeError):
    """A key-value bucket its writer has not declared yet: it is declared at that writer's
    start."""


class Buckets(Protocol):
    """Where key-value buckets are declared and found."""

    async def declare_bucket(
        self, bucket: str, *, history: int = 1, ttl_s: float | None = None
    ) -> KeyValue:
        """A key-value bucket, declared by its writer at start (idempotent), with as many
        copies as the bus keeps of its stream; a key's value expires `ttl_s` after its
        write when given."""
        ...

    def bucket(self, bucket: str) -> KeyValue:
        """A bucket another process declares: it reads as empty, and its writes raise
        `BucketMissingError`, until then (a reader may start before its writer)."""
        ...


@dataclass(frozen=True)
class StoredObject:
    """What an object store says of one object: its name, size and a word of its own."""

    name: str
    size: int
    description: str | None = None


class ObjectStore(Protocol):
    """Named blobs too big for a key's value (a job's workspace): NATS's object store, or
    its in-memory twin."""

    async def put(self, name: str, data: bytes, *, description: str | None = None) -> None:
        """Store the object under `name`, in place of any before it."""
        ...

    async def get(self, name: str) -> bytes | None:
        """The object's bytes; None if there is none of that name."""
        ...

    async def has(self, name: str) -> bool: ...

    async def delete(self, name: str) -> bool:
        """Delete the object; False if there was none."""
        ...

    async def list(self) -> list[StoredObject]:
        """Every object stored, the deleted left out."""
        ...


class ObjectStoreMissingError(RuntimeError):
    """An object store its writer has not declared yet: it is declared at that writer's start."""


class Stores(Protocol):
    """Where object stores are declared and found."""

    async def declare_store(self, store: str, *, ttl_s: float | None = None) -> ObjectStore:
        """The store, declared by its writer at start (idempotent), with as many copies as
        the bus keeps of its stream; an object expires `ttl_s` after its write when given."""
        ...

    def store(self, store: str) -> ObjectStore:
        """A store another process declares: reads find nothing and writes raise
        `ObjectStoreMissingError` until then."""
        ...


class EventPublisher(Protocol):
    async def publish(self, event: Event[Any]) -> PublishAck:
        """Store one event on its subject.

        Idempotent by event id within the de-duplication window. Retries through a server
        restart until the bus's publish timeout; raises only when the bus stays unreachable.
        """
        ...


class EventBus(EventPublisher, Buckets, Stores, Protocol):
    @property
    def prefix(self) -> str: ...

    async def close(self) -> None:
        """Flush what is buffered and close; in-flight handlers must have finished."""
        ...

    async def publish_many(self, events: Sequence[Event[Any]]) -> list[PublishAck]:
        """Publish a batch, pipelined; same guarantees as `publish` for each event."""
        ...

    async def publish_raw(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> PublishAck:
        """Store bytes as they are: for outside tools, and for tests of bad input."""
        ...

    async def consume(self, subscription: Subscription, stop: asyncio.Event) -> None:
        """Deliver the subscription's events to its handlers until `stop` is set.

        At least once: a message is acked only after its handler returned; a failing handler
        is retried with backoff, then dead-lettered with the reason, as is a message that can
        never be valid. Returns after the in-flight handlers have finished.
        """
        ...

    async def read(self, subject: str, *, after_seq: int = 0) -> list[StoredMessage]:
        """Every stored message on `subject` (wildcards allowed), oldest first; only what
        the stream stored after the sequence `after_seq` when given."""
        ...

    def follow(
        self, subjects: Sequence[str], stop: asyncio.Event, *, since: datetime | None = None
    ) -> AsyncGenerator[StreamRecord, None]:
        """The messages on `subjects` as the stream stores them (from `since` when given,
        else from now on), oldest first, until `stop` is set: what a service reads beside
        its consumers, and never acknowledges."""
        ...

    async def listen(self, subject: str, on_message: OnMessage) -> Listening:
        """Hear the messages stored on `subject` (wildcards allowed) from now on, as they
        are stored, until `stop` is called on what this returns: for a client that waits
        for an answer. At most once: a service consumes or follows instead."""
        ...

    async def request(self, subject: str, data: bytes, *, timeout_s: float) -> bytes:
        """Ask whoever answers on `subject` and wait for the answer: `NoAnswerError` when
        nobody answers there, `TimeoutError` when the answer does not come in time."""
        ...

    async def serve(self, subject: str, on_ask: OnAsk, *, group: str) -> Listening:
        """Take the requests sent to `subject` (wildcards allowed): each is taken by one
        member of `group` (the replicas of a service), not stored, never redelivered."""
        ...

    async def answer(self, asked: Asked, data: bytes) -> None:
        """Answer a request on its reply subject (nothing where it has none)."""
        ...
