"""A local fake of the GKE (container) API calls the GKE provider makes, for the real
`ClusterManagerClient` pointed at it with `transport="rest"`: get a node pool, set its
size, list and get operations.

As hard as the real service where the provider depends on it (from the GKE documentation
of node pool resizing and operations, and the errors the API is reported to answer):
- a node pool names its zonal managed instance groups (`instanceGroupUrls`), held by the
  fake Compute API, where its VMs really are;
- `setSize` sets the same count in every zone's group, whatever each holds, so a shrink
  deletes VMs the groups pick at random, busy or not;
- an operation runs for a while (`RUNNING`) before it is `DONE`; while one runs on the
  cluster, a second is refused with 400 `FAILED_PRECONDITION` ("Cluster is running
  incompatible operation", reason `CLUSTER_ALREADY_HAS_OPERATION`);
- past a rate of changes per second, 429 `RESOURCE_EXHAUSTED`;
- operations name their target (the cluster for a control-plane upgrade, a node pool for
  its own upgrade or repair) and carry `startTime` and, once done, `endTime`; a surge
  upgrade of a node pool replaces its nodes one by one, each by a new VM under a new name
  before the old one is deleted (GKE's "Surge upgrades").
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.compute_server import FakeCompute, FakeGroup
from tests.fakes.http import reply_json, serving

# The paths of google/cloud/container_v1/services/cluster_manager/transports/rest_base.py:
# GET /v1/{name=projects/*/locations/*/clusters/*/nodePools/*},
# POST /v1/{name=projects/*/locations/*/clusters/*/nodePools/*}:setSize, body "*",
# GET /v1/{parent=projects/*/locations/*}/operations and
# GET /v1/{name=projects/*/locations/*/operations/*}.
_NODE_POOL = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
    r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/:]+)(?P<verb>:setSize)?$"
)
_OPERATIONS = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/operations(?:/(?P<op>[^/]+))?$"
)


@dataclass
class FakeNodePool:
    name: str
    groups: list[FakeGroup]
    """Its zonal managed instance groups, one per zone, in the fake Compute API."""
    autoscaling: dict[str, Any] | None = None
    kubelet_config: dict[str, Any] | None = None
    """Its node system configuration's kubelet part (`config.kubeletConfig`), as set."""
    machine_type: str = "g2-standard-8"

    @property
    def locations(self) -> list[str]:
        return [group.zone for group in self.groups]

    def as_json(self, project: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "initialNodeCount": 1,
            "locations": self.locations,
            "instanceGroupUrls": [group.url(project) for group in self.groups],
            "status": "RUNNING",
        }
        if self.autoscaling is not None:
            body["autoscaling"] = self.autoscaling
        body["config"] = {"machineType": self.machine_type}
        if self.kubelet_config is not None:
            body["config"]["kubeletConfig"] = self.kubelet_config
        return body


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    body: dict[str, Any]


@dataclass
class Operation:
    name: str
    operation_type: str
    target: str
    done_at: float
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def as_json(self, project: str, location: str, endpoint: str) -> dict[str, Any]:
        left_s = self.done_at - time.monotonic()
        body = {
            "name": self.name,
            "zone": location,
            "operationType": self.operation_type,
            "status": "DONE" if left_s <= 0 else "RUNNING",
            "selfLink": f"{endpoint}/v1/projects/{project}/locations/{location}"
            f"/operations/{self.name}",
            "targetLink": f"{endpoint}/v1/{self.target}",
            "startTime": _rfc3339(self.started_at),
        }
        if left_s <= 0:
            ended = datetime.now(UTC) + timedelta(seconds=left_s)
            body["endTime"] = _rfc3339(ended)
        return body


