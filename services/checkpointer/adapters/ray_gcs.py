"""`RayNodes` on Ray's GCS: the drain request Ray's own autoscaler sends for a preemption.

A node drained with the preemption reason takes no new work, and Ray Train sees the
deadline; tasks already running carry on until the node goes.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import structlog

from shared.ray_head import head_replaced, head_unavailable
from shared.resources import NODE_LABEL

log = structlog.get_logger()


class RayGcsNodes:
    def __init__(self, gcs_address: str) -> None:
        self._gcs_address = gcs_address
        self._client: Any = None

    async def drain(self, node: str, deadline: datetime) -> bool:
        try:
            try:
                return await asyncio.to_thread(self._drain, node, deadline)
            except Exception as error:
                if not head_replaced(error):
                    raise
                self._client = None  # made for the head that went
                return await asyncio.to_thread(self._drain, node, deadline)
        except Exception as error:
            if not head_unavailable(error):
                raise
            # The notice is no less real: its checkpoint requests go out all the same.
            self._client = None
            log.warning("node.drain_head_away", node=node, error=str(error))
            return False

    def _drain(self, node: str, deadline: datetime) -> bool:
        # Imported here: Ray is slow to import, and only this adapter needs it.
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # noqa: PLC0415
        from ray.autoscaler.v2.sdk import get_cluster_resource_state  # noqa: PLC0415
        from ray.core.generated import autoscaler_pb2  # noqa: PLC0415

        if self._client is None:
            self._client = GcsClient(address=self._gcs_address)
        state = get_cluster_resource_state(self._client)
        ids = [n.node_id for n in state.node_states if n.labels.get(NODE_LABEL) == node]
        if not ids:
            return False
        node_id = ids[0]
        accepted, refusal = self._client.drain_node(
            node_id.hex() if isinstance(node_id, bytes) else str(node_id),
            autoscaler_pb2.DrainNodeReason.Value(  # type: ignore[attr-defined]  # generated
                "DRAIN_NODE_REASON_PREEMPTION"
            ),
            f"spotrain: preemption notice for {node}",
            int(deadline.timestamp() * 1000),
        )
        if not accepted:
            log.warning("node.drain_refused", node=node, refusal=refusal)
        return bool(accepted)
