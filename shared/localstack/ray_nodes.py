"""Ray worker nodes as local processes: each a `ray start` with its own ports and session.

Several Ray nodes on one host each need their own ports (node manager, object manager,
worker range, dashboard agent, metrics, runtime-env agent): with the defaults a second
node's dashboard agent cannot bind, and job submission then answers "No available agent".
Each node gets a block of ports above Ray's default worker range (10002-19999).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shared.localstack import node_keeper
from shared.localstack.confinement import Confinement
from shared.localstack.processes import ProcessRecord, spawn

PORT_BLOCK = 64
"""Ports per node: six service ports, then the rest for its worker processes."""


@dataclass(frozen=True)
class NodeShape:
    """What a node declares to Ray: its size, custom resources and labels."""

    num_cpus: float
    num_gpus: int
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodePorts:
    base: int

    @property
    def node_manager(self) -> int:
        return self.base

    def argv(self) -> list[str]:
        b = self.base
        return [
            f"--node-manager-port={b}",
            f"--object-manager-port={b + 1}",
            f"--dashboard-agent-listen-port={b + 2}",
            f"--dashboard-agent-grpc-port={b + 3}",
            f"--metrics-export-port={b + 4}",
            f"--runtime-env-agent-port={b + 5}",
            f"--min-worker-port={b + 8}",
            f"--max-worker-port={b + PORT_BLOCK - 1}",
        ]


_PLATFORM_KEYS = ("SPOTRAIN_NATS_", "SPOTRAIN_CREDENTIALS", "SPOTRAIN_SLACK_")
"""What names a platform credential: a Ray node's processes (and every job on it) inherit
its environment, so these never reach one."""


def node_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a Ray node: none of the platform's credentials (the scaler that
    starts a node holds its own NATS password), and this Python's bin folder first on
    PATH, so a job's `python train.py` runs with the interpreter (and packages) the
    platform runs with."""
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    kept = {
        key: value
        for key, value in env.items()
        if not key.startswith(_PLATFORM_KEYS)
        and not (key.startswith("SPOTRAIN_") and key.endswith(("PASSWORD", "TOKEN", "SECRET")))
    }
    return {**kept, "PATH": f"{bin_dir}{os.pathsep}{path}" if path else bin_dir}


def ray_binary() -> str:
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


def node_temp_dir(node_dir: Path, name: str) -> Path:
    """A worker node's own Ray temp dir. Nodes on one machine must not share one: each
    node's runtime-env agent unpacks and deletes working directories under it, and with one
    folder for all, a job lost its working directory under another node's hands ("can't
    open file", seen under preemptions). Short on purpose: Ray puts Unix sockets under it."""
    digest = hashlib.sha256(f"{node_dir.resolve()}/{name}".encode()).hexdigest()[:10]
    return Path("/tmp") / f"sr-{digest}"  # noqa: S108  # socket path length


def share_head_logs(node_temp: Path, head_temp: Path) -> None:
    """Point the node's session log folder at the head's. Ray's job supervisor writes a
    driver's output in its own node's log folder, while the dashboard reads the job's log
    where the job began; on real clusters every node uses the same path (`/tmp/ray`), so
    the two meet. Here they meet through this link."""
    session = (head_temp / "session_latest").resolve()
    if not session.name.startswith("session_"):
        return  # no head session yet: the node keeps its own logs
    node_session = node_temp / session.name
    node_session.mkdir(parents=True, exist_ok=True)
    logs = node_session / "logs"
    if not logs.exists():
        logs.symlink_to(session / "logs", target_is_directory=True)


def worker_argv(
    gcs_address: str, shape: NodeShape, ports: NodePorts, temp_dir: Path | None = None
) -> list[str]:
    return [
        ray_binary(),
        "start",
        f"--address={gcs_address}",
        "--block",
        f"--num-cpus={shape.num_cpus:g}",
        f"--num-gpus={shape.num_gpus}",
        f"--resources={json.dumps(dict(shape.resources), sort_keys=True)}",
        f"--labels={json.dumps(dict(shape.labels), sort_keys=True)}",
        "--disable-usage-stats",
        *([f"--temp-dir={temp_dir}"] if temp_dir is not None else []),
        *ports.argv(),
    ]


def start_worker(
    name: str,
    gcs_address: str,
    shape: NodeShape,
    ports: NodePorts,
    *,
    log_dir: Path,
    env: Mapping[str, str],
    record_file: Path,
    alive_file: Path,
    ended_file: Path,
    temp_dir: Path | None = None,
    confinement: Confinement | None = None,
) -> ProcessRecord:
    """Start one worker node in its own session, under its keeper (which writes the node's
    process record to `record_file` before the node starts, stamps `alive_file` while it
    runs and records its exit in `ended_file`); stop it with `stop_session(record.pid)`.
    The keeper stays outside the `confinement` it starts the node in."""
    log = log_dir / f"node-{name}.log"
    files = (record_file, log, alive_file, ended_file)
    keeper = [sys.executable, str(Path(node_keeper.__file__)), *map(str, files)]
    node = worker_argv(gcs_address, shape, ports, temp_dir)
    return spawn(
        name,
        [*keeper, "--", *(confinement.argv(node) if confinement else node)],
        log_path=log,
        env=node_env(env),
        cwd=log_dir,
        detached=True,
    )
