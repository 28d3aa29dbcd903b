"""`PoolProvider` on KubeRay: each pool is a worker group of one RayCluster, one Ray worker
pod per node; the scaler patches the group's `replicas` and KubeRay makes or deletes pods."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import structlog
from kubernetes import config
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from services.scaler.model import PoolSpec, StoppedNode
from services.scaler.payloads.kuberay import (
    RayClusterError,
    WorkerPod,
    group_replicas,
    grow_patch,
    release_patch,
    worker_pods,
    worker_selector,
)
from services.scaler.ports import ProvidedNode
from shared.policy.cost.node_ends import NodeEnd

GROUP = "ray.io"
VERSION = "v1"
PLURAL = "rayclusters"
MERGE_PATCH = "application/merge-patch+json"
"""Custom resources take JSON merge patches, not strategic ones."""
CALL_TIMEOUT_S = 30.0

log = structlog.get_logger()
T = TypeVar("T")


class KubeRayError(OSError):
    """A Kubernetes call failed, or the RayCluster cannot be resized as asked; the message
    says why. An `OSError`, so the scaler reports `pool.resize_failed` and tries again."""


class KubeRayPoolProvider:
    """Resizes the worker groups of one RayCluster; a spotrain pool is the group of its name.

    Semantics, and how they differ from the other providers:
    - `nodes()` lists the RayCluster's worker pods (`ray.io/cluster`, `ray.io/node-type=worker`)
      that are not being deleted, each in the pool of its `ray.io/group`. A scheduled pod is
      named by its Kubernetes node, as its Ray node's `spotrain-node` label is; a Pending
      one by `pending-<pod name>`, which is never reused.
    - `launch()` raises the group's `replicas` by `count` (capped at its `maxReplicas` and the
      pool's `max_nodes`) and returns no names: KubeRay creates the pods a moment later, and
      the scaler announces each from `nodes()` when it appears.
    - `release(node)` lowers the group's `replicas` by one and names the node's pod in
      `scaleStrategy.workersToDelete`, so KubeRay deletes that pod and no other; names of
      pods already gone are dropped from the list then. A node not listed, or whose pod is
      already named there, is left alone.
    - Each patch carries the RayCluster's `resourceVersion`: one that changed since it was
      read is refused (409) and the scaler tries again next pass.
    - Errors leave as `KubeRayError` (an `OSError`). Nothing lives in memory.
    """

    def __init__(self, *, api: ApiClient, cluster: str, namespace: str) -> None:
        self._core = CoreV1Api(api)
        self._custom = CustomObjectsApi(api)
        self._cluster = cluster
        self._namespace = namespace

    async def nodes(self) -> list[ProvidedNode]:
        return await asyncio.to_thread(self._nodes)

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        await asyncio.to_thread(self._launch, pool, count)
        return []

    async def release(self, node: str) -> None:
        await asyncio.to_thread(self._release, node)

    async def ended(self, nodes: Collection[str]) -> dict[str, NodeEnd]:
        """No record here: a deleted worker pod leaves nothing to read in the RayCluster;
        the scaler falls back on its last sighting."""
        return {}

    async def stopped(self) -> list[StoppedNode]:
        """No record here either: a worker pod that ran and went while no scaler watched
        is not billed."""
        return []

    def _nodes(self) -> list[ProvidedNode]:
        return [
            ProvidedNode(name=w.node, pool=w.group, launched_at=w.launched_at)
            for w in self._workers()
        ]

    def _launch(self, pool: PoolSpec, count: int) -> None:
        cluster = self._read_cluster()
        patch = self._translate(lambda: grow_patch(cluster, pool.name, count, pool.max_nodes))
        if patch is None:
            log.warning(
                "kuberay.launch_capped", group=pool.name, asked=count, max_nodes=pool.max_nodes
            )
            return
        self._patch_cluster(patch)
        log.info("kuberay.resize", group=pool.name, replicas=group_replicas(patch, pool.name))

    def _release(self, node: str) -> None:
        workers = self._workers()
        worker = next((w for w in workers if w.node == node), None)
        if worker is None:
            return  # already gone
        cluster = self._read_cluster()
        live = [w.pod for w in workers]
        patch = self._translate(lambda: release_patch(cluster, worker.group, worker.pod, live))
        if patch is None:
            return  # asked before; KubeRay has not deleted it yet
        self._patch_cluster(patch)
        log.info(
            "kuberay.release",
            group=worker.group,
            node=node,
            pod=worker.pod,
            replicas=group_replicas(patch, worker.group),
        )

    def _workers(self) -> list[WorkerPod]:
        listed = self._call(
            f"listing the worker pods of RayCluster {self._where}",
            lambda: self._core.list_namespaced_pod(
                self._namespace,
                label_selector=worker_selector(self._cluster),
                _preload_content=False,
                _request_timeout=CALL_TIMEOUT_S,
            ),
        )
        return self._translate(lambda: worker_pods(_json(listed)))

    def _read_cluster(self) -> dict[str, Any]:
        response = self._call(
            f"reading RayCluster {self._where}",
            lambda: self._custom.get_namespaced_custom_object(
                GROUP,
                VERSION,
                self._namespace,
                PLURAL,
                self._cluster,
                _preload_content=False,
                _request_timeout=CALL_TIMEOUT_S,
            ),
        )
        return self._translate(lambda: _json(response))

    def _patch_cluster(self, patch: Any) -> None:
        self._call(
            f"patching RayCluster {self._where}",
            lambda: self._custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self._namespace,
                PLURAL,
                self._cluster,
                patch,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=CALL_TIMEOUT_S,
            ),
        )

    @property
    def _where(self) -> str:
        return f"{self._namespace}/{self._cluster}"

    @staticmethod
    def _call(what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except ApiException as error:
            msg = f"{what}: {error.status} {error.reason}: {_message(error.body)}"
            raise KubeRayError(msg) from error
        except HTTPError as error:
            msg = f"{what}: {error}"
            raise KubeRayError(msg) from error

    def _translate(self, read: Callable[[], T]) -> T:
        try:
            return read()
        except RayClusterError as error:
            msg = f"RayCluster {self._where}: {error}"
            raise KubeRayError(msg) from error


def connect_kubernetes(api_endpoint: str | None = None) -> ApiClient:
    """A client for `api_endpoint` as is (a local fake: no credentials), else for the
    cluster this runs in (its service account), else for `~/.kube/config`."""
    if api_endpoint is not None:
        return ApiClient(Configuration(host=api_endpoint))
    configuration = Configuration()
    # The kubernetes package leaves its config loaders unannotated.
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return ApiClient(configuration)


def _json(response: Any) -> Any:
    try:
        return json.loads(response.data)
    except (ValueError, TypeError) as error:
        msg = f"an answer that is not JSON: {error}"
        raise RayClusterError(msg) from error


def _message(body: object) -> str:
    """The API server's Status message, else the body as it came."""
    try:
        return str(json.loads(body)["message"])  # type: ignore[arg-type]
    except (ValueError, TypeError, KeyError):
        return str(body)
