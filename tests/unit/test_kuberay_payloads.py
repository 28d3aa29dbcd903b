"""KubeRay worker pods as nodes, and the RayCluster merge patches that resize a worker group,
on recorded KubeRay v1 payloads."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from services.scaler.payloads.kuberay import (
    RayClusterError,
    WorkerPod,
    grow_patch,
    release_patch,
    worker_pod,
    worker_pods,
    worker_selector,
)

DATA = Path(__file__).parents[1] / "data" / "kuberay"
RUNNING = json.loads((DATA / "worker-pod-running.json").read_text())
PENDING = json.loads((DATA / "worker-pod-pending.json").read_text())
CLUSTER = json.loads((DATA / "raycluster.json").read_text())
KUBERAY_SCHEMA = json.loads(
    (
        Path(__file__).parents[1] / "helm" / "schemas" / "raycluster-ray.io-v1.schema.json"
    ).read_text()
)
GROUP_SCHEMA = copy.deepcopy(
    KUBERAY_SCHEMA["properties"]["spec"]["properties"]["workerGroupSpecs"]["items"]
)
"""KubeRay's worker group fields, less the pod template (core Kubernetes' schema)."""
del GROUP_SCHEMA["properties"]["template"]
GROUP_SCHEMA["required"].remove("template")


def _pod(base: dict[str, Any], **meta: Any) -> dict[str, Any]:
    pod = copy.deepcopy(base)
    pod["metadata"].update(meta)
    return pod


def _check_groups(patch: Any) -> None:
    """The patched worker groups are still what KubeRay's CRD accepts."""
    for group in patch["spec"]["workerGroupSpecs"]:
        jsonschema.validate({k: v for k, v in group.items() if k != "template"}, GROUP_SCHEMA)


def _group(patch: Any, name: str) -> dict[str, Any]:
    groups: list[dict[str, Any]] = patch["spec"]["workerGroupSpecs"]
    (group,) = [g for g in groups if g["groupName"] == name]
    return group


def test_selector_names_the_clusters_workers() -> None:
    assert worker_selector("spotrain") == "ray.io/cluster=spotrain,ray.io/node-type=worker"


def test_a_running_worker_is_its_kubernetes_node_from_when_it_was_scheduled() -> None:
    assert worker_pod(RUNNING) == WorkerPod(
        pod="spotrain-gpu-spot-worker-7xq2k",
        group="gpu-spot",
        node="gke-training-gpu-spot-3f2a1b7c-x9k2",
        launched_at=datetime(2026, 11, 30, 11, 55, 40, tzinfo=UTC),
    )


def test_a_pending_worker_is_a_placeholder_from_when_it_was_created() -> None:
    assert worker_pod(PENDING) == WorkerPod(
        pod="spotrain-gpu-spot-worker-m4d8p",
        group="gpu-spot",
        node="pending-spotrain-gpu-spot-worker-m4d8p",
        launched_at=datetime(2026, 11, 30, 11, 58, 10, tzinfo=UTC),
    )


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            _pod(RUNNING, deletionTimestamp="2026-11-30T12:00:00Z"), None, id="being-deleted"
        ),
        pytest.param(
            _pod(RUNNING, labels={**RUNNING["metadata"]["labels"], "ray.io/node-type": "head"}),
            None,
            id="head",
        ),
        pytest.param(_pod(RUNNING, creationTimestamp=None), None, id="no-creation-time"),
        pytest.param(
            _pod(RUNNING, labels={"ray.io/node-type": "worker"}), None, id="no-group-or-pool"
        ),
        pytest.param(
            _pod(RUNNING, labels={"ray.io/node-type": "worker", "spotrain.dev/pool": "cpu"}),
            "cpu",
            id="pool-label-without-group",
        ),
    ],
)
def test_which_pods_are_nodes(pod: dict[str, Any], expected: str | None) -> None:
    found = worker_pod(pod)
    assert (found.group if found else None) == expected


