"""`ShutdownGraces` from the GKE API: each node pool's kubelet configuration
(`NodePool.config.kubeletConfig.shutdownGracePeriodSeconds` and
`shutdownGracePeriodCriticalPodsSeconds`, the node system configuration that gives a Spot
node pool up to 120 s). Needs `container.clusters.get` on the cluster."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

import structlog
from google.api_core.exceptions import GoogleAPIError, NotFound
from google.auth.exceptions import GoogleAuthError
from google.cloud.container_v1 import ClusterManagerClient

from shared.gcp import client_kwargs

log = structlog.get_logger()

CLUSTER = re.compile(r"^projects/[^/]+/locations/[^/]+/clusters/[^/]+$")
CALL_TIMEOUT_S = 15.0
REQUIRED_PERMISSIONS = {"container.clusters.get": "read a node pool's kubelet configuration"}
"""The IAM permissions this adapter's calls take, each with why: the guide's custom role
(docs/deploy-gke.md, step 2; a test holds the two together)."""


class NodePoolGraces:
    """Reads each node pool asked about, once per `refresh_s` (they change only when
    someone updates the node pool, which replaces its nodes anyway)."""

    def __init__(
        self,
        client: ClusterManagerClient,
        cluster: str,
        *,
        clock: Callable[[], float],
        refresh_s: float = 600.0,
    ) -> None:
        if CLUSTER.match(cluster) is None:
            msg = f"not a GKE cluster's name (projects/P/locations/L/clusters/C): {cluster}"
            raise ValueError(msg)
        self._client = client
        self._cluster = cluster
        self._clock = clock
        self._refresh_s = refresh_s
        self._read: dict[str, tuple[float, tuple[int, int] | None]] = {}

    def graces(self, node_pools: Collection[str]) -> dict[str, tuple[int, int]]:
        now = self._clock()
        found: dict[str, tuple[int, int]] = {}
        for node_pool in sorted(set(node_pools)):
            at, grace = self._read.get(node_pool, (float("-inf"), None))
            if now - at >= self._refresh_s:
                grace = self._grace(node_pool)
                self._read[node_pool] = (now, grace)
            if grace is not None:
                found[node_pool] = grace
        return found

    def _grace(self, node_pool: str) -> tuple[int, int] | None:
        name = f"{self._cluster}/nodePools/{node_pool}"
        try:
            read = self._client.get_node_pool(name=name, timeout=CALL_TIMEOUT_S)
        except NotFound:
            return None
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"reading GKE node pool {name}: {error}"
            raise OSError(msg) from error
        kubelet = read.config.kubelet_config
        grace = (
            int(kubelet.shutdown_grace_period_seconds),
            int(kubelet.shutdown_grace_period_critical_pods_seconds),
        )
        log.info("gke.node_pool_grace", node_pool=node_pool, grace_s=grace[0], critical_s=grace[1])
        return grace


def connect_cluster_manager(api_endpoint: str | None = None) -> ClusterManagerClient:
    return ClusterManagerClient(**client_kwargs(api_endpoint))
