"""A local fake of a GCE VM's metadata server, for the keys the `metadata` source reads:
`instance/name`, `instance/attributes/kube-labels` and `instance/preempted`, with the long
poll (`wait_for_change`, `last_etag`, `timeout_sec`) and the `Metadata-Flavor` check.

With `gke_metadata_server`, it is what a pod outside the host network reaches on a node pool
with Workload Identity (`--workload-metadata GKE_METADATA`): GKE's metadata server, which
serves only part of `instance/` (its attributes, hostname, id, service accounts and zone:
cloud.google.com/kubernetes-engine/docs/concepts/workload-identity, "metadata server") and
answers 404 for the rest, `instance/name` and `instance/preempted` among them."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_PREFIX = "/computeMetadata/v1/"
GKE_SERVED = (
    "instance/attributes/",
    "instance/hostname",
    "instance/id",
    "instance/service-accounts/",
    "instance/zone",
    "project/",
)
"""The keys GKE's metadata server serves (prefixes); anything else is a 404 there."""


@dataclass(frozen=True)
class Received:
    key: str
    """The path under `/computeMetadata/v1/`, e.g. `instance/preempted`."""
    query: dict[str, str]
    flavor: str | None
    """The `Metadata-Flavor` header, as sent."""

    @property
    def waits(self) -> bool:
        return self.query.get("wait_for_change") == "true"


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    etag: str | None = None


def etag_of(value: str) -> str:
    """Derived from the value, like the real server's (16 hex digits, back when it reverts)."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class FakeMetadataServer:
    """One VM's metadata on 127.0.0.1; `stop` and `start` keep the port, like a server that
    went away for a moment. `received` lists every request, in order."""

    def __init__(
        self,
        *,
        instance_name: str = "gke-train-spot-7f3a",
        kube_labels: str | None = None,
        port: int = 0,
        gke_metadata_server: bool = False,
    ) -> None:
        self.gke_metadata_server = gke_metadata_server
        self._values = {"instance/name": instance_name, "instance/preempted": "FALSE"}
        if kube_labels is not None:
            self._values["instance/attributes/kube-labels"] = kube_labels
        self._changed = threading.Condition()
        self._received: list[Received] = []
        self._down = True
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = port
        """0 until the first `start` picks a free port, unless given."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/computeMetadata/v1"

    def preempt(self) -> None:
        """What Compute Engine does when it starts to preempt the VM."""
        self.set_value("instance/preempted", "TRUE")

    def set_value(self, key: str, value: str) -> None:
        with self._changed:
            self._values[key] = value
            self._changed.notify_all()

    def received(self, key: str | None = None) -> list[Received]:
        with self._changed:
            return [r for r in self._received if key is None or r.key == key]

    def waits_past(self, key: str, value: str) -> int:
        """How many requests for `key` have waited past the ETag of `value`."""
        etag = etag_of(value)
        return sum(1 for r in self.received(key) if r.waits and r.query.get("last_etag") == etag)

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port), _handler_for(self))
        self.port = server.server_address[1]
        with self._changed:
            self._down = False
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="fake-metadata", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening; requests waiting for a change lose their connection, unanswered."""
        with self._changed:
            self._down = True
            self._changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @contextmanager
    def outage(self) -> Iterator[None]:
        self.stop()
        try:
            yield
        finally:
            self.start()

    def answer(self, key: str, query: dict[str, str], flavor: str | None) -> _Answer | None:
        """The reply to one GET, or None to drop the connection (the server went away)."""
        with self._changed:
            self._received.append(Received(key=key, query=query, flavor=flavor))
            if flavor != "Google":
                return _Answer(403, b"Missing required header: Metadata-Flavor\n")
            served = not self.gke_metadata_server or key.startswith(GKE_SERVED)
            if key not in self._values or not served:
                return _Answer(404, b"Not Found\n")
            if query.get("wait_for_change") == "true":
                try:
                    timeout_s = float(query["timeout_sec"]) if "timeout_sec" in query else None
                except ValueError:
                    return _Answer(400, b"Bad timeout_sec\n")
                self._wait_past(key, query.get("last_etag"), timeout_s)
                if self._down:
                    return None
            value = self._values[key]
            return _Answer(200, value.encode(), etag=etag_of(value))

    def _wait_past(self, key: str, last_etag: str | None, timeout_s: float | None) -> None:
        # Without `last_etag` a wait is for the next change from the value as it is now.
        since = last_etag if last_etag is not None else etag_of(self._values[key])
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while etag_of(self._values[key]) == since and not self._down:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            self._changed.wait(remaining)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-reply is what the tests do on purpose


def _handler_for(fake: FakeMetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            target = urlsplit(self.path)
            if not target.path.startswith(_PREFIX):
                answer: _Answer | None = _Answer(404, b"Not Found\n")
            else:
                query = {k: v[-1] for k, v in parse_qs(target.query).items()}
                flavor = self.headers.get("Metadata-Flavor")
                answer = fake.answer(target.path.removeprefix(_PREFIX), query, flavor)
            if answer is None:
                self.close_connection = True
                return
            self.send_response(answer.status)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(answer.body)))
            if answer.etag is not None:
                self.send_header("ETag", answer.etag)
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: `received` is what tests look at

    return Handler


@contextmanager
def serve_fake_metadata(fake: FakeMetadataServer) -> Iterator[FakeMetadataServer]:
    """Serves `fake` on a free port in a thread until the block ends."""
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
