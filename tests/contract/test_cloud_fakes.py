"""The cloud fakes' contract: each fake, driven through the official client the adapters
use, behaves as the service it stands for does where the platform depends on it. Each test
names the document or source the behaviour comes from; a fake that grows kinder than the
service fails here, not in production.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core.exceptions import BadRequest, TooManyRequests
from google.cloud.compute_v1 import InstanceGroupManagersDeleteInstancesRequest
from kubernetes import watch
from kubernetes.client import ApiClient, Configuration, CoreV1Api
from kubernetes.config import kube_config

from services.scaler.adapters.gke import (
    KubernetesNodeDirectory,
    connect_cluster_manager,
    connect_instance_groups,
)
from tests.fakes.compute_server import STOCK_OUT, FakeCompute, serve_fake_compute
from tests.fakes.gke_server import FakeGke, FakeNodePool, serve_fake_gke
from tests.fakes.k8s_server import FakeKubernetes, serve_fake_kubernetes
from tests.fakes.kuberay_validation import desired_replicas, ray_cluster_errors
from tests.fakes.metadata_server import FakeMetadataServer, serve_fake_metadata

ZONE = "europe-west4-a"
POOL = "projects/proj/locations/europe-west4/clusters/train/nodePools/np"


@pytest.fixture
def compute() -> Iterator[FakeCompute]:
    with serve_fake_compute(FakeCompute(project="proj", zones=[ZONE], operation_s=0.2)) as fake:
        yield fake


@pytest.fixture
def gke(compute: FakeCompute) -> Iterator[FakeGke]:
    group = compute.add_group(ZONE, "np-grp", "np", [f"np-{i}" for i in range(6)])
    fake = FakeGke(
        project="proj",
        location="europe-west4",
        cluster="train",
        compute=compute,
        pools={"np": FakeNodePool("np", [group])},
        operation_s=0.3,
    )
    with serve_fake_gke(fake) as served:
        yield served


# -- GKE: cloud.google.com/kubernetes-engine/docs/how-to/node-pools ("resize a node pool"),
#    the API's errors as reported (kubernetes-sigs/cluster-api-provider-gcp#1363).


def test_gke_refuses_a_second_operation_while_one_runs(gke: FakeGke) -> None:
    client = connect_cluster_manager(gke.endpoint)
    client.set_node_pool_size(request={"name": POOL, "node_count": 6})
    with pytest.raises(BadRequest) as refused:
        client.set_node_pool_size(request={"name": POOL, "node_count": 5})
    assert refused.value.reason == "CLUSTER_ALREADY_HAS_OPERATION"
    assert "incompatible operation" in refused.value.message
    time.sleep(gke.operation_s)
    client.set_node_pool_size(request={"name": POOL, "node_count": 6})


def test_gke_rate_limits_operations(gke: FakeGke) -> None:
    gke.writes_per_s = 0
    with pytest.raises(TooManyRequests):
        connect_cluster_manager(gke.endpoint).set_node_pool_size(
            request={"name": POOL, "node_count": 6}
        )


def test_a_node_pool_shrink_deletes_vms_the_group_picks(gke: FakeGke, compute: FakeCompute) -> None:
    """setSize removes whichever VMs the group picks ("the instances are removed at random"),
    not the newest nor the idle ones."""
    (group,) = gke.pools["np"].groups
    connect_cluster_manager(gke.endpoint).set_node_pool_size(
        request={"name": POOL, "node_count": 3}
    )
    left = sorted(group.instances)
    assert len(left) == 3
    assert left not in (["np-0", "np-1", "np-2"], ["np-3", "np-4", "np-5"])


def _finish(operation: Any) -> None:
    """Until the operation is DONE (the client's operations are unannotated)."""
    operation.result(timeout=10)


# -- Compute Engine managed instance groups: cloud.google.com/compute/docs/instance-groups
#    (working with managed instances: currentAction, lastAttempt; resizing; deleting
#    instances) and docs/troubleshooting/troubleshooting-vm-creation (the stock-out codes).


def test_a_resize_names_the_new_vms_at_once_and_runs_as_an_operation(
    compute: FakeCompute,
) -> None:
    compute.boot_s = 3600.0
    compute.add_group(ZONE, "np-grp", "np")
    groups = connect_instance_groups(compute.endpoint)
    # The client's operations leave their methods unannotated.
    operation: Any = groups.resize(
        project="proj", zone=ZONE, instance_group_manager="np-grp", size=1
    )
    assert not operation.done(), "an operation runs for a while"
    operation.result(timeout=10)
    (vm,) = list(
        groups.list_managed_instances(project="proj", zone=ZONE, instance_group_manager="np-grp")
    )
    assert (vm.current_action, vm.instance_status) == ("CREATING", "")
    assert groups.get(project="proj", zone=ZONE, instance_group_manager="np-grp").target_size == 1
    compute.boot_s = 0.0
    (vm,) = list(
        groups.list_managed_instances(project="proj", zone=ZONE, instance_group_manager="np-grp")
    )
    assert (vm.current_action, vm.instance_status) == ("NONE", "RUNNING")


def test_a_zone_out_of_the_machine_type_never_fails_the_resize(compute: FakeCompute) -> None:
    """A stock-out is no error on the call: the create is retried for ever, the VM stays
    CREATING with the zone's error in lastAttempt, the target is never reached."""
    compute.stocked_out.add(ZONE)
    compute.add_group(ZONE, "np-grp", "np")
    groups = connect_instance_groups(compute.endpoint)
    _finish(groups.resize(project="proj", zone=ZONE, instance_group_manager="np-grp", size=1))
    (vm,) = list(
        groups.list_managed_instances(project="proj", zone=ZONE, instance_group_manager="np-grp")
    )
    assert vm.current_action == "CREATING"
    assert [e.code for e in vm.last_attempt.errors.errors] == [STOCK_OUT]


def test_deleting_named_vms_lowers_the_target_and_leaves_a_record(compute: FakeCompute) -> None:
    compute.add_group(ZONE, "g", "g", ["g-1", "g-2"])
    groups = connect_instance_groups(compute.endpoint)
    body = InstanceGroupManagersDeleteInstancesRequest(
        instances=[f"zones/{ZONE}/instances/g-2"], skip_instances_on_validation_error=True
    )
    _finish(
        groups.delete_instances(
            project="proj",
            zone=ZONE,
            instance_group_manager="g",
            instance_group_managers_delete_instances_request_resource=body,
        )
    )
    assert groups.get(project="proj", zone=ZONE, instance_group_manager="g").target_size == 1
    assert [
        i.name
        for i in groups.list_managed_instances(
            project="proj", zone=ZONE, instance_group_manager="g"
        )
    ] == ["g-1"]
    assert [(o.operation_type, o.instance) for o in compute.operations] == [("delete", "g-2")]


def test_compute_rate_limits_changes(compute: FakeCompute) -> None:
    compute.add_group(ZONE, "g", "g")
    compute.writes_per_s = 0
    with pytest.raises(TooManyRequests):
        connect_instance_groups(compute.endpoint).resize(
            project="proj", zone=ZONE, instance_group_manager="g", size=1
        )


# -- GKE's metadata server: cloud.google.com/kubernetes-engine/docs/concepts/workload-identity
#    ("GKE metadata server": a subset of the Compute Engine metadata server's instance/).


@pytest.mark.parametrize(
    ("key", "status"),
    [
        ("instance/preempted", 404),
        ("instance/name", 404),
        ("instance/attributes/kube-labels", 200),
    ],
)
def test_gkes_metadata_server_serves_only_part_of_instance(key: str, status: int) -> None:
    fake = FakeMetadataServer(kube_labels="a=b", gke_metadata_server=True)
    with serve_fake_metadata(fake):
        connection = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
        connection.request(
            "GET", f"/computeMetadata/v1/{key}", headers={"Metadata-Flavor": "Google"}
        )
        got = connection.getresponse().status
        connection.close()
    assert got == status


# -- KubeRay v1.5: ray-operator/controllers/ray/utils/validation.go (ValidateRayClusterSpec)
#    and utils/util.go (GetWorkerGroupDesiredReplicas).


def _group(**changes: Any) -> dict[str, Any]:
    group: dict[str, Any] = {
        "groupName": "gpu",
        "rayStartParams": {"num-gpus": "1"},
        "template": {"spec": {"containers": [{"name": "ray-worker"}]}},
    }
    group.update(changes)
    return group


def _spec(*groups: dict[str, Any], **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
        "workerGroupSpecs": list(groups),
    }
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        (_spec(_group()), None),
        (_spec(_group(rayStartParams={"labels": "a=b"})), "rayStartParams['labels'] is not"),
        (_spec(_group(labels={"spotrain-node": "${NODE}"})), "invalid label value for key"),
        (_spec(_group(labels={"bad key!": "x"})), "invalid label key for gpu group"),
        (_spec(_group(resources={"GPU": "1"})), "should not be set in both rayStartParams"),
        (_spec(_group(template={"spec": {"containers": []}})), "at least one container"),
        (_spec(_group(suspend=True), enableInTreeAutoscaling=True), "cannot be suspended"),
        ({"workerGroupSpecs": []}, "headGroupSpec is required"),
    ],
)
def test_kuberay_validation(spec: dict[str, Any], refusal: str | None) -> None:
    errors = ray_cluster_errors(spec)
    if refusal is None:
        assert errors == []
    else:
        assert any(refusal in error for error in errors), errors


