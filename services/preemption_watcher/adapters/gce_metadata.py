"""The `metadata` source: this VM's GCE metadata server, long-polled for `instance/preempted`.
Only the VM itself can ask, so it runs in a small agent on each node (`metadata_agent`)."""

# What the metadata server promises, and where that is written down:
# - Every request carries `Metadata-Flavor: Google`; without it the server answers 403
#   (cloud.google.com/compute/docs/troubleshooting/troubleshoot-metadata-server, and the
#   no-flavor cases of Google's metadata server emulator tests).
# - `wait_for_change=true` holds a request until the value changes. With `last_etag=E` it
#   answers at once if the value's ETag is no longer E, so nothing that changed between two
#   requests is missed; `timeout_sec=N` answers with the unchanged value after N seconds
#   (google-cloud-go compute/metadata `Client.Subscribe`; the guest agent's
#   `wait_for_change=true&timeout_sec=60`; the emulator's `test_last_etag_non_match` and
#   `test_timeout_sec`). A wait without `last_etag` waits for the *next* change and would miss
#   a TRUE set before it arrived, so the first look is a plain read, as `Subscribe` does.
# - The ETag follows the value (the emulator's `test_etag_reverts_when_original_value_restored`),
#   so the TRUE read again after an agent restart keys the same notice.
# - `instance/preempted` reads FALSE, and TRUE once Compute Engine has begun to preempt the VM
#   (cloud.google.com/compute/docs/instances/create-use-spot, "detect preemption"); a Spot VM
#   then has 30 s between ACPI G2 soft off and G3 mechanical off (compute v1
#   `Scheduling.skipGuestOsShutdown`).
# - The server may answer 503 for up to a second during host maintenance; clients retry
#   (cloud.google.com/compute/docs/metadata/querying-metadata).

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar
from urllib.parse import urlencode, urlsplit

import structlog
from pydantic import TypeAdapter, ValidationError

from services.preemption_watcher.model import NodeSignal
from services.preemption_watcher.policy import Backoff, notice_key
from shared.clock import Clock
from shared.events.data import NodePreempting, NoticeSource
from shared.events.types import Name

log = structlog.get_logger()

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
GKE_POOL_LABEL = "cloud.google.com/gke-nodepool"
SPOT_NOTICE_S = 30.0
"""Time left once `preempted` turns TRUE on a Spot VM (see the notes at the top)."""

_FLAVOR = {"Metadata-Flavor": "Google"}
_MAX_BODY_BYTES = 64 * 1024
_READ_TIMEOUT_S = 10.0
"""For plain reads, and on top of `timeout_sec` for long polls, before a reply counts as lost."""
_NAME = TypeAdapter(Name)
_T = TypeVar("_T")


@dataclass(frozen=True)
class MetadataReply:
    status: int
    body: str
    etag: str | None


@dataclass(frozen=True)
class PreemptedReading:
    """One answer about `instance/preempted`: the value, and the ETag to wait past next."""

    preempted: bool
    etag: str | None


class UnexpectedReplyError(Exception):
    """The server answered, but not as the protocol says; retried like an outage."""


def preempted_path(seen: PreemptedReading | None, *, timeout_s: int) -> str:
    """The next request for `instance/preempted`. Pure.

    A plain read first; after it, a long poll past the last ETag (or, if the server sent
    none, past the value as it is now)."""
    if seen is None:
        return "instance/preempted"
    query = {"wait_for_change": "true"}
    if seen.etag is not None:
        query["last_etag"] = seen.etag
    query["timeout_sec"] = str(timeout_s)
    return f"instance/preempted?{urlencode(query)}"


