"""`PoolProvider` on GKE: node pools resized with the container API's `setSize`, their
nodes read from Kubernetes. GKE sizes a node pool per zone and picks which VM goes."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

import structlog
from google.api_core.client_options import ClientOptions
from google.api_core.exceptions import GoogleAPIError, NotFound
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import GoogleAuthError
from google.cloud.compute_v1 import GlobalOperationsClient
from google.cloud.container_v1 import ClusterManagerClient, NodePool

from services.scaler.model import PoolSpec, StoppedNode
from services.scaler.ports import ProvidedNode
from shared.clock import Clock
from shared.cost.node_ends import NodeEnd
from shared.events.data import NodeEndSource

NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
"""The label GKE puts on every Kubernetes node with the name of its node pool."""
PENDING = "pending"
"""Placeholder nodes are named `<gke-pool>-pending-<i>`: asked for, not yet registered."""
CALL_TIMEOUT_S = 30.0

log = structlog.get_logger()
T = TypeVar("T")


class GkeError(OSError):
    """A GKE or Kubernetes call failed, or a pool may not be resized; the message says why.

    An `OSError`, so the scaler reports `pool.resize_failed` and tries again next pass.
    """


class NodePoolNotFoundError(GkeError):
    """The mapped GKE node pool (or its cluster) does not exist."""


class NodePoolAutoscaledError(GkeError):
    """The node pool has GKE autoscaling on: its size belongs to the cluster autoscaler."""


def per_zone_count(current_total: int, delta: int, zones: int, max_total: int) -> int:
    """The `setSize` node count, which GKE applies to each of the pool's `zones` zones.

    Asks for `current_total + delta` nodes rounded UP to a whole number per zone, so a
    launch gets at least what it asked and a release never removes more than it asked;
    capped so `per_zone * zones` never exceeds `max_total`; never below zero.
    Pure: no I/O, no side effects.
    """
    if zones < 1:
        msg = f"a node pool has at least one zone, not {zones}"
        raise ValueError(msg)
    wanted = max(0, current_total + delta)
    return max(0, min(math.ceil(wanted / zones), max_total // zones))


@dataclass(frozen=True)
class KubeNode:
    name: str
    created_at: datetime


class NodeDirectory(Protocol):
    """The registered Kubernetes nodes of one GKE node pool (by `NODE_POOL_LABEL`).

    Synchronous (the provider calls it in a thread); errors are `OSError`s.
    """

    def nodes(self, gke_pool: str) -> list[KubeNode]: ...


class KubernetesNodeDirectory:
    """`NodeDirectory` through the Kubernetes API: in-cluster config, else ~/.kube/config."""

    def __init__(self) -> None:
        # Imported here: only a deployment on GKE needs the Kubernetes client.
        from kubernetes import client, config  # noqa: PLC0415

        # The kubernetes package leaves its config loaders unannotated.
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        self._api = client.CoreV1Api()

    def nodes(self, gke_pool: str) -> list[KubeNode]:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
        from urllib3.exceptions import HTTPError  # noqa: PLC0415

        try:
            listed = self._api.list_node(label_selector=f"{NODE_POOL_LABEL}={gke_pool}")
        except (ApiException, HTTPError) as error:
            msg = f"listing the nodes of GKE node pool {gke_pool}: {error}"
            raise GkeError(msg) from error
        return [
            KubeNode(name=meta.name, created_at=meta.creation_timestamp)
            for meta in (n.metadata for n in listed.items)
            if meta is not None and meta.name and meta.creation_timestamp is not None
        ]


class InstanceRecords(Protocol):
    """When VMs stopped, as the cloud recorded it. Synchronous (the provider calls it in a
    thread); errors are `OSError`s; a VM it has no record of is left out."""

    def ended(self, names: Collection[str]) -> dict[str, datetime]: ...


class ComputeOperationRecords:
    """`InstanceRecords` from Compute Engine's operations: a spot VM taken back leaves a
    `compute.instances.preempted` operation, a deleted one (GKE shrinking its group, or by
    hand) a `delete`, each with its `endTime`; the first of them is the VM's end.

    Compute Engine keeps operations for a limited time (weeks, not months): a VM gone
    before that has no record here, and the scaler falls back on its last sighting.
    """

    FILTER = '(operationType = "compute.instances.preempted") OR (operationType = "delete")'

    def __init__(self, client: GlobalOperationsClient, project: str) -> None:
        self._client = client
        self._project = project

    def ended(self, names: Collection[str]) -> dict[str, datetime]:
        wanted = set(names)
        ends: dict[str, datetime] = {}
        try:
            pages = self._client.aggregated_list(
                request={"project": self._project, "filter": self.FILTER},
                timeout=CALL_TIMEOUT_S,
            )
            for _zone, scoped in pages:
                for operation in scoped.operations:
                    name = operation.target_link.rsplit("/", 1)[-1]
                    if name in wanted and operation.status.name == "DONE" and operation.end_time:
                        at = datetime.fromisoformat(operation.end_time)
                        ends[name] = min(ends.get(name, at), at)
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"reading the Compute operations of project {self._project}: {error}"
            raise GkeError(msg) from error
        return ends


def connect_compute_operations(api_endpoint: str | None = None) -> GlobalOperationsClient:
    """As `connect_cluster_manager`, for the Compute API's operations."""
    if api_endpoint is None:
        return GlobalOperationsClient(transport="rest")
    plain_http = api_endpoint.startswith("http://")
    credentials = AnonymousCredentials() if plain_http else None  # type: ignore[no-untyped-call]
    return GlobalOperationsClient(
        credentials=credentials,
        transport="rest",
        client_options=ClientOptions(api_endpoint=api_endpoint),
    )


