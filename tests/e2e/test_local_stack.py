"""`spotrain up`, `status`, a job and `down` on this machine, as a user runs them."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.localstack.nodes import NodeFolder
from shared.localstack.processes import session_processes
from shared.localstack.settings import LocalStackSettings
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
    for part in (*parts, "prometheus"):
        assert part in status.stdout
    assert status.stdout.count("healthy") == 7

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
