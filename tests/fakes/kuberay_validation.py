"""The KubeRay operator's own check of a RayCluster spec, as of the versions the deployment
guide pins (ray-operator v1.5.x: `ValidateRayClusterSpec` and the helpers it calls in
ray-operator/controllers/ray/utils/validation.go, and `GetWorkerGroupDesiredReplicas` in
utils/util.go). A spec that fails it is not reconciled at all: the operator records an
`InvalidRayClusterSpec` event and makes no head and no worker, so a chart that fails it
deploys nothing. Pure: the rules as data a reviewer can hold against the source.
"""

from __future__ import annotations

import re
from typing import Any

SUPPORTED_OPERATOR = "v1.5"
"""The operator minor version these rules follow (and docs/deploy-gke.md pins)."""

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")


def _qualified_name(key: str) -> bool:
    """Kubernetes' `IsQualifiedName`: an optional DNS-subdomain prefix and a name of at most
    63 characters."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _PREFIX.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))


def _label_value(value: str) -> bool:
    """Kubernetes' `IsValidLabelValue`: empty, or a name of at most 63 characters."""
    return value == "" or (len(value) <= 63 and bool(_NAME.match(value)))


def _group_errors(kind: str, group: dict[str, Any]) -> list[str]:
    errors = []
    name = group.get("groupName", "headgroup") if kind == "worker" else "Head"
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        errors.append(f"{kind}GroupSpec should have at least one container")
    params = group.get("rayStartParams") or {}
    if "labels" in params:
        errors.append(
            f"rayStartParams['labels'] is not supported for {name} group; please use the "
            "top-level Labels field instead"
        )
    for key, value in (group.get("labels") or {}).items():
        if not _qualified_name(key):
            errors.append(f"invalid label key for {name} group: '{key}'")
        if not _label_value(str(value)):
            errors.append(f"invalid label value for key '{key}' in {name} group: '{value}'")
    if group.get("resources") and any(params.get(p) for p in _RESOURCE_PARAMS):
        errors.append(
            f"resource fields should not be set in both rayStartParams and Resources for "
            f"{name} group; please use only one"
        )
    return errors


def ray_cluster_errors(spec: dict[str, Any]) -> list[str]:
    """What the operator would refuse in this RayCluster `spec`; empty if it reconciles it."""
    head = spec.get("headGroupSpec")
    if head is None:
        return ["headGroupSpec is required"]
    errors = _group_errors("head", head)
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    for group in spec.get("workerGroupSpecs") or []:
        errors += _group_errors("worker", group)
        if group.get("suspend") and autoscaling:
            errors.append(
                f"worker group {group.get('groupName')} cannot be suspended with Autoscaler enabled"
            )
    containers = head.get("template", {}).get("spec", {}).get("containers") or [{}]
    env = {e.get("name"): e.get("value") for e in containers[0].get("env") or []}
    if str(env.get("RAY_enable_autoscaler_v2", "")).lower() in ("1", "true") and not autoscaling:
        errors.append("RAY_enable_autoscaler_v2 is set but enableInTreeAutoscaling is not true")
    return errors


def desired_replicas(group: dict[str, Any]) -> int:
    """`GetWorkerGroupDesiredReplicas`: replicas clamped to [minReplicas, maxReplicas]
    (max wins when they cross), times the hosts per replica; 0 when suspended."""
    if group.get("suspend"):
        return 0
    low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
    replicas = group.get("replicas")
    if low > high:
        wanted = high
    elif replicas is None or replicas < low:
        wanted = low
    else:
        wanted = min(replicas, high)
    return int(wanted) * int(group.get("numOfHosts", 1))
