"""Where a multi-node job's driver runs, on a real Ray cluster: a head and a node of the
drivers' own (no CPUs, labelled as the chart's drivers group is). With the submitter's
`driver_labels`, Ray runs the driver there, off the head where Ray's job API answers;
without them, on the head."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ray.util.state import list_nodes

from services.submitter.adapters.ray_jobs import RayJobSubmission
from services.submitter.model import RayJobState, SubmissionPlan
from shared.localstack.ports import free_port, free_port_below, free_port_block
from shared.localstack.processes import spawn, stop_session
from shared.localstack.ray_nodes import (
    PORT_BLOCK,
    NodePorts,
    NodeShape,
    node_env,
    ray_binary,
    worker_argv,
)
from shared.ray_head import RayHeadUnavailableError
from tests.async_helpers import eventually

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]

DRIVERS = {"spotrain-role": "driver"}
ASKS_NOTHING = "python -c pass"


@dataclass(frozen=True)
class Cluster:
    dashboard: str
    root: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("drivers")
    gcs, dashboard = free_port_below(10_000), free_port_below(10_000, start=8000)
    temp = Path("/tmp") / f"sr-drv-{os.getpid()}"  # Ray's socket paths are short
    env = node_env({**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    head = spawn(
        "head",
        [
            ray_binary(), "start", "--head", "--block", f"--port={gcs}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={free_port()}", "--num-cpus=0", "--num-gpus=0",
            f"--temp-dir={temp}", "--disable-usage-stats",
            *NodePorts(free_port_block(PORT_BLOCK)).argv(),
        ],
        log_path=root / "head.log", env=env, cwd=root,
    )  # fmt: skip
    drivers = spawn(
        "drivers",
        worker_argv(
            f"127.0.0.1:{gcs}",
            NodeShape(num_cpus=0, num_gpus=0, labels=DRIVERS),
            NodePorts(free_port_block(PORT_BLOCK)),
            temp_dir=Path(f"{temp}-d"),
        ),
        log_path=root / "drivers.log", env=env, cwd=root,
    )  # fmt: skip
    try:
        yield Cluster(dashboard=f"http://127.0.0.1:{dashboard}", root=root)
    finally:
        for record in (drivers, head):
            stop_session(record.pid, grace_s=5)


async def driver_labels(cluster: Cluster, selector: dict[str, str], name: str) -> dict[str, str]:
    """Run a driver that asks for nothing, with `selector`: the labels of the node Ray ran
    it on (as Ray's job API says; from within, `ray.init()` on a host of several nodes may
    join another node's raylet)."""
    ray = RayJobSubmission(cluster.dashboard)
    plan = SubmissionPlan(
        submission_id=name, entrypoint=ASKS_NOTHING,
        entrypoint_num_cpus=0,
        entrypoint_num_gpus=0, entrypoint_memory_bytes=0, entrypoint_resources={},
        entrypoint_label_selector=selector, env_vars={}, pip=(), metadata={},
    )  # fmt: skip

    async def submitted() -> bool:
        try:
            await ray.submit(plan, None)
        except (RayHeadUnavailableError, RuntimeError):
            return False  # the dashboard or its job agent still starting
        return True

    await eventually(submitted, timeout_s=60, interval_s=1)

    async def ended() -> bool:
        status = await ray.status(name)
        return status is not None and status.state in (RayJobState.SUCCEEDED, RayJobState.FAILED)

    await eventually(ended, timeout_s=90, interval_s=0.5)
    status = await ray.status(name)
    assert status is not None
    assert status.state is RayJobState.SUCCEEDED, status.message
    node = (await asyncio.to_thread(ray._connect().get_job_info, name)).driver_node_id
    nodes = await asyncio.to_thread(list_nodes, address=cluster.dashboard, detail=True)
    [labels] = [dict(n.labels or {}) for n in nodes if n.node_id == node]
    return labels


async def test_a_driver_with_the_drivers_labels_runs_on_their_node(cluster: Cluster) -> None:
    labels = await driver_labels(cluster, DRIVERS, "multi-node-driver")
    assert labels.get("spotrain-role") == "driver", labels


async def test_without_them_it_runs_on_the_head(cluster: Cluster) -> None:
    labels = await driver_labels(cluster, {}, "driver-on-the-head")
    assert "spotrain-role" not in labels, labels
