"""The preemption watcher as it runs: its own process, configured by environment, relaying
every source it is given (Pub/Sub, Kubernetes, the local node folder) onto a real bus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.events import decode
from shared.events.data import NodeLost, NodePreempting, NoticeSource
from shared.localstack.nodes import NodeFolder
from shared.localstack.ports import free_port
from shared.localstack.processes import spawn, stop_session
from shared.localstack.settings import LocalStackSettings
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.async_helpers import eventually
from tests.fakes.k8s_server import FakeKubernetes, serve_fake_kubernetes
from tests.fakes.pubsub_server import FakeSubscription, serve_fake_pubsub

pytestmark = pytest.mark.integration

DATA = Path(__file__).parent.parent / "data"
SUBSCRIPTION = "projects/spotrain-test/subscriptions/preemptions"


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "watcher", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "watcher"}}],
                "current-context": "fake",
            }
        )
    )
    return path


@pytest.fixture
def pubsub() -> Iterator[FakeSubscription]:
    with serve_fake_pubsub(FakeSubscription(SUBSCRIPTION)) as subscription:
        yield subscription


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with serve_fake_kubernetes(FakeKubernetes()) as fake:
        yield fake


async def test_the_watcher_relays_every_configured_source_onto_the_bus(
    bus_settings: BusSettings,
    jetstream_bus: JetStreamBus,
    pubsub: FakeSubscription,
    kube: FakeKubernetes,
    tmp_path: Path,
) -> None:
    healthy: dict[str, Any] = json.loads((DATA / "k8s/gke-spot-node.json").read_text())
    kube.add_node(healthy)
    home = tmp_path / "home"
    # A local node: any process with a record in the node folder will do.
    folder = NodeFolder(LocalStackSettings(home=home).node_dir)
    folder.describe("gpu-spot-1", "gpu-spot", "spot")
    node = spawn(
        "gpu-spot-1",
        [sys.executable, "-c", "import time; time.sleep(120)"],
        log_path=tmp_path / "node.log",
        env={},
        cwd=tmp_path,
    )
    node.save(folder.path / "gpu-spot-1.json")
    env = {
        **os.environ,
        "SPOTRAIN_NATS_URL": bus_settings.nats_url,
        "SPOTRAIN_SUBJECT_PREFIX": bus_settings.subject_prefix,
        "SPOTRAIN_PREEMPTION_WATCHER_SOURCES": '["local", "gce-pubsub", "k8s"]',
        "SPOTRAIN_PREEMPTION_WATCHER_LOCAL_HOME": str(home),
        "SPOTRAIN_PREEMPTION_WATCHER_PUBSUB_SUBSCRIPTION": SUBSCRIPTION,
        "SPOTRAIN_PREEMPTION_WATCHER_PUBSUB_ENDPOINT": pubsub.endpoint,
        "SPOTRAIN_PREEMPTION_WATCHER_K8S_KUBECONFIG": str(
            kubeconfig(tmp_path / "kubeconfig", kube.endpoint)
        ),
        "SPOTRAIN_PREEMPTION_WATCHER_HTTP_PORT": str(free_port()),
    }
    with subprocess.Popen(  # noqa: ASYNC220  # started once; the loop never waits on it
        [sys.executable, "-m", "services.preemption_watcher"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as watcher:
        try:
            pubsub.publish((DATA / "gce/preempted_spot_node.json").read_bytes())
            # A node is lost only to a watcher that saw it: wait for its list and watch.
            await eventually(lambda: any(r.is_watch for r in kube.requests), timeout_s=30)
            kube.delete_node(healthy["metadata"]["name"])
            now = datetime.now(UTC)
            folder.post_notice("gpu-spot-1", now + timedelta(seconds=30), now)

            async def relayed() -> list[NodePreempting | NodeLost]:
                stored = await jetstream_bus.read(f"{jetstream_bus.prefix}.node.>")
                return [decode(m.data).data for m in stored]  # type: ignore[misc]

            async def all_three() -> bool:
                return {s.source for s in await relayed()} == set(NoticeSource) - {
                    NoticeSource.METADATA
                }

            await eventually(all_three, timeout_s=30)
            signals = {(type(s).__name__, s.source): s for s in await relayed()}
            assert set(signals) == {
                ("NodePreempting", NoticeSource.GCE_PUBSUB),
                ("NodeLost", NoticeSource.K8S),
                ("NodePreempting", NoticeSource.LOCAL),
            }
            assert signals["NodeLost", NoticeSource.K8S].node == healthy["metadata"]["name"]
            assert signals["NodePreempting", NoticeSource.LOCAL].node == "gpu-spot-1"
            await eventually(lambda: len(pubsub.acks) == 1)
        finally:
            stop_session(node.pid, grace_s=0)
            watcher.send_signal(signal.SIGTERM)
            assert watcher.wait(timeout=30) == 0
            assert watcher.stderr is not None
            watcher.stderr.read()
