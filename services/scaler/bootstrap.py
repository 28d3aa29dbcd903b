"""The only place that names the scaler's concrete adapters."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from contextlib import AsyncExitStack

from services.scaler import metrics
from services.scaler.adapters.cost_feed import StreamCostFeed
from services.scaler.adapters.kv_demand import KvDemandStore
from services.scaler.adapters.local_ray import LocalPoolProvider
from services.scaler.adapters.node_history import BusNodeHistory
from services.scaler.adapters.ray_cluster import RayClusterObserver
from services.scaler.handlers import (
    SERVICE,
    SUBSCRIPTIONS,
    Deps,
    follow_costs,
    measure_costs,
    reconcile,
)
from services.scaler.model import PoolSpec
from services.scaler.ports import CapacityAdvisor, PoolProvider
from services.scaler.settings import ScalerSettings
from shared.clock import SystemClock
from shared.events.types import CapacityClass
from shared.localstack.confinement import confinement_for
from shared.localstack.market import (
    MARKET_FILE,
    LocalMarket,
    MarketConfig,
    load_markets,
    market_retry_s,
)
from shared.localstack.settings import LocalStackSettings
from shared.messaging import EventBus, Subscription, bind_routes
from shared.pools import pools_bucket
from shared.runtime import ServiceDefinition, Ticker, Watch
from shared.runtime.leadership import Leadership


async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
    settings = ScalerSettings()
    bucket = await KvDemandStore.open(bus, pools_bucket(bus.prefix))
    markets: dict[str, LocalMarket] = {}
    if settings.provider == "local":
        local = LocalStackSettings(home=settings.local_home)
        markets = _local_markets(local, {p.name: p for p in settings.pools()})
    config = settings.policy_config()
    retry_s = market_retry_s(config.capacity_retry_after_s, markets)
    leadership = Leadership()
    deps = Deps(
        leading=leadership.leading,
        fenced=leadership.fenced,
        bus=bus,
        clock=SystemClock(),
        pools=settings.pools(),
        config=config.model_copy(update={"capacity_retry_after_s": retry_s}),
        provider=_provider(settings, stack, markets),
        observer=RayClusterObserver(settings.ray_gcs_address),
        demand=bucket,
        status=bucket,
        history=BusNodeHistory(bus),
        pass_interval_s=settings.reconcile_interval_s,
    )
    if settings.reads_advice() and isinstance(deps.provider, CapacityAdvisor):
        deps.advisor = deps.provider

    metrics.declare_pools(deps.pools)
    feed = StreamCostFeed(bus)

    async def tick() -> None:
        await reconcile(deps)

    async def measure() -> None:
        await measure_costs(deps)

    async def follow(stop: asyncio.Event) -> None:
        await follow_costs(feed, deps, stop)

    return ServiceDefinition(
        leadership=leadership,
        name=SERVICE,
        subscriptions=[Subscription(service=SERVICE, routes=bind_routes(SUBSCRIPTIONS, deps))],
        tickers=[
            # Resizes happen once: by the replica that holds the scaler's lease.
            Ticker(
                name="reconcile",
                interval_s=settings.reconcile_interval_s,
                tick=tick,
                leader_only=True,
            ),
            Ticker(
                name="cost-meter",
                interval_s=settings.cost_meter_interval_s,
                tick=measure,
                leader_only=True,
            ),
        ],
        watches=[Watch(name="cost-events", run=follow)],
    )


def _provider(
    settings: ScalerSettings, stack: AsyncExitStack, markets: Mapping[str, LocalMarket]
) -> PoolProvider:
    if settings.provider == "gke":
        # Imported here: the Google and Kubernetes clients come with the `cloud` extra only.
        from services.scaler.adapters.gke import (  # noqa: PLC0415
            ClusterRef,
            ComputeOperationRecords,
            GkePoolProvider,
            KubernetesNodeDirectory,
            connect_advice,
            connect_cluster_manager,
            connect_compute_operations,
            connect_instance_groups,
        )

        # ScalerSettings refuses the gke provider without these.
        assert settings.gke_project is not None
        assert settings.gke_location is not None
        assert settings.gke_cluster is not None
        gke = GkePoolProvider(
            client=connect_cluster_manager(settings.gke_api_endpoint),
            groups=connect_instance_groups(settings.gke_compute_api_endpoint),
            cluster=ClusterRef(
                project=settings.gke_project,
                location=settings.gke_location,
                cluster=settings.gke_cluster,
            ),
            node_pools=settings.gke_node_pools,
            zones={pool.name: pool.zone for pool in settings.pools()},
            directory=KubernetesNodeDirectory(),
            clock=SystemClock(),
            records=ComputeOperationRecords(
                connect_compute_operations(settings.gke_compute_api_endpoint),
                settings.gke_project,
            ),
            advisor=connect_advice(settings.gke_compute_api_endpoint)
            if settings.reads_advice()
            else None,
        )
        gke.check()  # a pool it cannot resize stops the scaler at start, saying why
        return gke
    if settings.provider == "kuberay":
        # Imported here: the Kubernetes client comes with the `cloud` extra only.
        from services.scaler.adapters.kuberay import (  # noqa: PLC0415
            KubeRayPoolProvider,
            connect_kubernetes,
        )

        # ScalerSettings refuses the kuberay provider without these.
        assert settings.kuberay_cluster is not None
        assert settings.kuberay_namespace is not None
        api = connect_kubernetes(settings.kuberay_api_endpoint)
        stack.callback(api.close)
        return KubeRayPoolProvider(
            api=api, cluster=settings.kuberay_cluster, namespace=settings.kuberay_namespace
        )
    local = LocalStackSettings(home=settings.local_home)
    return LocalPoolProvider(
        markets=markets,
        gcs_address=settings.ray_gcs_address,
        state_dir=local.node_dir,
        log_dir=local.log_dir,
        env=os.environ,
        head_temp_dir=local.ray_temp_dir,
        confinement=confinement_for(local, os.environ),
    )


def _local_markets(
    local: LocalStackSettings, pools: Mapping[str, PoolSpec]
) -> dict[str, LocalMarket]:
    """The spot markets `spotrain up --spot-market` set; none without it."""
    path = local.run_dir / MARKET_FILE
    if not path.exists():
        return {}
    markets = load_markets(MarketConfig.model_validate_json(path.read_text()))
    for name in markets:
        pool = pools.get(name)
        if pool is None or pool.capacity is not CapacityClass.SPOT:
            msg = f"{path}: {name} is not a spot pool of the pools file"
            raise ValueError(msg)
    return markets
