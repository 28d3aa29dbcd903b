"""`spotrain down` ends every node open on the ledger: real node processes under their
keepers, a real NATS JetStream, and the stack's own `down`."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.events import decode, new_event, subjects_for
from shared.events.data import (
    NodeEndSource,
    NodeLaunched,
    NodeReleased,
    ReleaseReason,
)
from shared.events.types import CapacityClass
from shared.localstack import stack
from shared.localstack.nodes import NodeFolder
from shared.localstack.processes import is_running, session_processes
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.integration.test_node_keeper import kept, wait_gone

pytestmark = pytest.mark.integration


def launched(node: str, at: datetime) -> NodeLaunched:
    return NodeLaunched(
        node=node,
        pool="cpu",
        capacity=CapacityClass.ON_DEMAND,
        gpus=0,
        cpus=2,
        price_per_hour_usd=0.1,
        launched_at=at,
    )


async def announce(settings: BusSettings, *data: NodeLaunched) -> None:
    bus = await JetStreamBus.connect(settings, name="test")
    try:
        await bus.ensure_stream()
        for item in data:
            await bus.publish(new_event(item, source="scaler", time=item.launched_at))
    finally:
        await bus.close()


async def released(settings: BusSettings) -> dict[str, NodeReleased]:
    bus = await JetStreamBus.connect(settings, name="test")
    try:
        [subject] = subjects_for((NodeReleased,), settings.subject_prefix)
        events: list[Any] = [decode(m.data) for m in await bus.read(subject)]
    finally:
        await bus.close()
    return {e.data.node: e.data for e in events}


@pytest.fixture
def local(
    tmp_path: Path, bus_settings: BusSettings, monkeypatch: pytest.MonkeyPatch
) -> LocalStackSettings:
    """A stack whose only parts are its pool nodes, on the test's NATS server."""
    monkeypatch.setenv("SPOTRAIN_SUBJECT_PREFIX", bus_settings.subject_prefix)
    port = int(bus_settings.nats_url.rsplit(":", 1)[1])
    return LocalStackSettings(home=tmp_path / "stack", nats_port=port)


def test_down_stops_the_nodes_and_ends_every_open_one_on_the_ledger(
    local: LocalStackSettings, bus_settings: BusSettings
) -> None:
    folder = NodeFolder(local.node_dir)
    folder.path.mkdir(parents=True)
    now = datetime.now(UTC)
    running = [kept(folder, name, ["sleep", "60"]) for name in ("cpu-1", "cpu-2")]
    dead = kept(folder, "cpu-3", ["sleep", "0.2"])
    wait_gone(dead)
    died = folder.recorded_end("cpu-3")
    assert died is not None
    asyncio.run(announce(bus_settings, *(launched(n, now) for n in ("cpu-1", "cpu-2", "cpu-3"))))
    said: list[str] = []
    before = datetime.now(UTC)
    stopped = stack.down(local, progress=said.append)
    after = datetime.now(UTC)
    assert stopped == ["node cpu-1", "node cpu-2"]
    assert not any(session_processes(n.record.pid) or is_running(n.record) for n in running)
    assert "ended 3 nodes on the ledger" in said
    ends = asyncio.run(released(bus_settings))
    assert {name: e.reason for name, e in ends.items()} == {
        "cpu-1": ReleaseReason.STACK_STOPPED,
        "cpu-2": ReleaseReason.STACK_STOPPED,
        "cpu-3": ReleaseReason.GONE_WHILE_UNWATCHED,
    }
    assert all(e.end_source is NodeEndSource.RECORDED for e in ends.values())
    assert all(before <= ends[n].released_at <= after for n in ("cpu-1", "cpu-2"))
    assert ends["cpu-3"].released_at == died.at
    assert list(folder.path.glob("*.ended")) == [], "told the ledger: the records go"


def test_down_keeps_the_records_of_a_node_no_event_names_for_the_scalers_next_start(
    local: LocalStackSettings, bus_settings: BusSettings
) -> None:
    """A scaler killed between a launch and its announcement: `down` cannot price the node
    (the pools are the scaler's), so it leaves its start and end for the scaler."""
    folder = NodeFolder(local.node_dir)
    folder.path.mkdir(parents=True)
    now = datetime.now(UTC)
    kept(folder, "cpu-1", ["sleep", "60"])
    kept(folder, "cpu-2", ["sleep", "60"])
    asyncio.run(announce(bus_settings, launched("cpu-1", now)))
    said: list[str] = []
    stack.down(local, progress=said.append)
    assert "ended 1 nodes on the ledger" in said
    assert any("never announced (cpu-2)" in line for line in said), said
    assert set(asyncio.run(released(bus_settings))) == {"cpu-1"}
    assert folder.started_at("cpu-2") is not None
    assert folder.recorded_end("cpu-2") is not None
    assert folder.pool_of("cpu-2") == "cpu"


def test_down_without_nats_keeps_the_recorded_ends_for_the_scaler(
    local: LocalStackSettings, bus_settings: BusSettings, nats_server: Any
) -> None:
    folder = NodeFolder(local.node_dir)
    folder.path.mkdir(parents=True)
    node = kept(folder, "cpu-1", ["sleep", "60"])
    nats_server.stop()
    said: list[str] = []
    started = time.monotonic()
    stack.down(local, progress=said.append)
    assert time.monotonic() - started < 20
    assert not session_processes(node.record.pid)
    assert any("the ledger was not told of the stopped nodes" in line for line in said), said
    end = folder.recorded_end("cpu-1")
    assert end is not None
    assert end.source is NodeEndSource.RECORDED
    assert folder.pool_of("cpu-1") == "cpu"
