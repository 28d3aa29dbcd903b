"""A local preemption on real processes: the notice and the kill that `spotrain preempt`
delivers, and what the watcher's local source makes of them."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.preemption_watcher.adapters.local import LocalNodeSource
from shared.events.data import NodeLost, NodePreempting
from shared.localstack.nodes import NodeFolder, pick_node, preempt
from shared.localstack.processes import is_running, session_processes, spawn, stop_session
from tests.fakes.clock import FixedClock

pytestmark = pytest.mark.integration

# A node stand-in that, like Ray's job supervisor, starts its job's driver in a session of
# its own; the driver writes its pid so the test can watch it.
NODE = """
import subprocess, sys, time
driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                          start_new_session=True)
open(sys.argv[1], "w").write(str(driver.pid))
time.sleep(60)
"""


def start_node(folder: NodeFolder, tmp: Path, name: str, capacity: str = "spot") -> int:
    pid_file = tmp / f"{name}.driver"
    record = spawn(
        name,
        [sys.executable, "-c", NODE, str(pid_file)],
        log_path=tmp / f"{name}.log",
        env={},
        cwd=tmp,
    )
    folder.describe(name, "gpu-spot", capacity)
    record.save(folder.path / f"{name}.json")
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the node did not start its driver"
        time.sleep(0.05)
    return int(pid_file.read_text())


def test_a_preemption_posts_its_notice_then_kills_the_node_and_its_drivers(
    tmp_path: Path,
) -> None:
    folder = NodeFolder(tmp_path / "nodes")
    driver = start_node(folder, tmp_path, "gpu-spot-1")
    source = LocalNodeSource(folder.path, FixedClock())
    assert source.look() == [], "a running node is news to no one"

    node = pick_node(folder, None, capacity="spot")
    seen: list[NodePreempting | NodeLost] = []

    def while_noticed(_: float) -> None:
        # Between the notice and the kill: the watcher sees the notice, the node still runs.
        seen.extend(signal.data for signal in source.look())
        assert is_running(node.record)

    done = preempt(folder, node, notice_s=5, sleep=while_noticed)
    assert done.notice is not None
    assert done.processes >= 2, "the node and the driver in its own session"
    [notice] = seen
    assert isinstance(notice, NodePreempting)
    assert (notice.node, notice.pool, notice.deadline) == (
        "gpu-spot-1",
        "gpu-spot",
        done.notice.deadline,
    )

    deadline = time.monotonic() + 5
    while session_processes(node.record.pid) or Path(f"/proc/{driver}").exists():
        assert time.monotonic() < deadline, "the node or its driver survived the kill"
        stop_session(node.record.pid, grace_s=0)  # reaps the killed leader
        time.sleep(0.05)
    lost = [s.data for s in source.look() if isinstance(s.data, NodeLost)]
    assert [(s.node, s.pool) for s in lost] == [("gpu-spot-1", "gpu-spot")]
    # When the node was killed, as its folder recorded it: not when the watcher looked.
    assert lost[0].lost_at == done.killed_at
    again = [s.data for s in source.look() if isinstance(s.data, NodeLost)]
    assert again == [], "a loss is said once"


def test_a_released_node_is_not_a_loss(tmp_path: Path) -> None:
    folder = NodeFolder(tmp_path / "nodes")
    start_node(folder, tmp_path, "gpu-spot-2")
    source = LocalNodeSource(folder.path, FixedClock(datetime.now(UTC)))
    source.look()
    [node] = folder.running()
    folder.mark_released(node.name)
    stop_session(node.record.pid, grace_s=2)
    assert source.look() == []


def test_pick_node_names_what_is_running_when_the_node_is_not(tmp_path: Path) -> None:
    folder = NodeFolder(tmp_path / "nodes")
    start_node(folder, tmp_path, "gpu-on-demand-1", capacity="on-demand")
    try:
        with pytest.raises(LookupError, match="running nodes: gpu-on-demand-1"):
            pick_node(folder, "gpu-spot-7")
        with pytest.raises(LookupError, match="no running node to preempt of spot capacity"):
            pick_node(folder, None, capacity="spot")
    finally:
        for node in folder.running():
            stop_session(node.record.pid, grace_s=0)
