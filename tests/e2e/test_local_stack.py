"""`spotrain up`, `status`, a job and `down` on this machine, as a user runs them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.client import SpotrainClient
from shared.events.data import NodeEndSource, NodeReleased, ReleaseReason
from shared.localstack.nodes import NodeFolder, kill_node
from shared.localstack.processes import ProcessRecord, session_processes
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from tests.e2e.stack import sessions, spotrain, stack_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "stack"
    yield home
    # Whatever happened in the test, leave nothing running.
    env = {**os.environ, "SPOTRAIN_LOCAL_HOME": str(home)}
    spotrain(env, "down")


def test_up_status_a_job_and_down_leaves_nothing_running(home: Path) -> None:
    env = stack_env(home)
    started = time.monotonic()
    up = spotrain(env, "up", "--prometheus")
    up_s = time.monotonic() - started
    assert up.returncode == 0, up.stderr + up.stdout
    assert up_s < 60, f"spotrain up took {up_s:.1f}s"

    status = spotrain(env, "status")
    assert status.returncode == 0, status.stdout
    parts = ("nats", "ray-head", "submitter", "scaler", "preemption_watcher", "checkpointer")
    for part in (*parts, "ui", "prometheus"):
        assert part in status.stdout
    assert status.stdout.count("healthy") == 8

    first = sessions(home)
    again = spotrain(env, "up")
    assert again.returncode == 0, again.stderr
    assert sessions(home) == first, "a second `up` starts nothing new"

    # A job on a spot node, so that `down` has a pool node to stop too. (The demo, a run
    # preempted mid-way, is test_preemption's and test_observability's.)
    workdir = home.parent / "project"
    workdir.mkdir()
    (workdir / "hello.py").write_text("print('hello from a spot node')\n")
    job = spotrain(env, "submit", "hello.py", "--workdir", str(workdir), "--gpus", "1", "--spot",
                   "--wait", timeout_s=120)  # fmt: skip
    assert job.returncode == 0, job.stderr + job.stdout
    nodes = NodeFolder(LocalStackSettings(home=home).node_dir)
    assert [node.name for node in nodes.running()], "the job ran on a pool node"

    the_node_gone_while_unwatched_is_closed_at_its_recorded_end(env, home, nodes)

    leaders = sessions(home)
    assert "prometheus" in leaders, "a plain `down` stops what `up --prometheus` started"
    assert all(session_processes(pid) for pid in leaders.values())
    down = spotrain(env, "down")
    assert down.returncode == 0, down.stderr
    assert "stopped:" in down.stdout
    assert {pid: session_processes(pid) for pid in leaders.values()} == {
        pid: [] for pid in leaders.values()
    }
    assert spotrain(env, "status").returncode == 1
    assert nodes.running() == [], "the pool nodes went with the stack"


def the_node_gone_while_unwatched_is_closed_at_its_recorded_end(
    env: dict[str, str], home: Path, nodes: NodeFolder
) -> None:
    """The scaler and the watcher die; the node dies after them (its Ray processes killed,
    its keeper left to record the exit). A restarted scaler closes it at that end."""
    [node] = nodes.running()
    run = LocalStackSettings(home=home).run_dir
    for service in ("scaler", "preemption_watcher"):
        record = ProcessRecord.load(run / f"{service}.json")
        assert record is not None
        kill_node(record)  # SIGKILL, the whole session at once
    for pid in session_processes(node.record.pid):
        if pid != node.record.pid:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while (
        end := nodes.recorded_end(node.name)
    ) is None or end.source is not NodeEndSource.RECORDED:
        assert time.monotonic() < deadline, "the keeper never recorded the node's exit"
        time.sleep(0.1)
    time.sleep(1)  # the restart comes well after the end
    again = spotrain(env, "up")
    assert again.returncode == 0, again.stderr + again.stdout
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])
    released = asyncio.run(released_event(settings, node.name, deadline_s=30))
    assert released.reason is ReleaseReason.GONE_WHILE_UNWATCHED
    assert released.end_source is NodeEndSource.RECORDED
    assert released.released_at == end.at


async def released_event(settings: BusSettings, node: str, *, deadline_s: float) -> NodeReleased:
    deadline = time.monotonic() + deadline_s
    async with await SpotrainClient.connect(settings) as client:
        while True:
            for event in await client.cost_events():
                if isinstance(event.data, NodeReleased) and event.data.node == node:
                    return event.data
            assert time.monotonic() < deadline, f"{node} was never closed on the ledger"
            await asyncio.sleep(0.5)


def test_up_refuses_a_port_that_another_process_holds(home: Path) -> None:
    env = stack_env(home)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(env["SPOTRAIN_LOCAL_NATS_PORT"])))
        squatter.listen()
        result = spotrain(env, "up")
    assert result.returncode == 1
    port = env["SPOTRAIN_LOCAL_NATS_PORT"]
    assert result.stderr.strip() == (
        f"spotrain: error: port {port} for nats is already in use by another process; "
        "stop it or choose another port with SPOTRAIN_LOCAL_NATS_PORT"
    )
    assert sessions(home) == {}, "nothing was started"
