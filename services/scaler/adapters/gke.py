"""`PoolProvider` on GKE: each pool is a GKE node pool (or one zone of it), whose VMs are
the zonal managed instance groups GKE made for it; the provider grows and shrinks those
groups through the Compute API, VM by VM, and reads their nodes from Kubernetes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, Self, TypeVar

import structlog
from google.api_core.exceptions import (
    BadRequest,
    Conflict,
    GoogleAPIError,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
)
from google.api_core.future.polling import DEFAULT_POLLING
from google.auth.exceptions import GoogleAuthError
from google.cloud.compute_v1 import (
    AdviceClient,
    CapacityAdviceRequest,
    CapacityAdviceRequestDistributionPolicy,
    CapacityAdviceRequestDistributionPolicyZoneConfiguration,
    CapacityAdviceRequestInstanceFlexibilityPolicy,
    CapacityAdviceRequestInstanceFlexibilityPolicyInstanceSelection,
    CapacityAdviceRequestInstanceProperties,
    CapacityAdviceRequestInstancePropertiesScheduling,
    CapacityAdviceResponse,
    GlobalOperationsClient,
    InstanceGroupManager,
    InstanceGroupManagersClient,
    InstanceGroupManagersDeleteInstancesRequest,
    ManagedInstance,
    ZoneOperationsClient,
)
from google.cloud.container_v1 import ClusterManagerClient, NodePool, Operation

from services.scaler.model import PoolSpec, StoppedNode
from services.scaler.ports import ProvidedNode, ProviderBusyError
from shared.clock import Clock
from shared.events.data import NodeEndSource
from shared.events.types import CapacityClass
from shared.gcp import client_kwargs
from shared.policy.cost.node_ends import NodeEnd
from shared.policy.deadline import SpotAdvice

NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
"""The label GKE puts on every Kubernetes node with the name of its node pool."""
CALL_TIMEOUT_S = 30.0
STARTING = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES", "VERIFYING", "RECREATING"})
"""A managed instance's `currentAction` while its VM is being made: `RECREATING` when the
group makes it again under its name, after a preemption or a deletion behind its back."""
RECREATING = "RECREATING"
LEAVING = frozenset({"DELETING", "ABANDONING"})
"""A managed instance's `currentAction` once it is going: no longer the pool's."""
BUSY_REASONS = frozenset({"CLUSTER_ALREADY_HAS_OPERATION"})
"""GKE's ErrorInfo reasons for "another operation runs on this cluster: wait"."""
OPERATING = frozenset(
    {Operation.Status.PENDING, Operation.Status.RUNNING, Operation.Status.ABORTING}
)
MAINTENANCE = frozenset(
    {
        Operation.Type.UPGRADE_NODES,
        Operation.Type.AUTO_UPGRADE_NODES,
        Operation.Type.AUTO_REPAIR_NODES,
    }
)
"""GKE's operations that replace or recreate a node pool's VMs (surge or blue-green
upgrades, auto-repair): a VM that ends inside one went for maintenance, not to the market."""
REQUIRED_PERMISSIONS: Mapping[str, str] = {
    "container.clusters.get": "read a node pool (its instance groups, its autoscaling)",
    "container.operations.list": "see whether GKE is operating on the cluster or node pool",
    "compute.instanceGroupManagers.get": "read an instance group, its target and its VMs",
    "compute.instanceGroupManagers.update": "resize an instance group, delete its VMs",
    "compute.zoneOperations.get": "wait on a resize or a deletion",
    "compute.globalOperations.list": "read when each VM was preempted or deleted",
    "compute.zoneOperations.list": "the same, per zone",
    "compute.advice.capacity": "read Compute Engine's capacity advice for the Spot pools",
}
"""The IAM permissions this provider's calls take, each with why: what the guide's custom
role holds (docs/deploy-gke.md, step 2; a test holds the two together)."""

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


