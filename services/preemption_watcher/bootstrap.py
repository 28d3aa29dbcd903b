"""The only place that names the preemption_watcher's concrete adapters."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from datetime import timedelta

from services.preemption_watcher.handlers import (
    SERVICE,
    SUBSCRIPTIONS,
    Deps,
    declare_sources,
    relay,
)
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
    sources = [_source(name, settings, clock, stack) for name in settings.sources]
    declare_sources(source.name for source in sources)
    watches = [_watch(source, deps) for source in sources]
    return ServiceDefinition(
        name=SERVICE,
        subscriptions=[Subscription(service=SERVICE, routes=bind_routes(SUBSCRIPTIONS, deps))],
        watches=watches,
    )


def _watch(source: SignalSource, deps: Deps) -> Watch:
    async def run(stop: asyncio.Event) -> None:
        await relay(source, deps, stop)

    # One replica follows each source: a notice is said once.
    return Watch(name=f"source-{source.name}", run=run, leader_only=True)


def _source(
    name: SourceName, settings: PreemptionWatcherSettings, clock: Clock, stack: AsyncExitStack
) -> SignalSource:
    # Each source's client library is imported only when the source is chosen: the Google
    # and Kubernetes clients come with the `cloud` extra.
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
        case SourceName.GCE_PUBSUB:
            from services.preemption_watcher.adapters.gce_pubsub import (  # noqa: PLC0415
                PubSubNoticeSource,
                connect_subscriber,
            )

            # The settings refuse this source without a subscription.
            assert settings.pubsub_subscription is not None
            client = stack.enter_context(connect_subscriber(settings.pubsub_endpoint))
            return PubSubNoticeSource(
                client,
                settings.pubsub_subscription,
                notice=timedelta(seconds=settings.pubsub_notice_s),
            )
        case SourceName.K8S:
            from services.preemption_watcher.adapters.k8s_nodes import (  # noqa: PLC0415
                KubernetesNodeSource,
                kubernetes_api_client,
            )
            from services.preemption_watcher.payloads.k8s_nodes import (  # noqa: PLC0415
                NodeRules,
            )

            api_client = kubernetes_api_client(settings.k8s_kubeconfig)
            stack.callback(api_client.close)
            graces = None
            if settings.k8s_gke_cluster is not None:
                from services.preemption_watcher.adapters.gke_node_pools import (  # noqa: PLC0415
                    NodePoolGraces,
                    connect_cluster_manager,
                )

                graces = NodePoolGraces(
                    connect_cluster_manager(settings.gke_api_endpoint),
                    settings.k8s_gke_cluster,
                    clock=time.monotonic,
                )
            return KubernetesNodeSource.over(
                api_client,
                clock,
                rules=NodeRules(pool_label=settings.k8s_pool_label),
                graces=graces,
                watch_timeout_s=settings.k8s_watch_timeout_s,
            )
