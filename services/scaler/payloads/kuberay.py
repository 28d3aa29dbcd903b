"""KubeRay worker pods as the scaler's nodes, and RayCluster merge patches that resize a
worker group: pure, no I/O, no side effects.

What KubeRay does, as this module relies on it (ray-project/kuberay, ray-operator):
- Every pod it makes carries `ray.io/cluster=<RayCluster name>`, `ray.io/node-type=worker`
  (or `head`) and `ray.io/group=<groupName>` (`utils.RayClusterLabelKey`,
  `RayNodeTypeLabelKey`, `RayNodeGroupLabelKey`; `rayv1.WorkerNode` is "worker").
- `reconcilePods` first deletes every pod named in a group's `scaleStrategy.workersToDelete`
  (a name already gone is fine), then creates or deletes pods until the group has
  `replicas` (clamped to `[minReplicas, maxReplicas]`); with the in-tree autoscaler off it
  picks which pods to delete itself. It never clears `workersToDelete` in the spec: the
  writer does (Ray's autoscaler does, on its next pass), or the list only grows.
- A RayCluster is a custom resource: no strategic merge patch, and a JSON merge patch
  replaces a list whole, so a patch carries all of `workerGroupSpecs`. With
  `metadata.resourceVersion` in it the API server refuses (409) a patch of a RayCluster that
  changed since it was read, so nobody's concurrent edit is lost.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
GROUP_LABEL = "ray.io/group"
POOL_LABEL = "spotrain.dev/pool"
"""What the chart labels each worker pod with; read when `GROUP_LABEL` is missing."""
WORKER = "worker"
PENDING = "pending"
"""A pod not yet on a node is named `pending-<pod name>`: pod names are never reused."""
NO_MAX_REPLICAS = 2**31 - 1
"""KubeRay's default `maxReplicas`."""

Json = Mapping[str, Any]


class RayClusterError(ValueError):
    """A RayCluster or pod list that cannot be read, or lacks the group asked for."""


def worker_selector(cluster: str) -> str:
    """The label selector of the RayCluster's worker pods."""
    return f"{CLUSTER_LABEL}={cluster},{NODE_TYPE_LABEL}={WORKER}"


@dataclass(frozen=True)
class WorkerPod:
    """One KubeRay worker pod, as the scaler's node."""

    pod: str
    group: str
    node: str
    """The Kubernetes node's name once scheduled (what the Ray node's `spotrain-node`
    label says); `pending-<pod>` before."""
    launched_at: datetime
    """When it was scheduled; when it was created while it waits for a node."""


def placeholder(pod: str) -> str:
    return f"{PENDING}-{pod}"


def worker_pods(pod_list: Json) -> list[WorkerPod]:
    """The live worker pods of a `PodList`, oldest first; pods being deleted, and pods that
    are no Ray worker, are left out. A node name is listed once (its oldest pod)."""
    try:
        items = pod_list["items"]
    except (KeyError, TypeError) as error:
        msg = f"not a pod list: {error!r}"
        raise RayClusterError(msg) from error
    workers = sorted(
        (w for w in (worker_pod(item) for item in items or []) if w is not None),
        key=lambda w: (w.launched_at, w.pod),
    )
    seen: set[str] = set()
    unique = []
    for worker in workers:
        if worker.node not in seen:
            seen.add(worker.node)
            unique.append(worker)
    return unique


def worker_pod(pod: Json) -> WorkerPod | None:
    """A pod as a node; None for a pod being deleted or one without a name, group or time.

    A scheduled pod counts from its `PodScheduled` time, not its creation: until then the
    scaler listed it under its placeholder, which it bills up to the pass that sees the
    change, so the two overlap by at most one pass rather than by the whole wait.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if meta.get("deletionTimestamp") or labels.get(NODE_TYPE_LABEL, WORKER) != WORKER:
        return None
    name = meta.get("name")
    group = labels.get(GROUP_LABEL) or labels.get(POOL_LABEL)
    created = _time(meta.get("creationTimestamp"))
    if not name or not group or created is None:
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return WorkerPod(pod=name, group=group, node=placeholder(name), launched_at=created)
    return WorkerPod(pod=name, group=group, node=node, launched_at=_scheduled_at(pod) or created)


def grow_patch(cluster: Json, group: str, count: int, max_nodes: int) -> Json | None:
    """The merge patch that adds `count` replicas to `group`, capped at its `maxReplicas`
    and at `max_nodes`; None when the group is already at the cap."""
    specs, index = _groups(cluster, group)
    spec = specs[index]
    current = _replicas(spec)
    cap = min(int(spec.get("maxReplicas", NO_MAX_REPLICAS)), max_nodes)
    wanted = min(current + max(0, count), cap)
    if wanted <= current:
        return None
    spec["replicas"] = wanted
    return _patch(cluster, specs)


def release_patch(cluster: Json, group: str, pod: str, live_pods: Iterable[str]) -> Json | None:
    """The merge patch that removes the worker `pod` from `group`: one replica fewer, and
    the pod named in `workersToDelete` so KubeRay deletes that one and no other. Names of
    pods no longer live are dropped from the list. None if the pod is already listed there
    (asked before, not yet deleted): asking twice must not remove two replicas."""
    specs, index = _groups(cluster, group)
    spec = specs[index]
    strategy = spec.get("scaleStrategy") or {}
    listed = list(strategy.get("workersToDelete") or [])
    if pod in listed:
        return None
    live = set(live_pods)
    spec["replicas"] = max(0, _replicas(spec) - 1)
    spec["scaleStrategy"] = {
        **strategy,
        "workersToDelete": [name for name in listed if name in live] + [pod],
    }
    return _patch(cluster, specs)


def group_replicas(cluster: Json, group: str) -> int:
    specs, index = _groups(cluster, group)
    return _replicas(specs[index])


def _groups(cluster: Json, group: str) -> tuple[list[dict[str, Any]], int]:
    """A copy of the cluster's worker group specs, and the index of `group` in it."""
    try:
        specs: list[dict[str, Any]] = copy.deepcopy(list(cluster["spec"]["workerGroupSpecs"]))
    except (KeyError, TypeError) as error:
        msg = f"not a RayCluster with worker groups: {error!r}"
        raise RayClusterError(msg) from error
    for index, spec in enumerate(specs):
        if spec.get("groupName") == group:
            return specs, index
    name = (cluster.get("metadata") or {}).get("name", "?")
    msg = f"RayCluster {name} has no worker group {group!r}"
    raise RayClusterError(msg)


def _replicas(spec: Json) -> int:
    """The group's asked-for size; KubeRay starts a group without one at `minReplicas`."""
    replicas = spec.get("replicas")
    return int(spec.get("minReplicas", 0) if replicas is None else replicas)


def _patch(cluster: Json, specs: list[dict[str, Any]]) -> Json:
    patch: dict[str, Any] = {"spec": {"workerGroupSpecs": specs}}
    version = (cluster.get("metadata") or {}).get("resourceVersion")
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return patch


def _scheduled_at(pod: Json) -> datetime | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return _time(condition.get("lastTransitionTime"))
    return None


def _time(value: object) -> datetime | None:
    """An RFC 3339 time as Kubernetes writes it (`2026-11-30T12:00:00Z`); None if absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