def spread(sizes: Sequence[int], count: int) -> list[int]:
    """How many VMs to add to each of a node pool's zonal groups, now of these `sizes`, to
    grow it by `count`: one at a time to the smallest group (the first of equals), so the
    zones stay even and a growth never shrinks any of them. Pure."""
    if count < 0:
        msg = f"a growth adds VMs, not {count}"
        raise ValueError(msg)
    added = [0] * len(sizes)
    if not sizes:
        return added
    for _ in range(count):
        smallest = min(range(len(sizes)), key=lambda i: sizes[i] + added[i])
        added[smallest] += 1
    return added


def first_end_since(ends: Sequence[datetime], since: datetime) -> datetime | None:
    """The first of a VM name's recorded ends that belongs to the life that began at
    `since`: a name recreated by its group has one end per life. Pure."""
    return min((at for at in ends if at >= since), default=None)


def in_maintenance(at: datetime, windows: Sequence[tuple[datetime, datetime | None]]) -> bool:
    """Whether `at` falls inside one of these (start, end) operations; an end of None is
    one still running. Pure."""
    return any(start <= at and (end is None or at <= end) for start, end in windows)


def read_advice(reply: CapacityAdviceResponse) -> SpotAdvice | None:
    """The best recommendation's scores (Compute Engine ranks them, most obtainable first);
    None when it recommends nothing. Its uptime is a duration in seconds ("3600s"). Pure."""
    if not reply.recommendations:
        return None
    scores = reply.recommendations[0].scores
    uptime = scores.estimated_uptime if "estimated_uptime" in scores else ""
    uptime_h = None
    if uptime.endswith("s") and uptime[:-1].replace(".", "", 1).isdigit():
        uptime_h = float(uptime[:-1]) / 3600
    return SpotAdvice(obtainability=min(max(scores.obtainability, 0.0), 1.0), uptime_h=uptime_h)


def not_started(
    action: str,
    errors: Sequence[tuple[str, str]],
    *,
    waited_s: float,
    timeout_s: float,
    zone: str,
) -> str | None:
    """Why a managed instance that has not registered will not start, from its current
    action, its last attempt's (code, message) errors and how long it has been asked for;
    None while it runs or may yet. Compute Engine retries a failed create for ever, so an
    error on a VM still being made is taken as the zone's answer now. Pure."""
    if action not in STARTING:
        return None
    if errors:
        code, message = errors[0]
        return f"{code} in {zone}: {message}"
    if waited_s > timeout_s:
        return f"not made in {zone} after {waited_s:.0f} s ({action})"
    return None


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

    def ended(self, lives: Mapping[str, datetime]) -> dict[str, datetime]:
        """For each VM name, the first end recorded at or after the life that began then
        (a name its group recreated has had several)."""
        ...

    def stopped(self, prefixes: Sequence[str]) -> dict[str, tuple[datetime, datetime]]:
        """Each VM named with one of these prefixes that was made and has stopped: when it
        was made, when it stopped."""
        ...


class ComputeOperationRecords:
    """`InstanceRecords` from Compute Engine's operations: a spot VM taken back leaves a
    `compute.instances.preempted` operation, a deleted one (GKE shrinking its group, or by
    hand) a `delete`, each with its `endTime`; the first of them is the VM's end.

    Compute Engine keeps operations for a limited time (weeks, not months): a VM gone
    before that has no record here, and the scaler falls back on its last sighting.
    """

    FILTER = '(operationType = "compute.instances.preempted") OR (operationType = "delete")'
    LIFE_FILTER = f'(operationType = "insert") OR {FILTER}'

    def __init__(self, client: GlobalOperationsClient, project: str) -> None:
        self._client = client
        self._project = project

    def ended(self, lives: Mapping[str, datetime]) -> dict[str, datetime]:
        times = self._times(self.FILTER, lambda n: n in lives)
        found = {
            name: first_end_since(times.get((name, "end"), []), since)
            for name, since in lives.items()
        }
        return {name: at for name, at in found.items() if at is not None}

    def stopped(self, prefixes: Sequence[str]) -> dict[str, tuple[datetime, datetime]]:
        ours = tuple(prefixes)
        times = self._times(self.LIFE_FILTER, lambda n: n.startswith(ours))
        return {
            name: (min(at), min(times[name, "end"]))
            for (name, kind), at in times.items()
            if kind == "start" and (name, "end") in times
        }

    def _times(
        self, expression: str, wanted: Callable[[str], bool]
    ) -> dict[tuple[str, str], list[datetime]]:
        """(VM, start or end): the times of the matching DONE operations."""
        times: dict[tuple[str, str], list[datetime]] = {}
        try:
            pages = self._client.aggregated_list(
                request={"project": self._project, "filter": expression},
                timeout=CALL_TIMEOUT_S,
            )
            for _zone, scoped in pages:
                for operation in scoped.operations:
                    name = operation.target_link.rsplit("/", 1)[-1]
                    if not wanted(name) or operation.status.name != "DONE":
                        continue
                    if not operation.end_time:
                        continue
                    kind = "start" if operation.operation_type == "insert" else "end"
                    at = datetime.fromisoformat(operation.end_time)
                    times.setdefault((name, kind), []).append(at)
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"reading the Compute operations of project {self._project}: {error}"
            raise GkeError(msg) from error
        return times


