"""The only place that names the scaler's concrete adapters."""

from __future__ import annotations

from contextlib import AsyncExitStack

from services.scaler.handlers import SERVICE, SUBSCRIPTIONS, Deps
from shared.messaging import EventBus, Subscription, bind_routes
from shared.runtime import ServiceDefinition


async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
    deps = Deps(bus=bus)
    return ServiceDefinition(
        name=SERVICE,
        subscriptions=[Subscription(service=SERVICE, routes=bind_routes(SUBSCRIPTIONS, deps))],
    )
