"""Putting events back on the bus: an import of JSON lines, the copies of a replay. Both
publish with message ids, so doing it again within the duplicate window stores nothing new."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.events import subject_of
from shared.messaging import EventBus, PublishAck
from shared.messaging.dead_letters import MSG_ID
from shared.replay.jsonl import ParsedLine
from shared.replay.plan import ReplayPlan

_IN_FLIGHT = 64
"""Publishes awaiting their ack at once: pipelined, without flooding a slow server."""


@dataclass(frozen=True)
class ImportReport:
    stored: int
    duplicates: int
    """Already on the stream within the duplicate window (an import done twice)."""


async def import_lines(bus: EventBus, lines: Sequence[ParsedLine]) -> ImportReport:
    """Publish each event's bytes as they were on the line, on its catalog subject, with
    its own id as the message id."""
    acks = await _publish_all(
        bus,
        [
            (subject_of(line.event.data, bus.prefix), line.raw, {MSG_ID: line.event.id})
            for line in lines
        ],
    )
    duplicates = sum(ack.duplicate for ack in acks)
    return ImportReport(stored=len(acks) - duplicates, duplicates=duplicates)


async def publish_copies(bus: EventBus, plan: ReplayPlan) -> int:
    """Publish a replay's copies, oldest first; returns how many the stream stored."""
    acks = await _publish_all(bus, [(c.subject, c.data, c.headers) for c in plan.copies])
    return sum(not ack.duplicate for ack in acks)


async def _publish_all(
    bus: EventBus, messages: Sequence[tuple[str, bytes, Mapping[str, str]]]
) -> list[PublishAck]:
    acks: list[PublishAck] = []
    for start in range(0, len(messages), _IN_FLIGHT):
        chunk = messages[start : start + _IN_FLIGHT]
        acks += await asyncio.gather(*(bus.publish_raw(*message) for message in chunk))
    return acks