def read_preempted(reply: MetadataReply) -> PreemptedReading:
    """`TRUE` or `FALSE` from a 200; anything else raises `UnexpectedReplyError`. Pure."""
    if reply.status == http.HTTPStatus.NOT_FOUND:
        msg = (
            "instance/preempted answered 404: this is not the VM's own metadata server (on a "
            "GKE node pool with Workload Identity a pod reaches GKE's, which does not serve "
            "it); run the agent in the host's network (hostNetwork: true)"
        )
        raise UnexpectedReplyError(msg)
    if reply.status != http.HTTPStatus.OK:
        msg = f"instance/preempted answered {reply.status}"
        raise UnexpectedReplyError(msg)
    match reply.body.strip().upper():
        case "TRUE":
            return PreemptedReading(preempted=True, etag=reply.etag)
        case "FALSE":
            return PreemptedReading(preempted=False, etag=reply.etag)
        case _:
            msg = f"instance/preempted is {reply.body[:40]!r}, neither TRUE nor FALSE"
            raise UnexpectedReplyError(msg)


def read_instance_name(reply: MetadataReply) -> str:
    """The VM's name (on GKE, the Kubernetes node's name); raises `UnexpectedReplyError`. Pure."""
    if reply.status == http.HTTPStatus.NOT_FOUND:
        msg = (
            "instance/name answered 404 (GKE's metadata server does not serve it): give the "
            "node's name instead (SPOTRAIN_METADATA_AGENT_NODE from the downward API's "
            "spec.nodeName)"
        )
        raise UnexpectedReplyError(msg)
    if reply.status != http.HTTPStatus.OK:
        msg = f"instance/name answered {reply.status}"
        raise UnexpectedReplyError(msg)
    try:
        return _NAME.validate_python(reply.body.strip())
    except ValidationError:
        msg = f"instance/name is {reply.body[:40]!r}, not a node name"
        raise UnexpectedReplyError(msg) from None


def read_pool(reply: MetadataReply, label: str) -> str | None:
    """The node pool from GKE's `kube-labels` attribute; None off GKE (404). Pure."""
    if reply.status == http.HTTPStatus.NOT_FOUND:
        return None
    if reply.status != http.HTTPStatus.OK:
        msg = f"instance/attributes/kube-labels answered {reply.status}"
        raise UnexpectedReplyError(msg)
    return pool_from_kube_labels(reply.body, label)


def pool_from_kube_labels(kube_labels: str, label: str) -> str | None:
    """The value of `label` in `k=v,k=v` (GKE's node labels), if it is a valid name. Pure."""
    for pair in kube_labels.strip().split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip() == label:
            try:
                return _NAME.validate_python(value.strip())
            except ValidationError:
                return None
    return None


