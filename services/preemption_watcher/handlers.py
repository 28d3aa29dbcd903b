"""The watcher's work: relay each source's signals onto the bus as `node.preempting` and
`node.lost`; the SUBSCRIPTIONS table at the bottom says which bus events it follows."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog
from prometheus_client import Counter

from services.preemption_watcher.model import NodeSignal
from services.preemption_watcher.ports import SignalSource
from shared.clock import Clock
from shared.events import Event, EventData, new_event
from shared.events.data import NodeJoined, NodeLost, NodePreempting
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "preemption_watcher"
log = structlog.get_logger()

SIGNALS = Counter(
    "spotrain_node_signals_total",
    "Node signals relayed onto the bus, by source and signal (preempting, lost).",
    ["source", "signal"],
)


def declare_sources(names: Iterable[str]) -> None:
    """Each source's signals from 0 at start: "none yet" reads as 0, not as no series."""
    for name in names:
        for signal in (NodePreempting.event, NodeLost.event):
            SIGNALS.labels(name, signal)


_REMEMBERED = 10_000
"""Signal keys kept to drop repeats older than the bus's de-duplication window."""


@dataclass
class Deps:
    bus: EventPublisher
    clock: Clock
    relayed: OrderedDict[str, None] = field(default_factory=OrderedDict)


async def relay(source: SignalSource, deps: Deps, stop: asyncio.Event) -> None:
    """Publish every signal of `source` until `stop`; the runtime restarts it if it fails."""
    async with contextlib.aclosing(source.signals(stop)) as signals:
        async for signal in signals:
            await publish_signal(signal, deps, source=source.name)


async def publish_signal(signal: NodeSignal, deps: Deps, *, source: str) -> None:
    data = signal.data
    if signal.event_id in deps.relayed:
        log.debug("node.signal_repeated", node=data.node, key=signal.key)
        return
    await deps.bus.publish(
        new_event(
            data, source=f"{SERVICE}/{source}", time=deps.clock.now(), event_id=signal.event_id
        )
    )
    deps.relayed[signal.event_id] = None
    SIGNALS.labels(source, data.event).inc()
    while len(deps.relayed) > _REMEMBERED:
        deps.relayed.popitem(last=False)
    log.info(f"node.{data.event}", node=data.node, pool=data.pool, source=data.source.value)


async def on_node_joined(event: Event[NodeJoined], deps: Deps) -> None:
    node = event.data
    log.info("node.watching", node=node.node, pool=node.pool, capacity=node.capacity.value)


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    NodeJoined: on_node_joined,
}