def _advice_request(project: str, machine: str, zones: Sequence[str]) -> CapacityAdviceRequest:
    selection = CapacityAdviceRequestInstanceFlexibilityPolicyInstanceSelection(
        machine_types=[machine]
    )
    return CapacityAdviceRequest(
        size=1,
        instance_properties=CapacityAdviceRequestInstanceProperties(
            scheduling=CapacityAdviceRequestInstancePropertiesScheduling(provisioning_model="SPOT")
        ),
        instance_flexibility_policy=CapacityAdviceRequestInstanceFlexibilityPolicy(
            instance_selections={"pool": selection}
        ),
        distribution_policy=CapacityAdviceRequestDistributionPolicy(
            target_shape="ANY_SINGLE_ZONE",
            zones=[
                CapacityAdviceRequestDistributionPolicyZoneConfiguration(
                    zone=f"projects/{project}/zones/{zone}"
                )
                for zone in zones
            ],
        ),
    )


def connect_advice(api_endpoint: str | None = None) -> AdviceClient:
    """As `connect_cluster_manager`, for Compute Engine's capacity advice."""
    return AdviceClient(**client_kwargs(api_endpoint))


def connect_compute_operations(api_endpoint: str | None = None) -> GlobalOperationsClient:
    """As `connect_cluster_manager`, for the Compute API's operations."""
    return GlobalOperationsClient(**client_kwargs(api_endpoint))


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


@dataclass(frozen=True)
class InstanceGroupRef:
    """One zonal managed instance group of a node pool, as its URL names it."""

    project: str
    zone: str
    name: str

    _URL = re.compile(
        r"/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
        r"/(?:instanceGroupManagers|instanceGroups)/(?P<name>[^/?]+)$"
    )

    @classmethod
    def from_url(cls, url: str) -> Self:
        match = cls._URL.search(url)
        if match is None:
            msg = f"not the URL of a zonal instance group: {url}"
            raise GkeError(msg)
        return cls(match["project"], match["zone"], match["name"])

    def __str__(self) -> str:
        return f"instance group {self.name} in {self.zone}"