def test_a_scheduled_pod_without_its_condition_counts_from_creation() -> None:
    pod = copy.deepcopy(RUNNING)
    del pod["status"]
    found = worker_pod(pod)
    assert found is not None
    assert found.launched_at == datetime(2026, 11, 30, 11, 52, 4, tzinfo=UTC)


def test_a_pod_list_gives_each_node_once_oldest_first() -> None:
    newer = _pod(
        RUNNING, name="spotrain-gpu-spot-worker-zzzzz", creationTimestamp="2026-11-30T12:10:00Z"
    )
    newer["status"] = {}
    pods = worker_pods({"kind": "PodList", "items": [PENDING, newer, RUNNING]})
    assert [(p.pod, p.node) for p in pods] == [
        ("spotrain-gpu-spot-worker-7xq2k", "gke-training-gpu-spot-3f2a1b7c-x9k2"),
        ("spotrain-gpu-spot-worker-m4d8p", "pending-spotrain-gpu-spot-worker-m4d8p"),
    ]


def test_a_list_without_items_is_an_error() -> None:
    with pytest.raises(RayClusterError):
        worker_pods({"kind": "Status"})


@pytest.mark.parametrize(
    ("count", "max_nodes", "replicas"),
    [
        pytest.param(1, 10, 3, id="one-more"),
        pytest.param(5, 10, 4, id="capped-at-max-replicas"),
        pytest.param(5, 3, 3, id="capped-at-the-pools-max-nodes"),
    ],
)
def test_grow_raises_replicas_of_that_group_only(count: int, max_nodes: int, replicas: int) -> None:
    patch = grow_patch(CLUSTER, "gpu-spot", count, max_nodes)
    assert patch is not None
    assert _group(patch, "gpu-spot")["replicas"] == replicas
    assert _group(patch, "cpu") == CLUSTER["spec"]["workerGroupSpecs"][1]
    assert patch["metadata"] == {"resourceVersion": "48212402"}
    _check_groups(patch)


def test_grow_at_the_cap_is_no_patch() -> None:
    assert grow_patch(CLUSTER, "gpu-spot", 1, max_nodes=2) is None


def test_grow_of_a_group_without_replicas_starts_from_min_replicas() -> None:
    cluster = copy.deepcopy(CLUSTER)
    del cluster["spec"]["workerGroupSpecs"][1]["replicas"]
    patch = grow_patch(cluster, "cpu", 2, 10)
    assert patch is not None
    assert _group(patch, "cpu")["replicas"] == 3


def test_a_group_the_cluster_lacks_is_an_error() -> None:
    with pytest.raises(RayClusterError, match="no worker group 'tpu'"):
        grow_patch(CLUSTER, "tpu", 1, 10)


def test_release_names_the_pod_and_lowers_replicas() -> None:
    patch = release_patch(CLUSTER, "gpu-spot", "w-1", live_pods=["w-1", "w-2"])
    assert patch is not None
    assert _group(patch, "gpu-spot")["replicas"] == 1
    assert _group(patch, "gpu-spot")["scaleStrategy"] == {"workersToDelete": ["w-1"]}
    _check_groups(patch)


def test_release_keeps_pending_deletions_and_drops_those_done() -> None:
    cluster = copy.deepcopy(CLUSTER)
    cluster["spec"]["workerGroupSpecs"][0]["scaleStrategy"] = {"workersToDelete": ["gone", "w-2"]}
    patch = release_patch(cluster, "gpu-spot", "w-1", live_pods=["w-1", "w-2"])
    assert patch is not None
    assert _group(patch, "gpu-spot")["scaleStrategy"]["workersToDelete"] == ["w-2", "w-1"]


def test_release_of_a_pod_already_named_is_no_patch() -> None:
    cluster = copy.deepcopy(CLUSTER)
    cluster["spec"]["workerGroupSpecs"][0]["scaleStrategy"] = {"workersToDelete": ["w-1"]}
    assert release_patch(cluster, "gpu-spot", "w-1", live_pods=["w-1"]) is None
