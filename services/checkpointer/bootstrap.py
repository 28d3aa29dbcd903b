"""The only place that names the checkpointer's concrete adapters."""

from __future__ import annotations

from contextlib import AsyncExitStack

from services.checkpointer import metrics
from services.checkpointer.adapters.checkpoint_store import StorageCheckpoints
from services.checkpointer.adapters.ray_gcs import RayGcsNodes
from services.checkpointer.handlers import SERVICE, SUBSCRIPTIONS, Deps, review_moves
from services.checkpointer.settings import CheckpointerSettings
from shared.clock import SystemClock
from shared.jobs import JobsBucket, jobs_bucket
from shared.messaging import EventBus, Subscription, bind_routes
from shared.pools import PoolsBucket, pools_bucket
from shared.runtime import ServiceDefinition, Ticker


async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
    settings = CheckpointerSettings()
    metrics.declare()
    deps = Deps(
        bus=bus,
        clock=SystemClock(),
        jobs=JobsBucket(bus.bucket(jobs_bucket(bus.prefix))),
        checkpoints=StorageCheckpoints(),
        ray=RayGcsNodes(settings.ray_gcs_address),
        config=settings.recovery_config(),
        pools=PoolsBucket(bus.bucket(pools_bucket(bus.prefix))),
        moves=settings.move_config(),
    )

    async def review() -> None:
        await review_moves(deps)

    return ServiceDefinition(
        name=SERVICE,
        subscriptions=[Subscription(service=SERVICE, routes=bind_routes(SUBSCRIPTIONS, deps))],
        tickers=[
            Ticker(
                name="moves",
                interval_s=settings.move_review_interval_s,
                tick=review,
                leader_only=True,  # a move asked for once
            )
        ],
    )
