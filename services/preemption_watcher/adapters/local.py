"""The `local` source: the local provider's node folder. `spotrain preempt` posts notices
there; a node process that dies without having been released is a lost node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from datetime import datetime
from pathlib import Path

from services.preemption_watcher.model import NodeSignal
from shared.clock import Clock
from shared.events.data import NodeEndSource, NodeLost, NodePreempting, NoticeSource
from shared.localstack.nodes import NodeFolder
from shared.localstack.processes import is_running


class LocalNodeSource:
    name = "local"

    def __init__(self, folder: Path, clock: Clock, *, poll_interval_s: float = 0.1) -> None:
        self._folder = NodeFolder(folder)
        self._clock = clock
        self._poll_interval_s = poll_interval_s
        self._alive: dict[str, int] = {}
        """Nodes seen running, by name, with their pid: a loss is only news of a node that
        was seen alive (one that died while the watcher was down is the submitter's to find,
        when Ray reports its job's driver gone)."""

    async def signals(self, stop: asyncio.Event) -> AsyncGenerator[NodeSignal, None]:
        while not stop.is_set():
            for signal in await asyncio.to_thread(self.look):
                yield signal
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._poll_interval_s)

    def look(self) -> list[NodeSignal]:
        """One look at the folder: notices of running nodes (repeated each look; the key
        drops repeats), then nodes seen running before and gone now."""
        running = {
            node.name: node.record.pid for node in self._folder.nodes() if is_running(node.record)
        }
        signals = [
            NodeSignal(
                key=f"{notice.node}@{notice.deadline.isoformat()}",
                data=NodePreempting(
                    node=notice.node,
                    pool=self._folder.pool_of(notice.node),
                    deadline=notice.deadline,
                    source=NoticeSource.LOCAL,
                ),
            )
            for notice in self._folder.notices()
            if notice.node in running
        ]
        for name, pid in list(self._alive.items()):
            if running.get(name) == pid:
                continue
            del self._alive[name]
            if self._folder.was_released(name):
                continue
            lost = NodeLost(
                node=name,
                pool=self._folder.pool_of(name),
                source=NoticeSource.LOCAL,
                lost_at=self._lost_at(name),
            )
            signals.append(NodeSignal(key=f"{name}@{pid}", data=lost))
        self._alive.update(running)
        return signals

    def _lost_at(self, name: str) -> datetime:
        """When the node stopped, as its folder recorded it (as a cloud records a VM's
        preemption); else now, when it was found gone. Found gone is up to a look late, and
        the ledger would bill that much past the end until the record came."""
        end = self._folder.recorded_end(name)
        if end is not None and end.source is NodeEndSource.RECORDED:
            return end.at
        return self._clock.now()