class GkePoolProvider:
    """Resizes GKE node pools through their managed instance groups; each spotrain pool maps
    to one GKE node pool, and to one zone of it when the pool names a zone.

    Semantics:
    - `nodes()` lists the managed instances of the pool's groups that are not going
      (`DELETING`, `ABANDONING`): the VMs GKE is making show at once, under the names
      they will have as Kubernetes nodes (the KubeRay worker group labels its Ray node
      `spotrain-node=<Kubernetes node name>` for the scaler to match them). The group's
      target, not this process's memory, is what there is: a restarted scaler sees
      the VMs still booting, and never sizes below them.
    - A VM whose create failed (`lastAttempt.errors`: `ZONE_RESOURCE_POOL_EXHAUSTED`, a
      quota) or has not been made after `start_timeout_s` is listed with `not_started`:
      the zone cannot serve it now. Compute Engine would retry it for ever, and a real
      stock-out never makes a call fail.
    - A name is not a machine: a group recreates a preempted or deleted VM under its
      name, as a new VM with a new `id`, and keeps its target size. Each node is listed
      with its `life` (the VM's `id`) and, while the group makes it again, as
      `recreating`, launched from when that was first seen: the scaler closes the life
      before and bills the new one from there. A recreation that fails is `not_started`,
      as a create is.
    - `launch()` refuses a pool with GKE autoscaling on (`NodePoolAutoscaledError`: the
      cluster autoscaler owns its size). It grows the smallest zonal groups one VM at a
      time (`resize` to their target plus what they take), never past `max_nodes`, and
      waits for each operation.
    - `release(node)` deletes that very VM (`deleteInstances`, which lowers the target by
      one), never another: a shrink by size would let each group pick VMs at random,
      busy ones included. It returns once Compute Engine accepted the deletion; when it
      raises, the VM is still there and still billed.
    - While a GKE operation runs on the node pool (an upgrade, a repair, someone's
      resize), and when the API answers 409, 429 or 503, or an operation outlives
      `operation_timeout_s`, the call raises `ProviderBusyError`: try again, this is no
      stock-out. An operation on the cluster alone (a control-plane upgrade, which runs
      for many minutes) holds nothing up: the groups are another API's, and GKE lets
      node-pool work run beside it.
    - `ended(nodes)` reads Compute Engine's record of when each VM stopped (its
      preemption or deletion operation, the first after the life asked about), through
      `records` when given; one that fell inside an upgrade or repair of its node pool
      says `maintenance`.
    - Errors from Google or Kubernetes leave as `GkeError` (an `OSError`).
    """

    def __init__(
        self,
        *,
        client: ClusterManagerClient,
        groups: InstanceGroupManagersClient,
        cluster: ClusterRef,
        node_pools: Mapping[str, str],
        directory: NodeDirectory,
        clock: Clock,
        zones: Mapping[str, str | None] | None = None,
        records: InstanceRecords | None = None,
        advisor: AdviceClient | None = None,
        start_timeout_s: float = 900.0,
        operation_timeout_s: float = 120.0,
        poll_s: float = 1.0,
    ) -> None:
        self._client = client
        self._groups = groups
        self._cluster = cluster
        self._node_pools = dict(node_pools)
        self._zones = dict(zones or {})
        self._directory = directory
        self._clock = clock
        self._records = records
        self._advisor = advisor
        self._start_timeout_s = start_timeout_s
        self._operation_timeout_s = operation_timeout_s
        # The library's own polling (retrying while the operation is not done), paced.
        self._polling = DEFAULT_POLLING.with_delay(
            initial=poll_s, maximum=max(poll_s, 10.0), multiplier=1.5
        )
        self._group_refs: dict[str, list[InstanceGroupRef]] = {}
        self._base_names: dict[InstanceGroupRef, str] = {}
        self._lives: dict[str, tuple[str | None, datetime]] = {}
        """Per VM name, the life last listed (its `id`, `RECREATING`, or None before a VM
        is made) and when it began."""

    def check(self) -> None:
        """At start: each mapped node pool exists, GKE does not autoscale it, and its
        instance groups can be read, and no two pools hold the same group; else a
        `GkeError` that names the pool and the fix."""
        taken: dict[str, list[InstanceGroupRef]] = {}
        for pool, gke_pool in self._node_pools.items():
            try:
                self._read_resizable(gke_pool)
                groups = self._pool_groups(pool)
            except NodePoolNotFoundError as error:
                msg = (
                    f"pool {pool}: {error}; create the node pool, or map the pool to one "
                    "that exists in SPOTRAIN_SCALER_GKE_NODE_POOLS"
                )
                raise GkeError(msg) from error
            except GkeError as error:
                raise GkeError(f"pool {pool}: {error}") from error
            if not groups:
                where = f" in zone {self._zones[pool]}" if self._zones.get(pool) else ""
                msg = f"pool {pool}: GKE node pool {gke_pool} has no instance group{where}"
                raise GkeError(msg)
            for other, other_groups in taken.items():
                if shared := sorted({g.name for g in groups} & {g.name for g in other_groups}):
                    msg = (
                        f"pools {other} and {pool} share the instance group {shared[0]}: the "
                        "same VMs would count twice; give each pool its own node pool, or "
                        "each its own zone"
                    )
                    raise GkeError(msg)
            taken[pool] = groups
            for group in groups:
                try:
                    self._target_size(group)
                except GkeError as error:
                    msg = (
                        f"pool {pool}: {error}; the scaler's service account needs "
                        "compute.instanceGroupManagers.get (docs/deploy-gke.md, step 2)"
                    )
                    raise GkeError(msg) from error

    async def nodes(self) -> list[ProvidedNode]:
        return await asyncio.to_thread(self._nodes)

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        return await asyncio.to_thread(self._launch, pool, count)

    async def release(self, node: str) -> None:
        await asyncio.to_thread(self._release, node)

    async def ended(self, nodes: Mapping[str, datetime]) -> dict[str, NodeEnd]:
        """Compute Engine's record of the end of each VM's life that began then (see
        `ComputeOperationRecords`), when this provider has one to read; GKE nodes are the
        VMs of the same name. An end inside an upgrade or repair of the VM's node pool is
        `maintenance`."""
        if self._records is None or not nodes:
            return {}
        return await asyncio.to_thread(self._ended, dict(nodes))

    def _ended(self, lives: Mapping[str, datetime]) -> dict[str, NodeEnd]:
        assert self._records is not None
        ends = self._records.ended(lives)
        if not ends:
            return {}
        windows = self._maintenance_windows()
        node_pool_of = {
            f"{self._base_name(group)}-": gke_pool
            for _pool, gke_pool, groups in self._every_pool()
            for group in groups
        }
        found = {}
        for name, at in ends.items():
            gke_pool = next((g for p, g in node_pool_of.items() if name.startswith(p)), None)
            maintenance = in_maintenance(at, windows.get(gke_pool or "", []))
            found[name] = NodeEnd(at, NodeEndSource.RECORDED, maintenance=maintenance)
        return found

    def _maintenance_windows(self) -> dict[str, list[tuple[datetime, datetime | None]]]:
        """Per GKE node pool, the (start, end) of each upgrade or repair GKE still lists."""
        windows: dict[str, list[tuple[datetime, datetime | None]]] = {}
        for operation in self._operations():
            if operation.operation_type not in MAINTENANCE or not operation.start_time:
                continue
            _, _, gke_pool = operation.target_link.partition("/nodePools/")
            if not gke_pool:
                continue
            start = datetime.fromisoformat(operation.start_time)
            end = datetime.fromisoformat(operation.end_time) if operation.end_time else None
            windows.setdefault(gke_pool, []).append((start, end))
        return windows

    async def advice(self, pools: Sequence[PoolSpec]) -> dict[str, SpotAdvice]:
        """Compute Engine's capacity advice for each spot pool this provider maps, when it
        has an advice client: for one VM of the node pool's machine type in any one of its
        zones (a multi-node job stays in one), the best zone's scores."""
        if self._advisor is None:
            return {}
        return await asyncio.to_thread(self._advice, pools)

    def _advice(self, pools: Sequence[PoolSpec]) -> dict[str, SpotAdvice]:
        advisor = self._advisor
        assert advisor is not None
        found = {}
        for pool in pools:
            if pool.capacity is not CapacityClass.SPOT or pool.name not in self._node_pools:
                continue
            machine = self._read_node_pool(self._node_pools[pool.name]).config.machine_type
            zones = sorted({group.zone for group in self._pool_groups(pool.name)})
            if not machine or not zones:
                continue
            reply = self._call(
                f"reading the capacity advice for {machine} in {', '.join(zones)}",
                functools.partial(
                    advisor.capacity,
                    project=self._cluster.project,
                    region=zones[0].rsplit("-", 1)[0],
                    capacity_advice_request_resource=_advice_request(
                        self._cluster.project, machine, zones
                    ),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
            advice = read_advice(reply)
            if advice is not None:
                found[pool.name] = advice
        return found

    async def stopped(self) -> list[StoppedNode]:
        """The VMs of each pool's instance groups that Compute Engine made and saw stop
        (their `insert`, then their preemption or deletion), as far back as it keeps
        operations: a VM made and gone while no scaler watched is billed from its making.
        A VM's pool is the group whose base instance name starts its name."""
        if self._records is None:
            return []
        return await asyncio.to_thread(self._stopped)

    def _stopped(self) -> list[StoppedNode]:
        assert self._records is not None
        pools = {}
        for pool, _gke_pool, groups in self._every_pool():
            for group in groups:
                pools[f"{self._base_name(group)}-"] = pool
        lives = self._records.stopped(list(pools))
        return [
            StoppedNode(name=name, pool=pool, launched_at=started)
            for name, (started, _ended) in sorted(lives.items())
            for prefix, pool in pools.items()
            if name.startswith(prefix)
        ]

    def _nodes(self) -> list[ProvidedNode]:
        now = self._clock.now()
        provided = []
        for pool, gke_pool, groups in self._every_pool():
            registered = {n.name: n.created_at for n in self._directory.nodes(gke_pool)}
            for group in groups:
                for instance in self._instances(group):
                    if instance.current_action in LEAVING:
                        continue
                    name = instance.name
                    recreating = instance.current_action == RECREATING
                    life = None if recreating or not instance.id else str(instance.id)
                    at = self._life_began(name, RECREATING if recreating else life, now)
                    if at is None:
                        # Never listed here: a VM made again is new; else it began when
                        # Kubernetes registered it (a restarted scaler's view).
                        at = now if recreating else registered.get(name) or now
                    self._lives[name] = (RECREATING if recreating else life, at)
                    # A recreated VM's Kubernetes node may still be listed from its last life.
                    started = name in registered and not recreating
                    why = None if started else self._not_started(instance, group, at)
                    provided.append(
                        ProvidedNode(
                            name=name,
                            pool=pool,
                            launched_at=at,
                            not_started=why,
                            life=life,
                            recreating=recreating,
                        )
                    )
        listed = {node.name for node in provided}
        self._lives = {n: life for n, life in self._lives.items() if n in listed}
        return provided

    def _life_began(self, name: str, life: str | None, now: datetime) -> datetime | None:
        """When the life of `name` now listed began: as remembered while it is the same
        machine (or the one being made for it), now for a new one; None for a name this
        provider never listed (its Kubernetes node's registration, else now)."""
        known = self._lives.get(name)
        if known is None:
            return None
        was, began = known
        same = was in (None, life) or (was == RECREATING and life is not None)
        return began if same else now

    def _not_started(
        self, instance: ManagedInstance, group: InstanceGroupRef, since: datetime
    ) -> str | None:
        return not_started(
            instance.current_action,
            [(e.code, e.message) for e in instance.last_attempt.errors.errors],
            waited_s=(self._clock.now() - since).total_seconds(),
            timeout_s=self._start_timeout_s,
            zone=group.zone,
        )

    def _launch(self, pool: PoolSpec, count: int) -> list[str]:
        gke_pool = self._gke_pool(pool.name)
        self._refuse_while_operating(gke_pool)
        self._read_resizable(gke_pool)
        groups = self._pool_groups(pool.name)
        if not groups:
            msg = f"GKE node pool {gke_pool} has no instance group in zone {pool.zone}"
            raise GkeError(msg)
        sizes = [self._target_size(group) for group in groups]
        room = max(0, pool.max_nodes - sum(sizes))
        if count > room:
            log.warning(
                "gke.launch_capped",
                gke_pool=gke_pool,
                current=sum(sizes),
                asked=count,
                max_nodes=pool.max_nodes,
            )
        adds = spread(sizes, min(count, room))
        launched: list[str] = []
        for group, size, more in zip(groups, sizes, adds, strict=True):
            if more == 0:
                continue
            before = {i.name for i in self._instances(group)}
            self._resize(group, size + more)
            made = sorted(i.name for i in self._instances(group) if i.name not in before)
            for name in made:
                self._lives.setdefault(name, (None, self._clock.now()))
            log.info("gke.resize", gke_pool=gke_pool, group=group.name, size=size + more, made=made)
            launched += made
        return launched

    def _resize(self, group: InstanceGroupRef, size: int) -> None:
        what = f"resizing {group} to {size}"
        operation = self._call(
            what,
            lambda: self._groups.resize(
                project=group.project,
                zone=group.zone,
                instance_group_manager=group.name,
                size=size,
                timeout=CALL_TIMEOUT_S,
            ),
        )
        self._wait(what, operation)

    def _release(self, node: str) -> None:
        found = self._holder(node)
        if found is None:
            return  # already gone, or going
        gke_pool, group, instance = found
        self._refuse_while_operating(gke_pool)
        what = f"deleting VM {node} from {group}"
        # Skipping a VM no longer in the group makes a deletion raced by a preemption a
        # no-op, not an error.
        body = InstanceGroupManagersDeleteInstancesRequest(
            instances=[instance.instance], skip_instances_on_validation_error=True
        )
        self._wait(
            what,
            self._call(
                what,
                lambda: self._groups.delete_instances(
                    project=group.project,
                    zone=group.zone,
                    instance_group_manager=group.name,
                    instance_group_managers_delete_instances_request_resource=body,
                    timeout=CALL_TIMEOUT_S,
                ),
            ),
        )
        log.info("gke.deleted", gke_pool=gke_pool, group=group.name, node=node)

    def _holder(self, node: str) -> tuple[str, InstanceGroupRef, ManagedInstance] | None:
        for _pool, gke_pool, groups in self._every_pool():
            for group in groups:
                for instance in self._instances(group):
                    if instance.name == node and instance.current_action not in LEAVING:
                        return gke_pool, group, instance
        return None

    def _gke_pool(self, pool: str) -> str:
        try:
            return self._node_pools[pool]
        except KeyError:
            msg = f"no GKE node pool is mapped to pool {pool!r}"
            raise GkeError(msg) from None

    def _every_pool(self) -> list[tuple[str, str, list[InstanceGroupRef]]]:
        """(pool, GKE node pool, its groups) of each mapped pool whose node pool exists."""
        found = []
        for pool, gke_pool in self._node_pools.items():
            try:
                found.append((pool, gke_pool, self._pool_groups(pool)))
            except NodePoolNotFoundError as error:
                # Gone, or never made: it holds no VM. Any other error stops the listing,
                # or a pool that cannot be read for a moment would look emptied.
                log.warning("gke.node_pool_missing", pool=pool, error=str(error))
        return found

    def _pool_groups(self, pool: str) -> list[InstanceGroupRef]:
        """The node pool's zonal groups (read once), those of the pool's zone if it has one."""
        gke_pool = self._gke_pool(pool)
        if gke_pool not in self._group_refs:
            node_pool = self._read_node_pool(gke_pool)
            self._group_refs[gke_pool] = [
                InstanceGroupRef.from_url(url) for url in node_pool.instance_group_urls
            ]
        zone = self._zones.get(pool)
        return [g for g in self._group_refs[gke_pool] if zone is None or g.zone == zone]

    def _instances(self, group: InstanceGroupRef) -> list[ManagedInstance]:
        pages = self._call(
            f"listing the VMs of {group}",
            lambda: self._groups.list_managed_instances(
                project=group.project,
                zone=group.zone,
                instance_group_manager=group.name,
                timeout=CALL_TIMEOUT_S,
            ),
        )
        return self._call(f"listing the VMs of {group}", lambda: list(pages))

    def _base_name(self, group: InstanceGroupRef) -> str:
        """The group's base instance name, which starts each of its VMs' names."""
        if group not in self._base_names:
            self._base_names[group] = self._manager(group).base_instance_name
        return self._base_names[group]

    def _target_size(self, group: InstanceGroupRef) -> int:
        return int(self._manager(group).target_size)

    def _manager(self, group: InstanceGroupRef) -> InstanceGroupManager:
        return self._call(
            f"reading {group}",
            lambda: self._groups.get(
                project=group.project,
                zone=group.zone,
                instance_group_manager=group.name,
                timeout=CALL_TIMEOUT_S,
            ),
        )

    def _read_node_pool(self, gke_pool: str) -> NodePool:
        name = self._cluster.node_pool(gke_pool)
        return self._call(
            f"reading GKE node pool {name}",
            lambda: self._client.get_node_pool(name=name, timeout=CALL_TIMEOUT_S),
        )

    def _read_resizable(self, gke_pool: str) -> None:
        """Refuses a node pool that is not ours to resize: one GKE autoscales."""
        node_pool = self._read_node_pool(gke_pool)
        if node_pool.autoscaling.enabled:
            bounds = node_pool.autoscaling
            msg = (
                f"GKE node pool {gke_pool} has autoscaling on "
                f"(min {bounds.min_node_count}, max {bounds.max_node_count} per zone): "
                "the cluster autoscaler owns its size, spotrain does not resize it; turn it "
                f"off (gcloud container node-pools update {gke_pool} --no-enable-autoscaling)"
            )
            raise NodePoolAutoscaledError(msg)

    def _operations(self) -> Sequence[Operation]:
        parent = f"projects/{self._cluster.project}/locations/{self._cluster.location}"
        listed = self._call(
            f"listing the GKE operations of {parent}",
            lambda: self._client.list_operations(parent=parent, timeout=CALL_TIMEOUT_S),
        )
        cluster = f"/clusters/{self._cluster.cluster}"
        return [
            operation
            for operation in listed.operations
            if operation.target_link.endswith(cluster)
            or f"{cluster}/nodePools/" in operation.target_link
        ]

    def _refuse_while_operating(self, gke_pool: str) -> None:
        """An upgrade or repair of the node pool works on its groups (a surge upgrade
        adds VMs and drains and deletes others): changing them meanwhile would fight it.
        The cluster's own operations (a control-plane upgrade) are no reason to wait: the
        groups are the Compute API's, and the cluster autoscaler does not wait either."""
        ours = f"/clusters/{self._cluster.cluster}/nodePools/{gke_pool}"
        for operation in self._operations():
            if operation.status in OPERATING and operation.target_link.endswith(ours):
                msg = (
                    f"GKE operation {operation.name} ({operation.operation_type.name}) is "
                    f"running on {operation.target_link.rsplit('/projects/', 1)[-1]}"
                )
                raise ProviderBusyError(msg)

    def _wait(self, what: str, operation: Any) -> None:
        """Until Compute Engine's operation is done; busy when it outlives the timeout."""
        try:
            operation.result(timeout=self._operation_timeout_s, polling=self._polling)
        except concurrent.futures.TimeoutError:
            msg = f"{what}: still running after {self._operation_timeout_s:.0f} s"
            raise ProviderBusyError(msg) from None
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"{what}: {error}"
            raise GkeError(msg) from error

    @staticmethod
    def _call(what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except NotFound as error:
            msg = f"{what}: not found ({error.message})"
            raise NodePoolNotFoundError(msg) from error
        except (TooManyRequests, Conflict, ServiceUnavailable) as error:
            msg = f"{what}: busy, try again ({error.code} {error.message})"
            raise ProviderBusyError(msg) from error
        except BadRequest as error:
            if error.reason in BUSY_REASONS:
                msg = f"{what}: busy, try again ({error.message})"
                raise ProviderBusyError(msg) from error
            msg = f"{what}: {error}"
            raise GkeError(msg) from error
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"{what}: {error}"
            raise GkeError(msg) from error


def connect_cluster_manager(api_endpoint: str | None = None) -> ClusterManagerClient:
    """A REST client on Google's endpoint, or another (`shared.gcp.client_kwargs`)."""
    return ClusterManagerClient(**client_kwargs(api_endpoint))


def connect_instance_groups(api_endpoint: str | None = None) -> InstanceGroupManagersClient:
    """As `connect_cluster_manager`, for the Compute API's managed instance groups."""
    client = InstanceGroupManagersClient(**client_kwargs(api_endpoint))
    if api_endpoint is not None:
        # The client polls its operations through a ZoneOperationsClient it makes itself,
        # on the default endpoint whatever the options say (google-cloud-compute 1.x): give
        # it one on the same endpoint, or another endpoint's operations are polled on
        # Google's.
        client.transport._extended_operations_services["zone_operations"] = ZoneOperationsClient(
            **client_kwargs(api_endpoint)
        )
    return client
