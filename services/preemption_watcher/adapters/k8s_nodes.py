"""The `k8s` source: the cluster's Node objects, listed and then watched through the official
client, each change read by the pure `payloads.k8s_nodes`. Needs `list` and `watch` on nodes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import structlog
from kubernetes import config
from kubernetes.client import ApiClient, Configuration, CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import Watch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from urllib3 import BaseHTTPResponse

from services.preemption_watcher.model import NodeSignal
from services.preemption_watcher.payloads.k8s_nodes import (
    KubeNode,
    MalformedNodeError,
    NodeRules,
    WatchEventType,
    read_node,
    signals_of,
)
from services.preemption_watcher.policy import pod_notice_s
from services.preemption_watcher.ports import ShutdownGraces
from shared.clock import Clock

log = structlog.get_logger()

_Item = NodeSignal | BaseException | None
"""What the watching thread hands over: a signal, the error that ended it, or None (done)."""


class KubernetesListError(OSError):
    """The API server's node list could not be read; the message says why."""


class _ListMeta(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    resource_version: str = Field(alias="resourceVersion", min_length=1)


class _NodeList(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    metadata: _ListMeta
    items: list[dict[str, Any]] | None = None


class KubernetesNodeSource:
    """Node notices and losses from the Kubernetes API (see `payloads.k8s_nodes` for which).

    It lists the nodes (a node already being told to go yields its notice), then watches
    from the list's resource version in a worker thread (a node's later changes do not
    repeat a notice already told; a new list tells them all again, with the same keys, in
    case they were lost on the way); when the server ends a watch it
    watches again from the last version seen; on `410 Gone` or any `ERROR` event it lists
    again, and a node it knew that the new list lacks (deleted while no watch was open) is
    reported lost. The nodes it knows outlive a failed `signals()`, so a restarted watch
    still finds what went meanwhile. Errors other than a watch's end (the API server out of
    reach, a refused list) end `signals()`; the runtime starts it again.
    """

    name = "k8s"

    def __init__(
        self,
        core: CoreV1Api,
        clock: Clock,
        *,
        rules: NodeRules = NodeRules(),  # noqa: B008 -- frozen, so one shared default is safe
        graces: ShutdownGraces | None = None,
        watch_timeout_s: int = 300,
        connect_timeout_s: float = 10.0,
        relist_delay_s: float = 1.0,
    ) -> None:
        self._core = core
        self._clock = clock
        self._rules = rules
        self._graces = graces
        self._watch_timeout_s = watch_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._relist_delay_s = relist_delay_s
        self._known: dict[str, KubeNode] = {}
        """Every node seen, by uid, as last seen; only the watching thread touches it."""
        self._told: dict[str, set[str]] = {}
        """The keys told per node uid since the last list: a node's every change need not
        repeat its notice; a list repeats them all, in case they were lost on the way."""

    @classmethod
    def over(
        cls,
        api_client: ApiClient,
        clock: Clock,
        *,
        rules: NodeRules = NodeRules(),  # noqa: B008 -- frozen, so one shared default is safe
        graces: ShutdownGraces | None = None,
        watch_timeout_s: int = 300,
        connect_timeout_s: float = 10.0,
        relist_delay_s: float = 1.0,
    ) -> KubernetesNodeSource:
        """A source on `api_client`, which the caller closes."""
        return cls(
            CoreV1Api(api_client),
            clock,
            rules=rules,
            graces=graces,
            watch_timeout_s=watch_timeout_s,
            connect_timeout_s=connect_timeout_s,
            relist_delay_s=relist_delay_s,
        )

    async def signals(self, stop: asyncio.Event) -> AsyncGenerator[NodeSignal, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Item] = asyncio.Queue()

        def deliver(item: _Item) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, item)

        follower = _Follower(deliver)
        thread = threading.Thread(
            target=self._run, args=(follower,), name="k8s-node-watch", daemon=True
        )
        thread.start()
        stopped = asyncio.ensure_future(stop.wait())
        got: asyncio.Future[_Item] | None = None
        try:
            while True:
                got = asyncio.ensure_future(queue.get())
                await asyncio.wait({got, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    return
                item = got.result()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    return
                yield item
        finally:
            for waiting in (got, stopped):
                if waiting is not None:
                    waiting.cancel()
            await follower.end(thread)

    # --- in the watching thread ------------------------------------------------------------

    def _run(self, follower: _Follower) -> None:
        """List, then watch from the list's version, until halted; errors go to `signals()`."""
        try:
            while not follower.halt.is_set():
                version = self._relist(follower)
                while not follower.halt.is_set():
                    try:
                        version = self._follow(follower, version)
                        self._retell(follower)
                    except ApiException as error:  # 410 Gone, or another ERROR event
                        if follower.halt.is_set():
                            return
                        log.info("k8s.watch_expired", status=error.status, reason=error.reason)
                        follower.halt.wait(self._relist_delay_s)
                        break
        except Exception as error:  # handed to signals(), which raises it  # noqa: BLE001
            if not follower.halt.is_set():
                follower.deliver(error)
        finally:
            follower.deliver(None)

    def _relist(self, follower: _Follower) -> str:
        version, signals = self._list()
        log.info("k8s.nodes_listed", nodes=len(self._known), version=version)
        for signal in signals:
            follower.deliver(signal)
        return version

    def _follow(self, follower: _Follower, version: str) -> str:
        """Watches from `version` until the server ends the watch; the last version seen."""
        stream = follower.watch.stream(  # type: ignore[no-untyped-call]
            self._core.list_node,
            resource_version=version,
            timeout_seconds=self._watch_timeout_s,
            allow_watch_bookmarks=True,
            # The read timeout outlasts the watch: the server ends it first.
            _request_timeout=(self._connect_timeout_s, self._watch_timeout_s + 30.0),
        )
        for event in stream:
            if follower.halt.is_set():
                break
            raw = event["raw_object"]
            version = _version_of(raw) or version
            if event["type"] in (WatchEventType.ADDED, WatchEventType.MODIFIED):
                kind = WatchEventType(event["type"])
            elif event["type"] == WatchEventType.DELETED:
                kind = WatchEventType.DELETED
            else:
                continue  # a BOOKMARK only moves the version on
            for signal in self._apply(kind, raw):
                follower.deliver(signal)
        return version

    def _retell(self, follower: _Follower) -> None:
        """At a watch's end, the nodes as last seen, read again now: a notice that a node
        carried ahead of its time (a host maintenance days away) is told once it is due."""
        self._read_graces()
        now = self._clock.now()
        for node in list(self._known.values()):
            for signal in self._tell(WatchEventType.MODIFIED, node, now):
                follower.deliver(signal)

    def _list(self) -> tuple[str, list[NodeSignal]]:
        """Lists the nodes: the version to watch from, and the signals the list implies."""
        response = cast(
            BaseHTTPResponse,
            self._core.list_node(
                _preload_content=False, _request_timeout=(self._connect_timeout_s, 60.0)
            ),
        )
        try:
            listed = _NodeList.model_validate(json.loads(response.data))
        except (ValueError, ValidationError) as error:
            msg = f"the node list is not a NodeList: {error}"
            raise KubernetesListError(msg) from error
        finally:
            response.release_conn()
        now = self._clock.now()
        listed_nodes: dict[str, KubeNode] = {}
        for raw in listed.items or []:
            node = _readable(raw, WatchEventType.ADDED)
            if node is not None:
                listed_nodes[node.metadata.uid] = node
        gone = [node for uid, node in self._known.items() if uid not in listed_nodes]
        self._known, self._told = listed_nodes, {}
        self._read_graces()
        signals = []
        for node in listed_nodes.values():
            signals += self._tell(WatchEventType.ADDED, node, now)
        for node in gone:
            signals += self._tell(WatchEventType.DELETED, node, now)
        return listed.metadata.resource_version, signals

    def _read_graces(self) -> None:
        """The notice of each node pool of the nodes known, from its shutdown grace, read
        at each list and each watch's end; one that cannot be read keeps what it had."""
        if self._graces is None:
            return
        pools = {
            pool
            for node in self._known.values()
            if (pool := node.metadata.labels.get(self._rules.pool_label)) is not None
        }
        try:
            graces = self._graces.graces(pools)
        except OSError as error:
            log.warning("k8s.shutdown_graces_unread", error=str(error))
            return
        notices = {
            pool: pod_notice_s(grace, critical, self._rules.notice_s)
            for pool, (grace, critical) in graces.items()
        }
        self._rules = replace(self._rules, pool_notice_s={**self._rules.pool_notice_s, **notices})

    def _apply(self, kind: WatchEventType, raw: Any) -> list[NodeSignal]:
        """One watch event on a node: what the source knows, and the signals it implies."""
        node = _readable(raw, kind)
        if node is None:
            return []
        if kind is WatchEventType.DELETED:
            self._known.pop(node.metadata.uid, None)
        else:
            self._known[node.metadata.uid] = node
        return self._tell(kind, node, self._clock.now())

    def _tell(self, kind: WatchEventType, node: KubeNode, now: datetime) -> list[NodeSignal]:
        """The signals `node` implies that were not told since the last list."""
        try:
            signals = signals_of(kind, node, now=now, rules=self._rules)
        except MalformedNodeError as error:
            log.warning("k8s.node_unreadable", node=node.metadata.name, reason=error.reason)
            return []
        uid = node.metadata.uid
        if kind is WatchEventType.DELETED:
            told = self._told.pop(uid, set())
        else:
            told = self._told.setdefault(uid, set())
        fresh = [signal for signal in signals if signal.key not in told]
        told.update(signal.key for signal in fresh)
        return fresh


class _Follower:
    """One run of the watching thread: its stop flag, its watch, where its findings go."""

    def __init__(self, deliver: Callable[[_Item], None]) -> None:
        self.deliver = deliver
        self.halt = threading.Event()
        self.watch = Watch()  # type: ignore[no-untyped-call]  # the package leaves it unannotated

    async def end(self, thread: threading.Thread, timeout_s: float = 5.0) -> None:
        """Halts the thread and waits for it: a blocked watch is cut off at its socket."""
        self.halt.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while thread.is_alive():
            # Again and again: a watch that starts after one stop() would not see it.
            self.watch.stop()  # type: ignore[no-untyped-call]
            if loop.time() > deadline:
                log.warning("k8s.watch_thread_stuck", thread=thread.name)
                return
            await asyncio.sleep(0.02)


def _readable(raw: Any, kind: WatchEventType) -> KubeNode | None:
    try:
        return read_node(raw)
    except MalformedNodeError as error:
        log.warning("k8s.node_unreadable", event=kind.value, reason=error.reason)
        return None


def _version_of(raw: Any) -> str | None:
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version else None


def kubernetes_api_client(kubeconfig: Path | None = None) -> ApiClient:
    """A client for the current context of `kubeconfig` if given, else for the cluster this
    runs in (its service account), else for `~/.kube/config`; the caller closes it."""
    configuration = Configuration()
    # The kubernetes package leaves its config loaders unannotated.
    if kubeconfig is not None:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        return ApiClient(configuration)
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return ApiClient(configuration)
