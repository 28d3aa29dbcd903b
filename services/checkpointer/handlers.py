"""The checkpointer's reactions to events; the SUBSCRIPTIONS table at the bottom says which.

Until resumption lands, the checkpointer logs the notices and checkpoints it sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from shared.events import Event, EventData
from shared.events.data import JobCheckpointed, NodeLost, NodePreempting
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "checkpointer"
log = structlog.get_logger()


@dataclass(frozen=True)
class Deps:
    bus: EventPublisher


async def on_node_preempting(event: Event[NodePreempting], deps: Deps) -> None:
    notice = event.data
    log.info("node.preempting", node=notice.node, deadline=notice.deadline.isoformat())


async def on_node_lost(event: Event[NodeLost], deps: Deps) -> None:
    log.info("node.lost", node=event.data.node, source=event.data.source.value)


async def on_job_checkpointed(event: Event[JobCheckpointed], deps: Deps) -> None:
    log.info("checkpoint.recorded", step=event.data.step, uri=event.data.uri)


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    NodePreempting: on_node_preempting,
    NodeLost: on_node_lost,
    JobCheckpointed: on_job_checkpointed,
}
