"""A local fake of the Kubernetes API for the scaler's kuberay provider: one namespace's
RayCluster custom objects (GET, and PATCH with a JSON merge patch) and its Pods (a list by
label selector), for the real `kubernetes` client pointed at it. `operate()` plays the KubeRay
operator's part, when a test calls it, and refuses a spec the operator's own validation
refuses (tests/fakes/kuberay_validation.py)."""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http import reply_json, serving
from tests.fakes.k8s_server import status_body
from tests.fakes.kuberay_validation import desired_replicas, ray_cluster_errors

Json = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
DATA = Path(__file__).parents[1] / "data" / "kuberay"


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None = None
    body: Any = None


@dataclass
class FakeKubeRay:
    """A namespace's RayClusters and Pods, each with a resource version as the API server
    keeps them. `fail_next` answers the next calls with these HTTP statuses, in order (0: as
    usual)."""

    namespace: str
    clusters: dict[str, Json] = field(default_factory=dict)
    pods: dict[str, Json] = field(default_factory=dict)
    requests: list[Received] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)
    serves_ray: bool = True
    """Whether the cluster has KubeRay's CRDs (its discovery lists ray.io/v1)."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(reason, cluster, message) of the Warning events the operator recorded."""
    endpoint: str = ""
    _version: int = 5000
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def add_cluster(self, cluster: Json) -> None:
        with self._lock:
            cluster = copy.deepcopy(cluster)
            cluster["metadata"]["namespace"] = self.namespace
            cluster["metadata"]["resourceVersion"] = self._next_version()
            self.clusters[cluster["metadata"]["name"]] = cluster

    def cluster(self, name: str) -> Json:
        with self._lock:
            return copy.deepcopy(self.clusters[name])

    def group(self, cluster: str, group: str) -> Json:
        specs: list[Json] = self.cluster(cluster)["spec"]["workerGroupSpecs"]
        (spec,) = [g for g in specs if g["groupName"] == group]
        return spec

    def edit_cluster(self, name: str, patch: Json) -> None:
        """Someone else's change (a `helm upgrade`, a hand edit): a new resource version."""
        with self._lock:
            self.clusters[name] = _merge(self.clusters[name], patch)
            self.clusters[name]["metadata"]["resourceVersion"] = self._next_version()

    def add_pod(self, pod: Json) -> Json:
        with self._lock:
            pod = copy.deepcopy(pod)
            pod["metadata"]["namespace"] = self.namespace
            pod["metadata"]["resourceVersion"] = self._next_version()
            self.pods[pod["metadata"]["name"]] = pod
            return copy.deepcopy(pod)

    def schedule(self, pod: str, node: str, at: datetime) -> None:
        """The scheduler binds the pod to `node` (a new node of the cluster autoscaler)."""
        with self._lock:
            found = self.pods[pod]
            found["spec"]["nodeName"] = node
            found["status"] = {
                "phase": "Running",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp(at)}
                ],
            }
            found["metadata"]["resourceVersion"] = self._next_version()

    def terminate(self, pod: str, at: datetime) -> None:
        """A graceful delete: the pod stays listed, with its deletion time, for a while."""
        with self._lock:
            self.pods[pod]["metadata"]["deletionTimestamp"] = _stamp(at)

    def pods_of(self, cluster: str, group: str) -> list[Json]:
        with self._lock:
            return [
                copy.deepcopy(p)
                for _, p in sorted(self.pods.items())
                if p["metadata"]["labels"].get("ray.io/cluster") == cluster
                and p["metadata"]["labels"].get("ray.io/group") == group
                and not p["metadata"].get("deletionTimestamp")
            ]

    def operate(self, cluster: str, now: datetime) -> list[str]:
        """One pass of KubeRay's `reconcilePods` over the worker groups (in-tree autoscaling
        off): delete the pods in `workersToDelete`, then create Pending pods, or delete
        the first ones, until each group has its `replicas` (clamped to min and max). The
        spec's `workersToDelete` is left as it is, as KubeRay leaves it. Returns the names
        of the pods it created."""
        created: list[str] = []
        with self._lock:
            errors = ray_cluster_errors(self.clusters[cluster]["spec"])
            if errors:
                # The operator's answer to a spec it refuses: an event, and nothing made.
                self.events.append(("InvalidRayClusterSpec", cluster, "; ".join(errors)))
                return created
            for group in self.clusters[cluster]["spec"]["workerGroupSpecs"]:
                name = group["groupName"]
                for pod in (group.get("scaleStrategy") or {}).get("workersToDelete") or []:
                    self.pods.pop(pod, None)
                live = [p["metadata"]["name"] for p in self.pods_of(cluster, name)]
                wanted = desired_replicas(group)
                for pod in live[wanted:]:
                    del self.pods[pod]
                for _ in range(wanted - len(live)):
                    pod = worker_pod(cluster, name, now)
                    self.add_pod(pod)
                    created.append(pod["metadata"]["name"])
        return created

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    # -- what the HTTP handler calls ----------------------------------------------------

    def answer(self, received: Received) -> tuple[int, Json]:
        with self._lock:
            self.requests.append(received)
            code = self.fail_next.pop(0) if self.fail_next else 0
            if code:
                return code, status_body(code, "InternalError", "injected failure")
            served = _DISCOVERY[self.serves_ray]
            if received.method == "GET" and received.path.rstrip("/") in served:
                return 200, served[received.path.rstrip("/")]
            if received.method == "GET" and received.path.startswith("/api/v1/namespaces/"):
                name = received.path.rstrip("/").rsplit("/", 1)[-1]
                if name in (self.namespace, "kube-system", "default"):
                    return 200, {
                        "kind": "Namespace",
                        "apiVersion": "v1",
                        "metadata": {"name": name},
                    }
            parts = received.path.strip("/").split("/")
            pods_path = ["api", "v1", "namespaces", self.namespace, "pods"]
            clusters_path = ["apis", "ray.io", "v1", "namespaces", self.namespace, "rayclusters"]
            if parts == pods_path and received.method == "GET":
                return 200, self._pod_list(received.query.get("labelSelector", ""))
            if parts[:-1] == clusters_path:
                return self._cluster_call(received, parts[-1])
            return 404, status_body(404, "NotFound", f"no such path {received.path}")

    def _pod_list(self, selector: str) -> Json:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        items = [
            copy.deepcopy(p)
            for _, p in sorted(self.pods.items())
            if all(p["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._version)},
            "items": items,
        }

    def _cluster_call(self, received: Received, name: str) -> tuple[int, Json]:
        if name not in self.clusters:
            return 404, status_body(404, "NotFound", f'rayclusters.ray.io "{name}" not found')
        if received.method == "GET":
            return 200, copy.deepcopy(self.clusters[name])
        if received.method != "PATCH":
            return 405, status_body(405, "MethodNotAllowed", received.method)
        if received.content_type != MERGE_PATCH:
            # What the API server says to a strategic merge patch of a custom resource.
            return 415, status_body(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown "
                f"format - accepted media types include: application/json-patch+json, "
                f"{MERGE_PATCH}, application/apply-patch+yaml",
            )
        patch = received.body
        current = self.clusters[name]
        asked = (patch.get("metadata") or {}).get("resourceVersion")
        if asked is not None and asked != current["metadata"]["resourceVersion"]:
            return 409, status_body(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on rayclusters.ray.io "{name}": the object '
                "has been modified; please apply your changes to the latest version and try again",
            )
        merged = _merge(current, patch)
        merged["metadata"]["resourceVersion"] = self._next_version()
        self.clusters[name] = merged
        return 200, copy.deepcopy(merged)


def worker_pod(cluster: str, group: str, created: datetime) -> Json:
    """A Pending worker pod as KubeRay makes one, from the recorded one."""
    pod: Json = json.loads((DATA / "worker-pod-pending.json").read_text())
    name = f"{cluster}-{group}-worker-{uuid.uuid4().hex[:5]}"
    meta = pod["metadata"]
    meta.update(
        name=name,
        generateName=f"{cluster}-{group}-worker-",
        uid=str(uuid.uuid4()),
        creationTimestamp=_stamp(created),
    )
    meta["labels"].update(
        {"ray.io/cluster": cluster, "ray.io/group": group, "spotrain.dev/pool": group}
    )
    return pod


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else (lists too)
    replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


# What a client asks first (helm's lookup, kubectl): the server's version and which API
# groups and resources it serves, in the shapes of the API server's discovery documents.
# The resources are those the chart makes, so that helm can map each of its objects.
_SERVED = (
    # group, version, kind, plural, namespaced
    ("", "v1", "Namespace", "namespaces", False),
    ("", "v1", "Pod", "pods", True),
    ("", "v1", "ConfigMap", "configmaps", True),
    ("", "v1", "ServiceAccount", "serviceaccounts", True),
    ("", "v1", "Service", "services", True),
    ("", "v1", "Secret", "secrets", True),
    ("apps", "v1", "Deployment", "deployments", True),
    ("apps", "v1", "DaemonSet", "daemonsets", True),
    ("batch", "v1", "Job", "jobs", True),
    ("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True),
    ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    ("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors", True),
    ("monitoring.googleapis.com", "v1", "PodMonitoring", "podmonitorings", True),
    ("ray.io", "v1", "RayCluster", "rayclusters", True),
)


def _discovery(*, ray: bool = True) -> dict[str, Json]:
    documents: dict[str, Json] = {
        "/version": {"major": "1", "minor": "31", "gitVersion": "v1.31.4-gke.1256000"},
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    }
    groups: dict[str, list[Json]] = {}
    for group, version, kind, plural, namespaced in _SERVED:
        if group == "ray.io" and not ray:
            continue
        singular = kind.lower()
        groups.setdefault(f"{group}/{version}" if group else version, []).append(
            {
                "name": plural,
                "singularName": singular,
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["get", "list", "patch", "watch"],
            }
        )
    for group_version, resources in groups.items():
        path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        documents[path] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }
    documents["/apis"] = {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": gv.split("/")[0],
                "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
            }
            for gv in groups
            if "/" in gv
        ],
    }
    return documents


_DISCOVERY = {True: _discovery(), False: _discovery(ray=False)}


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def serve_fake_kuberay(kube: FakeKubeRay) -> Iterator[FakeKubeRay]:
    """Serves `kube` on 127.0.0.1 at a free port, in threads, until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._answer("GET")

        def do_PATCH(self) -> None:
            self._answer("PATCH")

        def _answer(self, method: str) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            received = Received(
                method=method,
                path=url.path,
                query={k: v[-1] for k, v in parse_qs(url.query).items()},
                content_type=self.headers.get("Content-Type"),
                body=json.loads(raw) if raw else None,
            )
            reply_json(self, *kube.answer(received))

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the recorded requests are what tests look at

    with serving(Handler, "fake-kuberay") as endpoint:
        kube.endpoint = endpoint
        yield kube
