"""The only place that names the scaler's concrete adapters."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack

from services.scaler.adapters.kv_demand import KvDemandStore
from services.scaler.adapters.local_ray import LocalPoolProvider
from services.scaler.adapters.ray_cluster import RayClusterObserver
from services.scaler.handlers import SERVICE, SUBSCRIPTIONS, Deps, reconcile
from services.scaler.settings import ScalerSettings
from shared.clock import SystemClock
from shared.localstack.settings import LocalStackSettings
from shared.messaging import EventBus, Subscription, bind_routes
from shared.messaging.jetstream import JetStreamBus
from shared.pools import pools_bucket
from shared.runtime import ServiceDefinition, Ticker


async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
    settings = ScalerSettings()
    if not isinstance(bus, JetStreamBus):
        msg = "the scaler keeps its demand in JetStream; it needs the JetStream bus"
        raise TypeError(msg)
    local = LocalStackSettings(home=settings.local_home)
    bucket = await KvDemandStore.open(bus.client.jetstream(), pools_bucket(bus.prefix))
    deps = Deps(
        bus=bus,
        clock=SystemClock(),
        pools=settings.pools(),
        config=settings.policy_config(),
        provider=LocalPoolProvider(
            gcs_address=settings.ray_gcs_address,
            state_dir=local.node_dir,
            log_dir=local.log_dir,
            env=os.environ,
        ),
        observer=RayClusterObserver(settings.ray_gcs_address),
        demand=bucket,
        status=bucket,
    )

    async def tick() -> None:
        await reconcile(deps)

    return ServiceDefinition(
        name=SERVICE,
        subscriptions=[Subscription(service=SERVICE, routes=bind_routes(SUBSCRIPTIONS, deps))],
        tickers=[Ticker(name="reconcile", interval_s=settings.reconcile_interval_s, tick=tick)],
    )
