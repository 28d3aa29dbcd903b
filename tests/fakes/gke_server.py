"""A local fake of the two GKE REST calls the GKE provider makes (get a node pool, set its
size), for the real `ClusterManagerClient` pointed at it with `transport="rest"`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.http import reply_json, serving

# The paths of google/cloud/container_v1/services/cluster_manager/transports/rest_base.py:
# GET /v1/{name=projects/*/locations/*/clusters/*/nodePools/*} and
# POST /v1/{name=projects/*/locations/*/clusters/*/nodePools/*}:setSize, body "*".
_NODE_POOL = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
    r"/clusters/(?P<cluster>[^/]+)/nodePools/(?P<pool>[^/:]+)(?P<verb>:setSize)?$"
)


@dataclass
class FakeNodePool:
    name: str
    locations: list[str]
    node_count: int
    """Per zone, as `setSize` sets it; the real API does not report it back."""
    autoscaling: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "initialNodeCount": 1,
            "locations": self.locations,
            "status": "RUNNING",
        }
        if self.autoscaling is not None:
            body["autoscaling"] = self.autoscaling
        return body


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    body: dict[str, Any]


@dataclass
class FakeGke:
    """One cluster's node pools; `requests` records every call, in order."""

    project: str
    location: str
    cluster: str
    pools: dict[str, FakeNodePool] = field(default_factory=dict)
    requests: list[Received] = field(default_factory=list)
    endpoint: str = ""
    operations: int = 0

    def set_sizes(self) -> list[tuple[str, int]]:
        """(node pool, per-zone count) of every setSize received."""
        return [
            (r.path.rsplit("/", 1)[-1].removesuffix(":setSize"), _node_count(r.body))
            for r in self.requests
            if r.path.endswith(":setSize")
        ]

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(Received(method, path, body))
        match = _NODE_POOL.match(path)
        if match is None:
            return _error(404, "NOT_FOUND", f"no such path {path}")
        cluster = (match["project"], match["location"], match["cluster"])
        pool = self.pools.get(match["pool"])
        if cluster != (self.project, self.location, self.cluster) or pool is None:
            return _error(404, "NOT_FOUND", f"Not found: {path.removeprefix('/v1/')}.")
        if method == "GET" and not match["verb"]:
            return 200, pool.as_json()
        if method == "POST" and match["verb"]:
            pool.node_count = _node_count(body)
            self.operations += 1
            target = path.removesuffix(":setSize").removeprefix("/v1/")
            return 200, {
                "name": f"operation-{self.operations}",
                "zone": self.location,
                "operationType": "SET_NODE_POOL_SIZE",
                "status": "RUNNING",
                "selfLink": f"{self.endpoint}/v1/projects/{self.project}/locations/"
                f"{self.location}/operations/operation-{self.operations}",
                "targetLink": f"{self.endpoint}/v1/{target}",
            }
        return _error(405, "INVALID_ARGUMENT", f"{method} {path} is not served here")


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
