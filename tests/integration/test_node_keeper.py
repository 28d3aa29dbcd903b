"""The local node keeper: real processes, stopped the ways a local node stops (a release,
its own exit, a kill of its whole session), and what the node folder then records."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from shared.events.data import NodeEndSource
from shared.localstack import node_keeper
from shared.localstack.nodes import LocalNode, NodeFolder, kill_node
from shared.localstack.processes import (
    ProcessRecord,
    is_running,
    session_processes,
    spawn,
    stop_session,
)


def kept(folder: NodeFolder, name: str, argv: list[str], *, save: bool = True) -> LocalNode:
    """A node under its keeper, recorded in the folder as the local provider records it
    (`save`: the launcher's copy of the record too, beside the keeper's own)."""
    folder.describe(name, "cpu", "on-demand")
    folder.record_start(name, datetime.now(UTC))
    keeper = [sys.executable, node_keeper.__file__]
    log = folder.path / f"{name}.log"
    files = [folder.path / f"{name}.json", log, folder.alive_file(name), folder.ended_file(name)]
    record = spawn(
        name,
        [*keeper, *map(str, files), "--", *argv],
        log_path=log,
        env=os.environ,
        cwd=folder.path,
        detached=True,
    )
    if save:
        record.save(folder.path / f"{name}.json")
    deadline = time.monotonic() + 10
    while not folder.alive_file(name).exists():
        assert time.monotonic() < deadline, "the keeper never stamped the node alive"
        time.sleep(0.02)
    return LocalNode(name, "cpu", None, record)


def wait_gone(node: LocalNode) -> None:
    deadline = time.monotonic() + 10
    while is_running(node.record):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_node_that_exits_by_itself_has_its_exit_recorded(tmp_path: Path) -> None:
    folder = NodeFolder(tmp_path)
    node = kept(folder, "cpu-1", ["sleep", "0.5"])
    wait_gone(node)
    end = folder.recorded_end("cpu-1")
    assert end is not None
    assert end.source is NodeEndSource.RECORDED
    assert abs((datetime.now(UTC) - end.at).total_seconds()) < 5


def test_a_released_node_stops_and_records_its_end_once(tmp_path: Path) -> None:
    folder = NodeFolder(tmp_path)
    node = kept(folder, "cpu-1", ["sleep", "60"])
    before = datetime.now(UTC)
    folder.stop(node, grace_s=5)
    after = datetime.now(UTC)
    assert not session_processes(node.record.pid)
    assert folder.was_released("cpu-1")
    end = folder.recorded_end("cpu-1")
    assert end is not None
    assert end.source is NodeEndSource.RECORDED
    assert before <= end.at <= after
    folder.record_end("cpu-1", after.replace(year=2030))  # a late writer changes nothing
    assert folder.recorded_end("cpu-1") == end


def test_a_node_whose_ray_dies_alone_is_recorded_by_its_keeper(tmp_path: Path) -> None:
    folder = NodeFolder(tmp_path)
    node = kept(folder, "cpu-1", ["sleep", "60"])
    [child] = [pid for pid in session_processes(node.record.pid) if pid != node.record.pid]
    killed_at = datetime.now(UTC)
    os.kill(child, signal.SIGKILL)
    wait_gone(node)
    end = folder.recorded_end("cpu-1")
    assert end is not None
    assert end.source is NodeEndSource.RECORDED
    assert 0 <= (end.at - killed_at).total_seconds() < 2


def test_a_session_killed_at_once_leaves_its_last_stamp_within_a_heartbeat(
    tmp_path: Path,
) -> None:
    """No process outlives a SIGKILL of the session: the alive stamp is what is left."""
    folder = NodeFolder(tmp_path)
    node = kept(folder, "cpu-1", ["sleep", "60"])
    time.sleep(1)
    kill_node(node.record)
    killed_at = datetime.now(UTC)
    wait_gone(node)
    end = folder.recorded_end("cpu-1")
    assert end is not None
    assert end.source is NodeEndSource.LAST_SEEN
    assert 0 <= (killed_at - end.at).total_seconds() <= node_keeper.HEARTBEAT_S + 0.2


def test_the_keeper_records_its_node_before_the_node_starts(tmp_path: Path) -> None:
    """With no launcher left to save it (a scaler killed mid-launch), the node is still on
    record, as the keeper that runs it, so it is listed, billed, preempted and stopped."""
    folder = NodeFolder(tmp_path / "nodes")
    folder.path.mkdir()
    node = kept(folder, "cpu-1", ["sleep", "60"], save=False)
    try:
        record = ProcessRecord.load(folder.path / "cpu-1.json")
        assert record is not None
        assert (record.name, record.pid) == ("cpu-1", node.record.pid)
        assert record.start_ticks == node.record.start_ticks
        assert is_running(record)
        assert [n.name for n in folder.running()] == ["cpu-1"]
    finally:
        stop_session(node.record.pid, grace_s=0)


def test_a_node_that_fails_by_itself_is_started_again_without_what_it_left(
    tmp_path: Path,
) -> None:
    """As Kubernetes restarts a pod's container: a worker's `ray start` that exits with an
    error (its raylet lost its head for good) is started again, once whatever it left is
    killed, orphans in sessions of their own included (Ray's job drivers); the node does
    not end."""
    folder = NodeFolder(tmp_path)
    runs = tmp_path / "runs"
    orphan_pid = tmp_path / "orphan.pid"
    script = (
        f"echo run >> {runs}\n"
        f"if [ $(wc -l < {runs}) -eq 1 ]; then\n"
        # A driver in its own session whose parent is gone: reparented to the keeper.
        f'  setsid sh -c "echo \\$\\$ > {orphan_pid}; exec sleep 300" &\n'
        f"  sleep 0.5; exit 1\n"
        f"fi\n"
        f"exec sleep 300\n"
    )
    node = kept(folder, "cpu-1", ["sh", "-c", script])
    try:
        deadline = time.monotonic() + 15
        while not runs.exists() or len(runs.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, "the node was not started again"
            time.sleep(0.05)
        orphan = int(orphan_pid.read_text())
        assert not Path(f"/proc/{orphan}").exists() or (
            Path(f"/proc/{orphan}/stat").read_text().split()[2] in ("Z", "X")
        ), "the orphan of the failed run outlived it"
        assert is_running(node.record)
        assert not folder.ended_file("cpu-1").exists()
    finally:
        stop_session(node.record.pid, grace_s=2)
    end = folder.recorded_end("cpu-1")
    assert end is not None
    assert end.source is NodeEndSource.RECORDED
