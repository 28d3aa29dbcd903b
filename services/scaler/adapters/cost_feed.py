"""The cost meter's feed: the stream's stored cost events, then each new one as it lands."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from shared.events import Event, aggregate_subject, decode, subject_for, subject_matches
from shared.messaging import EventBus
from shared.policy.cost import COST_EVENTS

log = structlog.get_logger()

_BEFORE_ANY_EVENT = datetime(2000, 1, 1, tzinfo=UTC)


class StreamCostFeed:
    """One reading consumer per aggregate (`job`, `node`), filtered to a single subject:
    what a reader's NATS permissions allow, and the server starts a single-subject consumer
    by time exactly. Job progress, the bulk of the `job` events, is skipped undecoded."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    async def follow(self, stop: asyncio.Event, add: Callable[[Event[Any]], None]) -> None:
        prefix = self._bus.prefix
        # A request's subject ends in its sender's name: matched as a pattern, not by name.
        wanted = frozenset(subject_for(model, prefix) for model in COST_EVENTS)
        aggregates = sorted({aggregate_subject(model, prefix) for model in COST_EVENTS})
        async with asyncio.TaskGroup() as group:
            for aggregate in aggregates:
                group.create_task(self._follow(aggregate, wanted, stop, add))

    async def _follow(
        self,
        aggregate: str,
        wanted: frozenset[str],
        stop: asyncio.Event,
        add: Callable[[Event[Any]], None],
    ) -> None:
        follow = self._bus.follow([aggregate], stop, since=_BEFORE_ANY_EVENT)
        async with contextlib.aclosing(follow) as records:
            async for record in records:
                if not any(subject_matches(pattern, record.subject) for pattern in wanted):
                    continue
                try:
                    add(decode(record.data))
                except ValueError as error:
                    # Its consumers dead-lettered it, and said so; it bills nothing.
                    log.debug("cost.event_unreadable", seq=record.seq, error=str(error))
