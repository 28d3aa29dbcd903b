"""`PoolProvider` for one machine: each node is a real `ray start` worker process that
declares its GPUs and its pool's resources. Killing one is a real preemption."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog

from services.scaler.model import PoolSpec, StoppedNode
from services.scaler.ports import ProvidedNode
from shared.localstack.confinement import Confinement
from shared.localstack.market import LocalMarket, room_to_grow, to_preempt
from shared.localstack.nodes import LocalNode, NodeFolder, take_back
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
from shared.policy.cost.node_ends import NodeEnd
from shared.policy.deadline import SpotAdvice
from shared.resources import (
    NODE_LABEL,
    POOL_LABEL,
    RESOURCE_PER_NODE,
    capacity_resource,
    pool_resource,
)

log = structlog.get_logger()


class LocalPoolProvider:
    def __init__(
        self,
        *,
        gcs_address: str,
        state_dir: Path,
        log_dir: Path,
        env: Mapping[str, str],
        head_temp_dir: Path | None = None,
        markets: Mapping[str, LocalMarket] | None = None,
        confinement: Confinement | None = None,
    ) -> None:
        self._gcs_address = gcs_address
        self._state_dir = state_dir
        self._folder = NodeFolder(state_dir)
        self._log_dir = log_dir
        self._env = dict(env)
        self._head_temp_dir = head_temp_dir
        self._markets = dict(markets or {})
        self._confinement = confinement

    async def nodes(self) -> list[ProvidedNode]:
        return await asyncio.to_thread(self._nodes)

    def _nodes(self) -> list[ProvidedNode]:
        nodes = []
        for path in sorted(self._state_dir.glob("*.json")):
            record = ProcessRecord.load(path)
            # A recorded end is final, even while the keeper that wrote it exits: no
            # listing may show a node alive after the end its record gives.
            if record is None or not is_running(record) or self._folder.has_ended(record.name):
                # Gone (preempted, or killed by hand): forget it; Ray marks it dead.
                if record is not None:
                    stop_session(record.pid, grace_s=0)
                    shutil.rmtree(node_temp_dir(self._state_dir, record.name), ignore_errors=True)
                path.unlink(missing_ok=True)
                continue
            launched_at = self._folder.started_at(record.name) or datetime.fromtimestamp(
                path.stat().st_mtime, UTC
            )
            nodes.append(
                ProvidedNode(
                    name=record.name,
                    pool=self._folder.pool_of(record.name),
                    launched_at=launched_at,
                )
            )
        if self._markets:
            gone = self._follow_markets(nodes)
            nodes = [node for node in nodes if node.name not in gone]
        return nodes

    def _follow_markets(self, nodes: list[ProvidedNode]) -> set[str]:
        """What the market does to the nodes held: a notice to the newest past its count,
        the kill at the notice's deadline (as `spotrain preempt` does). Returns the killed."""
        now = datetime.now(UTC)
        notices = {notice.node: notice for notice in self._folder.notices()}
        killed = set()
        for name, notice in notices.items():
            node = next((n for n in nodes if n.name == name), None)
            if node is None or node.pool not in self._markets or notice.deadline > now:
                continue
            record = ProcessRecord.load(self._state_dir / f"{name}.json")
            if record is None:
                continue  # gone by itself meanwhile: the next listing drops it
            take_back(self._folder, name, record)
            killed.add(name)
            log.info("market.preempted", node=name, pool=node.pool)
        for pool, market in self._markets.items():
            held = [n.name for n in nodes if n.pool == pool and n.name not in killed]
            noticed = [name for name in held if name in notices]
            for name in to_preempt(market.available(now), held, noticed):
                deadline = now + timedelta(seconds=market.notice_s)
                self._folder.post_notice(name, deadline, now)
                log.info("market.notice", node=name, pool=pool, deadline=deadline.isoformat())
        return killed

    async def advice(self, pools: Sequence[PoolSpec]) -> dict[str, SpotAdvice]:
        """For each pool that follows a market (`--spot-market`), its trace's advice."""
        if not self._markets:
            return {}
        now = datetime.now(UTC)
        held = [node.pool for node in await asyncio.to_thread(self._folder.running)]
        return {
            pool.name: market.advice(now, held.count(pool.name))
            for pool in pools
            if (market := self._markets.get(pool.name)) is not None
        }

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        return await asyncio.to_thread(self._launch, pool, count)

    def _launch(self, pool: PoolSpec, count: int) -> list[str]:
        self._state_dir.mkdir(parents=True, exist_ok=True)
        market = self._markets.get(pool.name)
        if market is not None:
            held = sum(1 for node in self._folder.running() if node.pool == pool.name)
            available = market.available(datetime.now(UTC))
            count = min(count, room_to_grow(available, held))
            if count == 0:
                # As GCE answers a spot request in a zone out of capacity.
                msg = (
                    f"ZONE_RESOURCE_POOL_EXHAUSTED: the {pool.name} spot market lets "
                    f"{available} node(s) be held now, and {held} are"
                )
                raise OSError(msg)
        resources = {pool_resource(pool.name): RESOURCE_PER_NODE}
        if (capacity := capacity_resource(pool.capacity)) is not None:
            resources[capacity] = RESOURCE_PER_NODE
        names = []
        for _ in range(count):
            name = self._folder.new_name(pool.name)
            self._folder.describe(name, pool.name, pool.capacity.value)
            # On record before it starts (its keeper writes its process record as it
            # starts): a node that stops before any scaler announced it is still billed.
            self._folder.record_start(name, datetime.now(UTC))
            temp_dir = node_temp_dir(self._state_dir, name)
            if self._head_temp_dir is not None:
                share_head_logs(temp_dir, self._head_temp_dir)
            shape = NodeShape(
                num_cpus=pool.cpus,
                num_gpus=pool.gpus,
                resources=resources,
                labels={NODE_LABEL: name, POOL_LABEL: pool.name},
            )
            try:
                record = start_worker(
                    name,
                    self._gcs_address,
                    shape,
                    NodePorts(free_port_block(PORT_BLOCK)),
                    log_dir=self._log_dir,
                    env=self._env,
                    record_file=self._state_dir / f"{name}.json",
                    alive_file=self._folder.alive_file(name),
                    ended_file=self._folder.ended_file(name),
                    temp_dir=temp_dir,
                    confinement=self._confinement,
                )
            except (OSError, subprocess.SubprocessError):
                self._folder.forget(name)  # never started: nothing to bill
                raise
            # Its keeper writes the same record as it starts; written here too, so that
            # the node is listed as soon as the launch returns.
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

    async def stopped(self) -> list[StoppedNode]:
        return await asyncio.to_thread(self._stopped)

    def _stopped(self) -> list[StoppedNode]:
        """Nodes started here that no longer run, from the folder's start and end records
        (kept until the stack is stopped cleanly)."""
        stopped = []
        for name in self._folder.started():
            record = ProcessRecord.load(self._state_dir / f"{name}.json")
            launched_at = self._folder.started_at(name)
            running = record is not None and is_running(record) and not self._folder.has_ended(name)
            if launched_at is None or running:
                continue
            pool = self._folder.pool_of(name)
            stopped.append(StoppedNode(name=name, pool=pool, launched_at=launched_at))
        return stopped
