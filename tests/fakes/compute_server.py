"""A local fake of Compute Engine's aggregated operations list
(`GET /compute/v1/projects/{project}/aggregated/operations`), for the real
`GlobalOperationsClient` pointed at it with the REST transport.

As hard as the real one where the provider depends on it: results are paged
(`maxResults`, `pageToken`, at most 500 a page), grouped by zone with a warning for a zone
without any, filtered (only the `(field = "value") OR ...` expressions the real API takes
on `operationType`, `status` and `targetLink`; anything else is a 400, as an invalid
filter is), a project it does not hold is a 404, and every answer can be slowed down."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http import reply_json, serving

_AGGREGATED = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/operations$")
_CLAUSE = re.compile(
    r'^\(?\s*(?P<field>operationType|status|targetLink)\s*=\s*"(?P<value>[^"]*)"\s*\)?$'
)
MAX_PAGE = 500


@dataclass(frozen=True)
class FakeOperation:
    zone: str
    operation_type: str
    instance: str
    end_time: datetime
    status: str = "DONE"

    def as_json(self, project: str, number: int) -> dict[str, Any]:
        base = "https://www.googleapis.com/compute/v1"
        zone_link = f"{base}/projects/{project}/zones/{self.zone}"
        return {
            "kind": "compute#operation",
            "id": str(7_000_000 + number),
            "name": f"operation-{number}-{self.operation_type.rsplit('.', 1)[-1]}",
            "zone": zone_link,
            "operationType": self.operation_type,
            "targetLink": f"{zone_link}/instances/{self.instance}",
            "targetId": str(9_000_000 + number),
            "status": self.status,
            "user": "system"
            if "preempted" in self.operation_type
            else "gke@system.gserviceaccount.com",
            "progress": 100,
            "insertTime": self.end_time.isoformat(timespec="milliseconds"),
            "startTime": self.end_time.isoformat(timespec="milliseconds"),
            "endTime": self.end_time.isoformat(timespec="milliseconds"),
            "selfLink": f"{zone_link}/operations/operation-{number}",
        }


@dataclass
class FakeCompute:
    project: str
    zones: list[str]
    operations: list[FakeOperation] = field(default_factory=list)
    delay_s: float = 0.0
    requests: list[dict[str, list[str]]] = field(default_factory=list)
    endpoint: str = ""

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        time.sleep(self.delay_s)
        self.requests.append(query)
        match = _AGGREGATED.match(path)
        if match is None:
            return _error(404, f"The requested URL {path} was not found on this server.")
        if match["project"] != self.project:
            return _error(404, f"The resource 'projects/{match['project']}' was not found")
        try:
            clauses = _parse_filter(query.get("filter", [""])[0])
        except ValueError as error:
            return _error(400, f"Invalid value for field 'filter': {error}")
        size = min(int(query.get("maxResults", [str(MAX_PAGE)])[0]), MAX_PAGE)
        start = int(query.get("pageToken", ["0"])[0] or 0)
        chosen = [
            (number, op)
            for number, op in enumerate(self.operations)
            if not clauses or any(_holds(op, self.project, number, c) for c in clauses)
        ]
        page = chosen[start : start + size]
        items: dict[str, Any] = {}
        for zone in self.zones:
            ops = [op.as_json(self.project, n) for n, op in page if op.zone == zone]
            key = f"zones/{zone}"
            if ops:
                items[key] = {"operations": ops}
            else:
                items[key] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": "There are no results for scope 'zones/"
                        + zone
                        + "' on this page.",
                        "data": [{"key": "scope", "value": key}],
                    }
                }
        body: dict[str, Any] = {
            "kind": "compute#operationAggregatedList",
            "id": f"projects/{self.project}/aggregated/operations",
            "items": items,
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{self.project}/aggregated/operations",
        }
        if start + size < len(chosen):
            body["nextPageToken"] = str(start + size)
        return 200, body


def _parse_filter(text: str) -> list[tuple[str, str]]:
    if not text.strip():
        return []
    clauses = []
    for part in re.split(r"\s+OR\s+", text.strip()):
        match = _CLAUSE.match(part.strip())
        if match is None:
            msg = f"'{text}' is not a valid filter expression"
            raise ValueError(msg)
        clauses.append((match["field"], match["value"]))
    return clauses


def _holds(op: FakeOperation, project: str, number: int, clause: tuple[str, str]) -> bool:
    name, value = clause
    return str(op.as_json(project, number)[name]) == value


def _error(code: int, message: str) -> tuple[int, dict[str, Any]]:
    reason = "invalid" if code == 400 else "notFound"
    return code, {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


@contextmanager
def serve_fake_compute(compute: FakeCompute) -> Iterator[FakeCompute]:
    """Serves `compute` on 127.0.0.1 at a free port, in a thread, until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            reply_json(self, *compute.answer(url.path, parse_qs(url.query)))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler, "fake-compute") as endpoint:
        compute.endpoint = endpoint
        yield compute
