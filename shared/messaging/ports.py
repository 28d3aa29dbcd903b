"""The bus as every service and client sees it, whatever carries it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


class EventPublisher(Protocol):
    async def publish(self, event: Event[Any]) -> PublishAck:
        """Store one event on its subject.

        Idempotent by event id within the de-duplication window. Retries through a server
        restart until the bus's publish timeout; raises only when the bus stays unreachable.
        """
        ...


class EventBus(EventPublisher, Protocol):
    @property
    def prefix(self) -> str: ...

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

    async def read(self, subject: str) -> list[StoredMessage]:
        """Every stored message on `subject` (wildcards allowed), oldest first."""
        ...


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

    async def delete(self, key: str, *, revision: int | None = None) -> bool:
        """Delete the key (if `revision` is still its latest, when given); False if not."""
        ...

    async def entries(self) -> list[Entry]:
        """Every key's latest value, the deleted left out."""
        ...