class MetadataClient:
    """GETs from the metadata server in worker threads; a request in flight, long poll or
    not, ends as soon as `stop` is set.

    `http.client` rather than `urllib.request`: it lets another thread shut the socket, so a
    stopped long poll frees its thread at once instead of outwaiting `timeout_sec` (which
    would hold up the process's exit, since the loop waits for its executor's threads).
    """

    def __init__(self, base_url: str, *, connect_timeout_s: float = 2.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            msg = f"the metadata server is reached over plain http, not {base_url!r}"
            raise ValueError(msg)
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s

    async def get(
        self, path: str, *, stop: asyncio.Event, read_timeout_s: float = _READ_TIMEOUT_S
    ) -> MetadataReply | None:
        """The reply to `GET {base_url}/{path}`, or None once `stop` is set.

        Raises `OSError` or `http.client.HTTPException` when the server cannot be reached or
        drops the connection; any HTTP status is a reply."""
        exchange = _Exchange(
            self._host,
            self._port,
            f"{self._prefix}/{path}",
            connect_timeout_s=self._connect_timeout_s,
            read_timeout_s=read_timeout_s,
        )
        reply = asyncio.ensure_future(asyncio.to_thread(exchange.run))
        reply.add_done_callback(_retrieve)
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({reply, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not reply.done():
                exchange.abort()
        if not stop.is_set():
            return reply.result()
        # Cut short: the worker returns at once; wait for it so no thread outlives the source.
        with contextlib.suppress(OSError, http.client.HTTPException):
            await reply
        return None


class _Exchange:
    """One GET in a worker thread; `abort`, from any thread, shuts its socket down."""

    def __init__(
        self, host: str, port: int, target: str, *, connect_timeout_s: float, read_timeout_s: float
    ) -> None:
        self._host = host
        self._port = port
        self._target = target
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._aborted = False

    def run(self) -> MetadataReply:
        connection = http.client.HTTPConnection(
            self._host, self._port, timeout=self._connect_timeout_s
        )
        try:
            connection.connect()
            sock: socket.socket = connection.sock
            with self._lock:
                if self._aborted:
                    msg = "stopped before the request was sent"
                    raise ConnectionAbortedError(msg)
                self._sock = sock
            sock.settimeout(self._read_timeout_s)
            connection.request("GET", self._target, headers=_FLAVOR)
            response = connection.getresponse()
            body = response.read(_MAX_BODY_BYTES)
            return MetadataReply(
                status=response.status,
                body=body.decode("utf-8", errors="replace"),
                etag=response.getheader("ETag"),
            )
        finally:
            with self._lock:
                self._sock = None
            connection.close()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)


def _retrieve(future: asyncio.Future[MetadataReply]) -> None:
    # A reply abandoned by a cancelled caller must not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()


class _StoppedError(Exception):
    """`stop` was set while the source waited on the server."""


class MetadataNoticeSource:
    """This VM's preemption notice, once per turn of `instance/preempted` to TRUE.

    The signal is keyed by the TRUE value's ETag, so an agent restarted within the notice
    reads TRUE again and repeats the same key, which the relay and the bus drop.
    """

    name = "metadata"

    def __init__(
        self,
        client: MetadataClient,
        clock: Clock,
        *,
        node: str | None = None,
        pool: str | None = None,
        pool_label: str = GKE_POOL_LABEL,
        notice_s: float = SPOT_NOTICE_S,
        poll_timeout_s: int = 60,
        backoff: Backoff = Backoff(),  # noqa: B008 -- frozen, so one shared default is safe
    ) -> None:
        self._client = client
        self._clock = clock
        self._node = node
        self._pool = pool
        self._pool_label = pool_label
        self._notice = timedelta(seconds=notice_s)
        self._poll_timeout_s = poll_timeout_s
        self._backoff = backoff

    async def signals(self, stop: asyncio.Event) -> AsyncGenerator[NodeSignal, None]:
        try:
            node = self._node
            if node is None:
                node = await self._until_read("instance/name", read_instance_name, stop)
            pool = self._pool
            if pool is None:
                label = self._pool_label
                pool = await self._until_read(
                    "instance/attributes/kube-labels", lambda r: read_pool(r, label), stop
                )
            log.info("metadata.watching", node=node, pool=pool)
            seen: PreemptedReading | None = None
            while True:
                reading = await self._until_read(
                    preempted_path(seen, timeout_s=self._poll_timeout_s),
                    read_preempted,
                    stop,
                    read_timeout_s=self._poll_timeout_s + _READ_TIMEOUT_S,
                )
                if reading.preempted and not (seen is not None and seen.preempted):
                    now = self._clock.now()
                    yield NodeSignal(
                        key=notice_key(node, reading.etag, now),
                        data=NodePreempting(
                            node=node,
                            pool=pool,
                            deadline=now + self._notice,
                            source=NoticeSource.METADATA,
                        ),
                    )
                # Only now, once the consumer has asked for more: a notice it never took is
                # announced again by the next `signals`.
                seen = reading
        except _StoppedError:
            return

    async def _until_read(
        self,
        path: str,
        interpret: Callable[[MetadataReply], _T],
        stop: asyncio.Event,
        *,
        read_timeout_s: float = _READ_TIMEOUT_S,
    ) -> _T:
        """`interpret` of the first good reply; failures are retried with backoff."""
        failures = 0
        while True:
            try:
                reply = await self._client.get(path, stop=stop, read_timeout_s=read_timeout_s)
                if reply is None:
                    raise _StoppedError
                return interpret(reply)
            except (OSError, http.client.HTTPException, UnexpectedReplyError) as error:
                failures += 1
                delay_s = self._backoff.delay_s(failures)
                log.warning(
                    "metadata.unavailable",
                    path=path.partition("?")[0],
                    error=str(error) or type(error).__name__,
                    failures=failures,
                    retry_in_s=delay_s,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay_s)
                if stop.is_set():
                    raise _StoppedError from None
