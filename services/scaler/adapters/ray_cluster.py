"""`ClusterObserver` on Ray's GCS: the autoscaler's own cluster resource state, which has
each node's free resources, labels and idle time, read without joining as a driver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from services.scaler.model import Room
from services.scaler.ports import ObservedNode
from shared.ray_head import RayHeadUnavailableError, head_replaced, head_unavailable
from shared.resources import NODE_LABEL

T = TypeVar("T")
_ASK_TIMEOUT_S = 5

_RUNNING, _IDLE, _DRAINING = 1, 3, 4  # ray.core.generated.autoscaler_pb2.NodeStatus
_ALIVE, _DEAD = 0, 1  # ray.core.generated.gcs_pb2.GcsNodeInfo.GcsNodeState
_IDLE_TERMINATION = 1  # ray.core.generated.autoscaler_pb2.DrainNodeReason


class RayClusterObserver:
    def __init__(self, gcs_address: str) -> None:
        self._gcs_address = gcs_address
        self._client: Any = None

    async def nodes(self) -> dict[str, ObservedNode]:
        return await self._ask(self._nodes)

    async def drain_idle(self, node: str) -> str | None:
        return await self._ask(self._drain_idle, node)

    async def _ask(self, call: Callable[..., T], *args: Any) -> T:
        """`call` in a worker thread; a GCS that does not answer is
        `RayHeadUnavailableError`, and the next call connects afresh (a head back without
        its state is another cluster)."""
        try:
            try:
                return await asyncio.to_thread(call, *args)
            except Exception as error:
                if not head_replaced(error):
                    raise
                self._client = None
                return await asyncio.to_thread(call, *args)
        except Exception as error:
            if head_unavailable(error):
                self._client = None
                raise RayHeadUnavailableError(str(error)) from error
            raise

    def _gcs(self) -> Any:
        # Imported here: Ray is slow to import, and only this adapter needs it.
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # noqa: PLC0415

        if self._client is None:
            self._client = GcsClient(address=self._gcs_address)
        return self._client

    def _drain_idle(self, node: str) -> str | None:
        gcs = self._gcs()
        for info in gcs.get_all_node_info(timeout=_ASK_TIMEOUT_S).values():
            if info.state == _ALIVE and dict(info.labels).get(NODE_LABEL) == node:
                # No deadline: Ray's raylet leaves as soon as it agrees, being idle.
                accepted, refusal = gcs.drain_node(
                    info.node_id.hex(), _IDLE_TERMINATION, "spotrain: idle, scaling down", 0
                )
                return None if accepted else str(refusal or "refused")
        return None

    def _nodes(self) -> dict[str, ObservedNode]:
        from ray.autoscaler.v2.sdk import get_cluster_resource_state  # noqa: PLC0415

        # Asked first, and within seconds: the resource state has no timeout of its own,
        # and a head that is away would hold the pass until the client gives up.
        node_table = self._gcs().get_all_node_info(timeout=_ASK_TIMEOUT_S)
        state = get_cluster_resource_state(self._client)
        observed = {}
        for node in state.node_states:
            name = node.labels.get(NODE_LABEL)
            if not name or node.status not in (_RUNNING, _IDLE, _DRAINING):
                continue
            free = dict(node.available_resources)
            observed[name] = ObservedNode(
                name=name,
                free=Room(
                    gpus=int(free.get("GPU", 0)),
                    cpus=max(0.0, free.get("CPU", 0.0)),
                    memory_gb=max(0.0, free.get("memory", 0.0)) / 1024**3,
                ),
                idle_s=node.idle_duration_ms / 1000,
                draining=node.status == _DRAINING,
            )
        # A drained node leaves Ray as soon as it is idle, while its process (its VM) lives
        # on until the deadline; Ray's cluster state then forgets its labels, its node
        # table does not.
        now_ms = time.time() * 1000
        for info in node_table.values():
            name = dict(info.labels).get(NODE_LABEL)
            if name and info.state == _DEAD and name not in observed:
                observed[name] = ObservedNode(
                    name=name,
                    free=Room(),
                    idle_s=max(0.0, now_ms - info.end_time_ms) / 1000,
                    draining=True,
                )
        return observed