@dataclass(frozen=True)
class ClusterRef:
    project: str
    location: str
    """A region (regional cluster) or a zone (zonal cluster)."""
    cluster: str

    def node_pool(self, gke_pool: str) -> str:
        return (
            f"projects/{self.project}/locations/{self.location}"
            f"/clusters/{self.cluster}/nodePools/{gke_pool}"
        )


@dataclass
class _Pool:
    """What this provider knows of one GKE node pool beyond what Kubernetes shows."""

    wanted: int | None = None
    """The total it last set (per-zone count x zones); None until it resizes the pool."""
    wanted_at: datetime | None = None
    releasing: set[str] = field(default_factory=set)
    """Nodes asked to go whose decrement waits for a whole per-zone step."""
    spent: set[str] = field(default_factory=set)
    """Nodes already counted in a decrement; ignored until Kubernetes no longer lists them."""


class GkePoolProvider:
    """Resizes GKE node pools; each spotrain pool maps to one GKE node pool.

    Semantics, and how they differ from the local provider:
    - `nodes()` lists the Kubernetes nodes labelled with the GKE node pool: real node
      names, as the Ray pods on them report (the KubeRay worker group must label its Ray
      node `spotrain-node=<Kubernetes node name>` for the scaler to match them). The
      container API does not report a pool's current size, so after a resize this
      provider pads the list with placeholders `<gke-pool>-pending-<i>` up to the size it
      set, until the VMs register; a launched node thus shows at once, as the port says.
    - `launch()` reads the node pool first and refuses (`NodePoolAutoscaledError`) a pool with
      GKE autoscaling on: its size is the cluster autoscaler's, and resizing it would fight
      the autoscaler's bounds. Otherwise it calls `setSize`, whose count is PER ZONE: the
      new total is rounded up to a whole number per zone (3 zones, 3 nodes, launch 2 →
      2 per zone, 6 nodes) and capped at the pool's `max_nodes`. It does not wait for the
      long-running operation; its name is logged.
    - `release(node)` cannot choose the VM: `setSize` removes whichever VMs GKE picks. It
      counts the node as released and shrinks the pool once a whole per-zone step is
      released (one node in a one-zone pool, three in a three-zone pool). A counted node is
      not counted again while Kubernetes still lists it. Deleting the very VM would take
      the Compute API's `instanceGroupManagers.deleteInstances` on the node's group.
    - What this provider set lives in memory: after a restart it starts from the nodes
      Kubernetes lists.
    - `ended(nodes)` reads Compute Engine's record of when each VM stopped (its
      preemption or deletion operation), through `records` when given.
    - Errors from Google or Kubernetes leave as `GkeError` (an `OSError`).
    """

    def __init__(
        self,
        *,
        client: ClusterManagerClient,
        cluster: ClusterRef,
        node_pools: Mapping[str, str],
        directory: NodeDirectory,
        clock: Clock,
        records: InstanceRecords | None = None,
    ) -> None:
        self._records = records
        self._client = client
        self._cluster = cluster
        self._node_pools = dict(node_pools)
        self._directory = directory
        self._clock = clock
        self._pools: dict[str, _Pool] = {gke: _Pool() for gke in self._node_pools.values()}

    async def nodes(self) -> list[ProvidedNode]:
        return await asyncio.to_thread(self._nodes)

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        return await asyncio.to_thread(self._launch, pool, count)

    async def release(self, node: str) -> None:
        await asyncio.to_thread(self._release, node)

    async def ended(self, nodes: Collection[str]) -> dict[str, NodeEnd]:
        """Compute Engine's record of each VM's end (see `ComputeOperationRecords`), when
        this provider has one to read; GKE nodes are the VMs of the same name."""
        if self._records is None or not nodes:
            return {}
        ends = await asyncio.to_thread(self._records.ended, nodes)
        return {name: NodeEnd(at, NodeEndSource.RECORDED) for name, at in ends.items()}

    async def stopped(self) -> list[StoppedNode]:
        """Not read yet: a VM that registers and goes while no scaler watches is not
        billed. Compute Engine keeps its `insert` operation too, but which pool an unlisted
        VM was in would have to come from its instance group's name (see issue 20)."""
        return []

    def _nodes(self) -> list[ProvidedNode]:
        provided = []
        for pool, gke_pool in self._node_pools.items():
            provided += [
                ProvidedNode(name=name, pool=pool, launched_at=at)
                for name, at in self._listed(gke_pool)
            ]
        return provided

    def _listed(self, gke_pool: str) -> list[tuple[str, datetime]]:
        """The pool's registered nodes, padded with placeholders up to the size last set."""
        state = self._pools[gke_pool]
        registered = self._directory.nodes(gke_pool)
        names = {n.name for n in registered}
        state.spent &= names
        listed = [(n.name, n.created_at) for n in registered]
        if state.wanted is not None and state.wanted_at is not None:
            listed += [
                (_placeholder(gke_pool, i), state.wanted_at)
                for i in range(len(registered), state.wanted)
            ]
        live = {name for name, _ in listed}
        state.releasing &= live
        return listed

    def _launch(self, pool: PoolSpec, count: int) -> list[str]:
        gke_pool = self._gke_pool(pool.name)
        zones = self._zones_of_resizable(gke_pool)
        before = self._listed(gke_pool)
        current = self._current(gke_pool, len(before))
        per_zone = per_zone_count(current, count, zones, pool.max_nodes)
        if per_zone * zones <= current:
            log.warning(
                "gke.launch_capped",
                gke_pool=gke_pool,
                current=current,
                asked=count,
                max_nodes=pool.max_nodes,
                zones=zones,
            )
            return []
        self._set_size(gke_pool, per_zone, zones, reason="launch")
        return [name for name, _ in self._listed(gke_pool)[len(before) :]]

    def _release(self, node: str) -> None:
        gke_pool, listed = self._find(node)
        if gke_pool is None:
            return  # already gone
        state = self._pools[gke_pool]
        if node in state.spent or node in state.releasing:
            return
        zones = self._zones_of_resizable(gke_pool)
        current = self._current(gke_pool, len(listed))
        state.releasing.add(node)
        per_zone = per_zone_count(current, -len(state.releasing), zones, current)
        if per_zone * zones >= current:
            log.info(
                "gke.release_deferred",
                gke_pool=gke_pool,
                node=node,
                releasing=len(state.releasing),
                zones=zones,
            )
            return
        self._set_size(gke_pool, per_zone, zones, reason="release")
        state.spent |= state.releasing
        state.releasing.clear()

    def _gke_pool(self, pool: str) -> str:
        try:
            return self._node_pools[pool]
        except KeyError:
            msg = f"no GKE node pool is mapped to pool {pool!r}"
            raise GkeError(msg) from None

    def _find(self, node: str) -> tuple[str | None, list[tuple[str, datetime]]]:
        for gke_pool in self._node_pools.values():
            listed = self._listed(gke_pool)
            if any(name == node for name, _ in listed):
                return gke_pool, listed
        return None, []

    def _current(self, gke_pool: str, listed: int) -> int:
        """The size last set, which Kubernetes lags behind; what it lists when none was."""
        wanted = self._pools[gke_pool].wanted
        return listed if wanted is None else wanted

    def _zones_of_resizable(self, gke_pool: str) -> int:
        """Reads the node pool; its zone count, or an error if it is not ours to resize."""
        name = self._cluster.node_pool(gke_pool)
        node_pool: NodePool = self._call(
            f"reading GKE node pool {name}",
            lambda: self._client.get_node_pool(name=name, timeout=CALL_TIMEOUT_S),
        )
        if node_pool.autoscaling.enabled:
            bounds = node_pool.autoscaling
            msg = (
                f"GKE node pool {gke_pool} has autoscaling on "
                f"(min {bounds.min_node_count}, max {bounds.max_node_count} per zone): "
                "the cluster autoscaler owns its size, spotrain does not resize it"
            )
            raise NodePoolAutoscaledError(msg)
        return max(1, len(node_pool.locations))

    def _set_size(self, gke_pool: str, per_zone: int, zones: int, *, reason: str) -> None:
        name = self._cluster.node_pool(gke_pool)
        operation = self._call(
            f"resizing GKE node pool {name} to {per_zone} per zone",
            lambda: self._client.set_node_pool_size(
                request={"name": name, "node_count": per_zone}, timeout=CALL_TIMEOUT_S
            ),
        )
        state = self._pools[gke_pool]
        state.wanted = per_zone * zones
        state.wanted_at = self._clock.now()
        log.info(
            "gke.resize",
            gke_pool=gke_pool,
            per_zone=per_zone,
            zones=zones,
            total=state.wanted,
            reason=reason,
            operation=operation.name,
        )

    @staticmethod
    def _call(what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except NotFound as error:
            msg = f"{what}: not found ({error.message})"
            raise NodePoolNotFoundError(msg) from error
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"{what}: {error}"
            raise GkeError(msg) from error


def _placeholder(gke_pool: str, index: int) -> str:
    return f"{gke_pool}-{PENDING}-{index}"


def connect_cluster_manager(api_endpoint: str | None = None) -> ClusterManagerClient:
    """A REST client with application default credentials; an `http://` endpoint (a local
    fake or emulator) gets anonymous ones, so no real credential travels unencrypted."""
    if api_endpoint is None:
        return ClusterManagerClient(transport="rest")
    plain_http = api_endpoint.startswith("http://")
    credentials = AnonymousCredentials() if plain_http else None  # type: ignore[no-untyped-call]
    return ClusterManagerClient(
        credentials=credentials,
        transport="rest",
        client_options=ClientOptions(api_endpoint=api_endpoint),
    )
