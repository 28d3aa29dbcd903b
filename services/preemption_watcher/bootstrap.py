"""The only place that names the preemption_watcher's concrete adapters."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from services.preemption_watcher.handlers import SERVICE, SUBSCRIPTIONS, Deps, relay
from services.preemption_watcher.ports import SignalSource
from services.preemption_watcher.settings import PreemptionWatcherSettings, SourceName
from shared.clock import Clock, SystemClock
from shared.localstack.settings import LocalStackSettings
from shared.messaging import EventBus, Subscription, bind_routes
from shared.runtime import ServiceDefinition, Watch


async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
    settings = PreemptionWatcherSettings()
    clock = SystemClock()
    deps = Deps(bus=bus, clock=clock)
    watches = [_watch(_source(name, settings, clock), deps) for name in settings.sources]
    return ServiceDefinition(
        name=SERVICE,
        subscriptions=[Subscription(service=SERVICE, routes=bind_routes(SUBSCRIPTIONS, deps))],
        watches=watches,
    )


def _watch(source: SignalSource, deps: Deps) -> Watch:
    async def run(stop: asyncio.Event) -> None:
        await relay(source, deps, stop)

    return Watch(name=f"source-{source.name}", run=run)


def _source(name: SourceName, settings: PreemptionWatcherSettings, clock: Clock) -> SignalSource:
    match name:
        case SourceName.LOCAL:
            from services.preemption_watcher.adapters.local import (  # noqa: PLC0415
                LocalNodeSource,
            )

            return LocalNodeSource(
                LocalStackSettings(home=settings.local_home).node_dir,
                clock,
                poll_interval_s=settings.local_poll_interval_s,
            )
        case _:
            msg = f"the {name.value} source is not available in this build"
            raise NotImplementedError(msg)
