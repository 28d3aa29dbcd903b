"""`NodeEventHistory` on the bus: the stored node lifetime events, read once at start."""

from __future__ import annotations

from typing import Any

import structlog

from shared.events import Event, decode, subjects_for
from shared.events.data import NodeLaunched, NodeLost, NodeReleased
from shared.messaging import EventBus

log = structlog.get_logger()

NODE_LIFETIME_EVENTS = (NodeLaunched, NodeReleased, NodeLost)


class BusNodeHistory:
    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    async def node_events(self) -> list[Event[Any]]:
        stored = []
        for subject in subjects_for(NODE_LIFETIME_EVENTS, self._bus.prefix):
            stored += await self._bus.read(subject)
        events = []
        for message in sorted(stored, key=lambda m: m.seq):
            try:
                events.append(decode(message.data))
            except ValueError as error:
                # Its consumers dead-lettered it, and said so; it opens or closes nothing.
                log.debug("node_history.event_unreadable", seq=message.seq, error=str(error))
        return events
