"""`PoolProvider` for one machine: each node is a real `ray start` worker process that
declares its GPUs and its pool's resources. Killing one is a real preemption."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from services.scaler.model import PoolSpec
from services.scaler.ports import ProvidedNode
from shared.localstack.nodes import NodeFolder
from shared.localstack.ports import free_port_block
from shared.localstack.processes import ProcessRecord, is_running, stop_session
from shared.localstack.ray_nodes import PORT_BLOCK, NodePorts, NodeShape, start_worker
from shared.resources import RESOURCE_PER_NODE, capacity_resource, pool_resource

NODE_LABEL = "spotrain-node"
POOL_LABEL = "spotrain-pool"


class LocalPoolProvider:
    def __init__(
        self, *, gcs_address: str, state_dir: Path, log_dir: Path, env: Mapping[str, str]
    ) -> None:
        self._gcs_address = gcs_address
        self._state_dir = state_dir
        self._folder = NodeFolder(state_dir)
        self._log_dir = log_dir
        self._env = dict(env)

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
                path.unlink(missing_ok=True)
                continue
            launched_at = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            nodes.append(
                ProvidedNode(name=record.name, pool=_pool_of(path), launched_at=launched_at)
            )
        return nodes

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        return await asyncio.to_thread(self._launch, pool, count)

    def _launch(self, pool: PoolSpec, count: int) -> list[str]:
        self._state_dir.mkdir(parents=True, exist_ok=True)
        taken = {p.stem for p in self._state_dir.glob("*.json")}
        resources = {pool_resource(pool.name): RESOURCE_PER_NODE}
        if (capacity := capacity_resource(pool.capacity)) is not None:
            resources[capacity] = RESOURCE_PER_NODE
        names = []
        index = 1
        for _ in range(count):
            while f"{pool.name}-{index}" in taken:
                index += 1
            name = f"{pool.name}-{index}"
            taken.add(name)
            self._folder.forget(name)  # a notice or release mark of an earlier namesake
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
            )
            record.save(self._state_dir / f"{name}.json")
            (self._state_dir / f"{name}.pool").write_text(pool.name)
            names.append(name)
        return names

    async def release(self, node: str) -> None:
        await asyncio.to_thread(self._release, node)

    def _release(self, node: str) -> None:
        path = self._state_dir / f"{node}.json"
        record = ProcessRecord.load(path)
        # Said before it stops, so that the watcher does not report the exit as a loss.
        self._folder.mark_released(node)
        if record is not None:
            # A drained node hands its work back; gcs-side cleanup follows its exit.
            stop_session(record.pid, grace_s=5)
        path.unlink(missing_ok=True)
        path.with_suffix(".pool").unlink(missing_ok=True)


def _pool_of(path: Path) -> str:
    marker = path.with_suffix(".pool")
    if marker.exists():
        return marker.read_text().strip()
    return re.sub(r"-\d+$", "", path.stem)