@pytest.mark.parametrize(
    ("group", "replicas"),
    [
        ({"minReplicas": 1, "maxReplicas": 4, "replicas": 3}, 3),
        ({"minReplicas": 1, "maxReplicas": 4}, 1),
        ({"minReplicas": 1, "maxReplicas": 4, "replicas": 9}, 4),
        ({"minReplicas": 5, "maxReplicas": 2, "replicas": 3}, 2),
        ({"minReplicas": 0, "maxReplicas": 4, "replicas": 2, "numOfHosts": 2}, 4),
        ({"minReplicas": 1, "maxReplicas": 4, "replicas": 3, "suspend": True}, 0),
    ],
)
def test_kuberay_desired_replicas(group: dict[str, Any], replicas: int) -> None:
    assert desired_replicas(group) == replicas


# -- The Kubernetes API: kubernetes.io/docs/reference/using-api/api-concepts (watch
#    bookmarks) and kubernetes.io/docs/concepts/overview/working-with-objects/labels.


def _node(name: str, pool: str) -> dict[str, Any]:
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"cloud.google.com/gke-nodepool": pool},
            "creationTimestamp": "2026-12-01T10:00:00Z",
        },
    }


def test_the_node_list_honours_label_selectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the GKE provider's own Kubernetes adapter, with a kubeconfig."""
    with serve_fake_kubernetes(FakeKubernetes()) as kube:
        kube.add_node(_node("a-1", "gpu-spot"))
        kube.add_node(_node("b-1", "cpu"))
        config = tmp_path / "kubeconfig"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: f\n"
            f"clusters: [{{name: f, cluster: {{server: '{kube.endpoint}'}}}}]\n"
            "contexts: [{name: f, context: {cluster: f, user: u}}]\nusers: [{name: u, user: {}}]\n"
        )
        # Read at each load, where KUBECONFIG was read when the package was imported.
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        directory = KubernetesNodeDirectory()
        assert [n.name for n in directory.nodes("gpu-spot")] == ["a-1"]
        assert [n.name for n in directory.nodes("none")] == []


def test_a_watch_with_bookmarks_ends_with_one_at_the_version_it_reached() -> None:
    with serve_fake_kubernetes(FakeKubernetes()) as kube:
        kube.add_node(_node("a-1", "gpu-spot"))
        version = str(kube.version)
        kube.add_node(_node("b-1", "cpu"))
        with ApiClient(Configuration(host=kube.endpoint)) as api:
            events = list(
                watch.Watch().stream(  # type: ignore[no-untyped-call]
                    CoreV1Api(api).list_node,
                    resource_version=version,
                    label_selector="cloud.google.com/gke-nodepool=cpu",
                    allow_watch_bookmarks=True,
                    timeout_seconds=1,
                )
            )
    assert [(e["type"], e["raw_object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "b-1"),
        ("BOOKMARK", None),
    ]
    assert events[-1]["raw_object"]["metadata"]["resourceVersion"] == str(int(version) + 1)
