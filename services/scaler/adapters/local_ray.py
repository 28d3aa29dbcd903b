"""`PoolProvider` for one machine: each node is a real `ray start` worker process that
declares its GPUs and its pool's resources. Killing one is a real preemption."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path

from services.scaler.model import PoolSpec
from services.scaler.ports import ProvidedNode
from shared.cost.node_ends import NodeEnd
from shared.localstack.nodes import LocalNode, NodeFolder
from shared.localstack.ports import free_port_block
from shared.localstack.processes import ProcessRecord, is_running, stop_session
from shared.localstack.ray_nodes import (
    PORT_BLOCK,
    NodePorts,
    NodeShape,
    node_temp_dir,
    share_head_logs,
    start_worker,
)
from shared.resources import (
    NODE_LABEL,
    POOL_LABEL,
    RESOURCE_PER_NODE,
    capacity_resource,
    pool_resource,
)


class LocalPoolProvider:
    def __init__(
        self,
        *,
        gcs_address: str,
        state_dir: Path,
        log_dir: Path,
        env: Mapping[str, str],
        head_temp_dir: Path | None = None,
    ) -> None:
        self._gcs_address = gcs_address
        self._state_dir = state_dir
        self._folder = NodeFolder(state_dir)
        self._log_dir = log_dir
        self._env = dict(env)
        self._head_temp_dir = head_temp_dir

    async def nodes(self) -> list[ProvidedNode]:
        return await asyncio.to_thread(self._nodes)

    def _nodes(self) -> list[ProvidedNode]:
        nodes = []
        for path in sorted(self._state_dir.glob("*.json")):
            record = ProcessRecord.load(path)
            if record is None or not is_running(record):
                # Gone (preempted, or killed by hand): forget it; Ray marks it dead.
                if record is not None:
                    stop_session(record.pid, grace_s=0)
                    shutil.rmtree(node_temp_dir(self._state_dir, record.name), ignore_errors=True)
                path.unlink(missing_ok=True)
                continue
            launched_at = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            nodes.append(
                ProvidedNode(
                    name=record.name,
                    pool=self._folder.pool_of(record.name),
                    launched_at=launched_at,
                )
            )
        return nodes

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        return await asyncio.to_thread(self._launch, pool, count)

    def _launch(self, pool: PoolSpec, count: int) -> list[str]:
        self._state_dir.mkdir(parents=True, exist_ok=True)
        resources = {pool_resource(pool.name): RESOURCE_PER_NODE}
        if (capacity := capacity_resource(pool.capacity)) is not None:
            resources[capacity] = RESOURCE_PER_NODE
        names = []
        for _ in range(count):
            name = self._folder.new_name(pool.name)
            self._folder.describe(name, pool.name, pool.capacity.value)
            temp_dir = node_temp_dir(self._state_dir, name)
            if self._head_temp_dir is not None:
                share_head_logs(temp_dir, self._head_temp_dir)
            shape = NodeShape(
                num_cpus=pool.cpus,
                num_gpus=pool.gpus,
                resources=resources,
                labels={NODE_LABEL: name, POOL_LABEL: pool.name},
            )
            record = start_worker(
                name,
                self._gcs_address,
                shape,
                NodePorts(free_port_block(PORT_BLOCK)),
                log_dir=self._log_dir,
                env=self._env,
                alive_file=self._folder.alive_file(name),
                ended_file=self._folder.ended_file(name),
                temp_dir=temp_dir,
            )
            record.save(self._state_dir / f"{name}.json")
            names.append(name)
        return names

    async def release(self, node: str) -> None:
        await asyncio.to_thread(self._release, node)

    def _release(self, node: str) -> None:
        path = self._state_dir / f"{node}.json"
        record = ProcessRecord.load(path)
        if record is not None:
            # A drained node hands its work back; gcs-side cleanup follows its exit.
            self._folder.stop(LocalNode(node, self._folder.pool_of(node), None, record), grace_s=5)
        else:
            self._folder.mark_released(node)
        shutil.rmtree(node_temp_dir(self._state_dir, node), ignore_errors=True)
        path.unlink(missing_ok=True)

    async def ended(self, nodes: Collection[str]) -> dict[str, NodeEnd]:
        return await asyncio.to_thread(self._ended, nodes)

    def _ended(self, nodes: Collection[str]) -> dict[str, NodeEnd]:
        ends = {}
        for name in nodes:
            end = self._folder.recorded_end(name)
            if end is not None:
                ends[name] = end
        return ends
