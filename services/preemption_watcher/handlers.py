"""The watcher's reactions to events; the SUBSCRIPTIONS table at the bottom says which.

Until the preemption sources land, the watcher logs the nodes it would watch.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from shared.events import Event, EventData
from shared.events.data import NodeJoined
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "preemption_watcher"
log = structlog.get_logger()


@dataclass(frozen=True)
class Deps:
    bus: EventPublisher


async def on_node_joined(event: Event[NodeJoined], deps: Deps) -> None:
    node = event.data
    log.info("node.watching", node=node.node, pool=node.pool, capacity=node.capacity.value)


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    NodeJoined: on_node_joined,
}
