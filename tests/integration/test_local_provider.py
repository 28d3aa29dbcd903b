"""The local provider's listing against its node folder, with real processes under their
keepers (no Ray: the provider reads only the folder and the processes)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.scaler.adapters.local_ray import LocalPoolProvider
from shared.events.data import NodeEndSource
from shared.localstack.nodes import NodeFolder, take_back
from shared.localstack.processes import is_running, stop_session
from tests.integration.test_node_keeper import kept, wait_gone

pytestmark = pytest.mark.integration


def provider(folder: NodeFolder, tmp_path: Path) -> LocalPoolProvider:
    return LocalPoolProvider(
        gcs_address="127.0.0.1:1", state_dir=folder.path, log_dir=tmp_path, env={}
    )


def test_a_node_is_listed_from_its_start_record_and_once_gone_is_reported_stopped(
    tmp_path: Path,
) -> None:
    folder = NodeFolder(tmp_path / "nodes")
    folder.path.mkdir()
    pools = provider(folder, tmp_path)
    running = kept(folder, "cpu-1", ["sleep", "60"])
    dying = kept(folder, "cpu-2", ["sleep", "0.2"])
    try:
        wait_gone(dying)
        [listed] = asyncio.run(pools.nodes())
        assert (listed.name, listed.pool) == ("cpu-1", "cpu")
        assert listed.launched_at == folder.started_at("cpu-1")
        # Its process record is gone with it; its start record is not.
        assert not (folder.path / "cpu-2.json").exists()
        [gone] = asyncio.run(pools.stopped())
        assert (gone.name, gone.pool, gone.launched_at) == (
            "cpu-2",
            "cpu",
            folder.started_at("cpu-2"),
        )
        [end] = asyncio.run(pools.ended(["cpu-2"])).values()
        assert end.source is NodeEndSource.RECORDED
        assert end.at >= gone.launched_at
    finally:
        stop_session(running.record.pid, grace_s=0)


def test_a_node_whose_end_is_recorded_is_never_listed_again_even_while_it_exits(
    tmp_path: Path,
) -> None:
    """Its keeper writes the end, then exits: a listing in between must not sight it alive
    after the end it recorded (found in CI: a preempted node billed 40 ms past its end,
    then less once the end arrived)."""
    folder = NodeFolder(tmp_path / "nodes")
    folder.path.mkdir()
    pools = provider(folder, tmp_path)
    node = kept(folder, "cpu-1", ["sleep", "60"])
    try:
        folder.record_end("cpu-1", datetime.now(UTC))
        assert asyncio.run(pools.nodes()) == []
        assert [n.name for n in asyncio.run(pools.stopped())] == ["cpu-1"]
    finally:
        stop_session(node.record.pid, grace_s=0)


def test_a_preemption_records_the_end_once_the_node_is_gone(tmp_path: Path) -> None:
    folder = NodeFolder(tmp_path / "nodes")
    folder.path.mkdir()
    node = kept(folder, "cpu-1", ["sleep", "60"])
    _, killed_at = take_back(folder, "cpu-1", node.record)
    assert not is_running(node.record), "recorded while the node still ran"
    end = folder.recorded_end("cpu-1")
    assert end is not None
    assert end.at == killed_at
    assert asyncio.run(provider(folder, tmp_path).nodes()) == []
