"""A local fake of the Kubernetes API's Node list and watch, for the real `kubernetes` client
pointed at it (`Configuration(host=fake.endpoint)`).

As the API server does it (kubernetes.io/docs/reference/using-api/api-concepts, "Efficient
detection of changes", "Watch bookmarks"; "Labels and Selectors"): every change has the next
resource version; a list and a watch take an equality-based `labelSelector` (`k=v`, `k!=v`,
`k`, `!k`, comma-joined); a watch with `allowWatchBookmarks=true` ends with a BOOKMARK event
carrying the version it reached; a watch from a compacted version gets a 410 ERROR event."""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http import reply_json, serving

NODES_PATH = "/api/v1/nodes"
Json = dict[str, Any]


@dataclass(frozen=True)
class Received:
    path: str
    query: dict[str, str]
    authorization: str | None = None

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch", "").lower() in ("true", "1")


@dataclass(frozen=True)
class _Change:
    version: int
    type: str
    node: Json


class FakeKubernetes:
    """One cluster's Nodes, with the resource versions and watch history an API server keeps.

    Every change gets the next resource version and is sent to open watches. `compact()`
    forgets the history (as etcd compaction does) and ends open watches: a watch from an
    older version is then answered by a 410 ERROR event, so the client has to list again.
    `requests` records every call, in order.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.RLock())
        self._nodes: dict[str, Json] = {}
        self._history: list[_Change] = []
        self._version = 1000
        self._compacted = 0
        """Watches from a version below this are too old."""
        self._generation = 0
        """Bumped to end the watches open at the time."""
        self._closing = False
        self.requests: list[Received] = []
        self.endpoint = ""

    @property
    def version(self) -> int:
        with self._changed:
            return self._version

    def node(self, name: str) -> Json:
        with self._changed:
            return copy.deepcopy(self._nodes[name])

    @contextmanager
    def held(self) -> Iterator[None]:
        """Changes made inside reach open watches together, after the block."""
        with self._changed:
            yield

    def add_node(self, node: Json) -> Json:
        """Adds a Node (a uid and a creation time are filled in if it has none)."""
        node = copy.deepcopy(node)
        meta = node.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _timestamp())
        with self._changed:
            if meta["name"] in self._nodes:
                msg = f"node {meta['name']} already exists"
                raise ValueError(msg)
            return self._record("ADDED", node)

    def modify_node(self, name: str, change: Callable[[Json], None]) -> Json:
        """Applies `change` to a copy of the node and stores it as its next version."""
        with self._changed:
            node = copy.deepcopy(self._nodes[name])
            change(node)
            return self._record("MODIFIED", node)

    def delete_node(self, name: str) -> Json:
        with self._changed:
            node = copy.deepcopy(self._nodes[name])
            return self._record("DELETED", node)

    def compact(self) -> None:
        """Makes every version so far too old to watch from, and ends open watches."""
        with self._changed:
            self._version += 1
            self._compacted = self._version
            self._history.clear()
            self._generation += 1
            self._changed.notify_all()

    def close_watches(self) -> None:
        """Ends open watches, as an API server does when their timeout passes."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _record(self, kind: str, node: Json) -> Json:
        self._version += 1
        node["metadata"]["resourceVersion"] = str(self._version)
        if kind == "DELETED":
            del self._nodes[node["metadata"]["name"]]
        else:
            self._nodes[node["metadata"]["name"]] = node
        self._history.append(_Change(self._version, kind, copy.deepcopy(node)))
        self._changed.notify_all()
        return copy.deepcopy(node)

    def node_list(self, selector: str = "") -> Json:
        wanted = _selector(selector)
        with self._changed:
            return {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._version)},
                "items": [copy.deepcopy(n) for _, n in sorted(self._nodes.items()) if wanted(n)],
            }

    def watch(
        self,
        since: str | None,
        timeout_s: float | None,
        *,
        selector: str = "",
        bookmarks: bool = False,
    ) -> Iterator[Json]:
        """The watch events after version `since`, as they come, until the stream ends."""
        wanted = _selector(selector)
        version = since or "0"
        for event in self._watch(since, timeout_s):
            if event["type"] == "ERROR":
                yield event
                return  # the API server ends a watch with its error
            version = event["object"]["metadata"].get("resourceVersion", version)
            if wanted(event["object"]):
                yield event
        if bookmarks:
            # The version up to which every event was sent, which may be behind the store's.
            yield {
                "type": "BOOKMARK",
                "object": {
                    "kind": "Node",
                    "apiVersion": "v1",
                    "metadata": {
                        "resourceVersion": version,
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                },
            }

    def _watch(self, since: str | None, timeout_s: float | None) -> Iterator[Json]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            generation = self._generation
            if not since or since == "0":
                sent = self._version
                initial = [_event("ADDED", n) for _, n in sorted(self._nodes.items())]
            elif int(since) < self._compacted:
                sent, initial = -1, [_gone(int(since), self._compacted)]
            else:
                sent, initial = int(since), []
        yield from initial
        if sent < 0:
            return
        while True:
            with self._changed:
                self._changed.wait_for(
                    partial(self._news, generation, deadline, sent),
                    timeout=None if deadline is None else max(0.0, deadline - time.monotonic()),
                )
                pending = [c for c in self._history if c.version > sent]
                ended = self._ended(generation, deadline)
            for change in pending:
                yield _event(change.type, change.node)
                sent = change.version
            if ended:
                return

    def _news(self, generation: int, deadline: float | None, sent: int) -> bool:
        """Whether a watch has something to send since version `sent`, or is over."""
        return self._ended(generation, deadline) or (
            bool(self._history) and self._history[-1].version > sent
        )

    def _ended(self, generation: int, deadline: float | None) -> bool:
        """Whether a watch opened at `generation`, open until `deadline`, is over."""
        return (
            self._closing
            or self._generation != generation
            or (deadline is not None and time.monotonic() >= deadline)
        )

    def shut(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()


def _selector(text: str) -> Callable[[Json], bool]:
    """An equality-based label selector, as the API server reads one."""
    terms = [term.strip() for term in text.split(",") if term.strip()]

    def holds(obj: Json) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for term in terms:
            if "!=" in term:
                key, value = term.split("!=", 1)
                if labels.get(key) == value:
                    return False
            elif "=" in term:
                key, value = term.split("=", 1)
                if labels.get(key) != value.lstrip("="):
                    return False
            elif term.startswith("!"):
                if term[1:] in labels:
                    return False
            elif term not in labels:
                return False
        return True

    return holds


def _event(kind: str, node: Json) -> Json:
    return {"type": kind, "object": copy.deepcopy(node)}


def _gone(since: int, oldest: int) -> Json:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since} ({oldest})",
            "reason": "Expired",
            "code": 410,
        },
    }


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def serve_fake_kubernetes(kube: FakeKubernetes) -> Iterator[FakeKubernetes]:
    """Serves `kube` on 127.0.0.1 at a free port, in threads, until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # watches stream in chunks, as the API server's do

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            received = Received(url.path, query, self.headers.get("Authorization"))
            kube.requests.append(received)
            if url.path != NODES_PATH:
                reply_json(self, 404, status_body(404, "NotFound", f"no such path {url.path}"))
            elif received.is_watch:
                timeout = query.get("timeoutSeconds")
                events = kube.watch(
                    query.get("resourceVersion"),
                    _seconds(timeout),
                    selector=query.get("labelSelector", ""),
                    bookmarks=query.get("allowWatchBookmarks", "").lower() == "true",
                )
                self._stream(events)
            else:
                reply_json(self, 200, kube.node_list(query.get("labelSelector", "")))

        def _stream(self, events: Iterator[Json]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in events:
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away; so does the stream

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the recorded requests are what tests look at

    with serving(Handler, "fake-k8s") as endpoint:
        kube.endpoint = endpoint
        try:
            yield kube
        finally:
            kube.shut()  # ends the open watches, so that the server can stop


def _seconds(value: str | None) -> float | None:
    return None if value is None else float(value)


def status_body(code: int, reason: str, message: str) -> Json:
    """A Kubernetes `Status` object, as the API server answers a failed request."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