@dataclass
class FakeGke:
    """One cluster's node pools; `requests` records every call, in order."""

    project: str
    location: str
    cluster: str
    compute: FakeCompute
    pools: dict[str, FakeNodePool] = field(default_factory=dict)
    requests: list[Received] = field(default_factory=list)
    endpoint: str = ""
    operation_s: float = 0.5
    """How long an operation runs before it is DONE."""
    writes_per_s: int = 10
    running: list[Operation] = field(default_factory=list)
    _writes: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_sizes(self) -> list[tuple[str, int]]:
        """(node pool, per-zone count) of every setSize received."""
        return [
            (r.path.rsplit("/", 1)[-1].removesuffix(":setSize"), _node_count(r.body))
            for r in self.requests
            if r.path.endswith(":setSize")
        ]

    def start_operation(
        self, operation_type: str, node_pool: str | None, seconds: float
    ) -> Operation:
        """An operation someone else started: an upgrade or a repair of a node pool, or,
        with no node pool, of the cluster itself (`UPGRADE_MASTER`)."""
        target = f"projects/{self.project}/locations/{self.location}/clusters/{self.cluster}"
        operation = Operation(
            name=f"operation-{len(self.running) + 1}-{operation_type.lower()}",
            operation_type=operation_type,
            target=target if node_pool is None else f"{target}/nodePools/{node_pool}",
            done_at=time.monotonic() + seconds,
        )
        with self._lock:
            self.running.append(operation)
        return operation

    def surge_upgrade(self, node_pool: str, node: str, seconds: float) -> str:
        """GKE upgrades a node pool (an `UPGRADE_NODES` operation on it, for `seconds`) and
        replaces `node` by a surge VM; returns the new VM's name."""
        self.start_operation("UPGRADE_NODES", node_pool, seconds)
        group = next(g for g in self.pools[node_pool].groups if node in g.instances)
        return self.compute.replace(group, node)

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(Received(method, path, body))
            if (ops := _OPERATIONS.match(path)) is not None and method == "GET":
                return self._answer_operations(ops)
            match = _NODE_POOL.match(path)
            if match is None:
                return _error(404, "NOT_FOUND", f"no such path {path}")
            cluster = (match["project"], match["location"], match["cluster"])
            pool = self.pools.get(match["pool"])
            if cluster != (self.project, self.location, self.cluster) or pool is None:
                return _error(404, "NOT_FOUND", f"Not found: {path.removeprefix('/v1/')}.")
            if method == "GET" and not match["verb"]:
                return 200, pool.as_json(self.project)
            if method == "POST" and match["verb"]:
                return self._set_size(pool, path, body)
            return _error(405, "INVALID_ARGUMENT", f"{method} {path} is not served here")

    def _set_size(
        self, pool: FakeNodePool, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        self._writes = [t for t in self._writes if now - t < 1.0]
        if len(self._writes) >= self.writes_per_s:
            return _error(429, "RESOURCE_EXHAUSTED", "Too many requests, retry later.")
        busy = [op for op in self.running if now < op.done_at]
        if busy:
            error = _error(
                400,
                "FAILED_PRECONDITION",
                f"Cluster is running incompatible operation {busy[0].name}.",
            )
            error[1]["error"]["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "CLUSTER_ALREADY_HAS_OPERATION",
                    "domain": "container.googleapis.com",
                }
            ]
            return error
        self._writes.append(now)
        for group in pool.groups:
            self.compute.set_target(group, _node_count(body))
        operation = Operation(
            name=f"operation-{len(self.running) + 1}",
            operation_type="SET_NODE_POOL_SIZE",
            target=path.removesuffix(":setSize").removeprefix("/v1/"),
            done_at=now + self.operation_s,
        )
        self.running.append(operation)
        return 200, operation.as_json(self.project, self.location, self.endpoint)

    def _answer_operations(self, match: re.Match[str]) -> tuple[int, dict[str, Any]]:
        if (match["project"], match["location"]) != (self.project, self.location):
            return _error(404, "NOT_FOUND", "Not found.")
        listed = [op.as_json(self.project, self.location, self.endpoint) for op in self.running]
        if match["op"] is None:
            return 200, {"operations": listed}
        for operation in listed:
            if operation["name"] == match["op"]:
                return 200, operation
        return _error(404, "NOT_FOUND", f"Not found: operation {match['op']}.")


def _rfc3339(at: datetime) -> str:
    # As the Compute fake's times: to the millisecond, so their order holds across APIs.
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _node_count(body: dict[str, Any]) -> int:
    # proto3 JSON leaves out fields at their default: a resize to 0 has no "nodeCount".
    return int(body.get("nodeCount", 0))


def _error(code: int, status: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"error": {"code": code, "message": message, "status": status}}


@contextmanager
def serve_fake_gke(gke: FakeGke) -> Iterator[FakeGke]:
    """Serves `gke` on 127.0.0.1 at a free port, in a thread, until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            reply_json(self, *gke.answer(self.command, urlsplit(self.path).path, body))

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the recorded requests are what tests look at

    with serving(Handler, "fake-gke") as endpoint:
        gke.endpoint = endpoint
        yield gke
