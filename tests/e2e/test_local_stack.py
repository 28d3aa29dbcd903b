"""`spotrain up`, `status`, `demo` and `down` on this machine, as a user runs them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.localstack.ports import free_port, free_port_below, free_port_block
from shared.localstack.processes import ProcessRecord, session_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def spotrain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from shared.cli.entry import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def stack_env(home: Path) -> dict[str, str]:
    """A stack of its own: its own state directory and free ports for everything."""
    nats_port = free_port()
    service_base = free_port()
    return {
        **os.environ,
        "SPOTRAIN_LOCAL_HOME": str(home),
        "SPOTRAIN_LOCAL_NATS_PORT": str(nats_port),
        "SPOTRAIN_LOCAL_NATS_MONITOR_PORT": str(free_port()),
        "SPOTRAIN_LOCAL_RAY_GCS_PORT": str(free_port_below(10_000)),
        "SPOTRAIN_LOCAL_RAY_DASHBOARD_PORT": str(free_port_below(10_000)),
        "SPOTRAIN_LOCAL_RAY_CLIENT_PORT": str(free_port_below(10_000)),
        "SPOTRAIN_LOCAL_RAY_HEAD_PORT_BASE": str(free_port_block(64)),
        "SPOTRAIN_LOCAL_SERVICE_PORT_BASE": str(service_base),
        "SPOTRAIN_NATS_URL": f"nats://127.0.0.1:{nats_port}",
    }


def sessions(home: Path) -> dict[str, int]:
    return {
        path.stem: ProcessRecord(**json.loads(path.read_text())).pid
        for path in (home / "run").glob("*.json")
    }


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "stack"
    yield home
    # Whatever happened in the test, leave nothing running.
    env = {**os.environ, "SPOTRAIN_LOCAL_HOME": str(home)}
    spotrain(env, "down")


def test_up_status_demo_down_leaves_nothing_running(home: Path) -> None:
    env = stack_env(home)
    started = time.monotonic()
    up = spotrain(env, "up")
    up_s = time.monotonic() - started
    assert up.returncode == 0, up.stderr + up.stdout
    assert up_s < 60, f"spotrain up took {up_s:.1f}s"

    status = spotrain(env, "status")
    assert status.returncode == 0, status.stdout
    for part in ("nats", "ray-head", "submitter", "scaler", "preemption_watcher", "checkpointer"):
        assert part in status.stdout
    assert status.stdout.count("healthy") == 6

    first = sessions(home)
    again = spotrain(env, "up")
    assert again.returncode == 0, again.stderr
    assert sessions(home) == first, "a second `up` starts nothing new"

    demo = spotrain(env, "demo")
    assert demo.returncode == 0, demo.stderr + demo.stdout
    assert "the submitter accepted" in demo.stdout

    leaders = sessions(home)
    assert all(session_processes(pid) for pid in leaders.values())
    down = spotrain(env, "down")
    assert down.returncode == 0, down.stderr
    assert "stopped:" in down.stdout
    assert {pid: session_processes(pid) for pid in leaders.values()} == {
        pid: [] for pid in leaders.values()
    }
    assert spotrain(env, "status").returncode == 1


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
