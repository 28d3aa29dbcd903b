"""The `k8s` preemption source through the real `kubernetes` client, against a local fake of
the API server's Node list and watch."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from services.preemption_watcher.adapters.gke_node_pools import (
    NodePoolGraces,
    connect_cluster_manager,
)
from services.preemption_watcher.adapters.k8s_nodes import (
    KubernetesNodeSource,
    kubernetes_api_client,
)
from services.preemption_watcher.model import NodeSignal
from services.preemption_watcher.payloads.k8s_nodes import IMPENDING_TERMINATION_TAINT
from shared.events.data import NodeLost, NodePreempting, NoticeSource
from tests.async_helpers import eventually
from tests.fakes.clock import FixedClock
from tests.fakes.compute_server import FakeCompute
from tests.fakes.gke_server import FakeGke, FakeNodePool, serve_fake_gke
from tests.fakes.k8s_server import FakeKubernetes, serve_fake_kubernetes

pytestmark = pytest.mark.integration

DATA = Path(__file__).parents[1] / "data" / "k8s"
SPOT = json.loads((DATA / "gke-spot-node.json").read_text())
SCALE_DOWN = json.loads((DATA / "gke-spot-node-scale-down.json").read_text())
SCALE_DOWN_SHUTTING_DOWN = json.loads(
    (DATA / "gke-spot-node-scale-down-shutting-down.json").read_text()
)
SPOT_NAME = SPOT["metadata"]["name"]
TAINTED_AT = datetime(2026, 11, 30, 11, 59, 58, tzinfo=UTC)


def spot_node(name: str, uid: str) -> dict[str, Any]:
    """Another node of the recorded spot pool."""
    node: dict[str, Any] = copy.deepcopy(SPOT)
    node["metadata"].update(name=name, uid=uid)
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return node


def add_termination_taint(node: dict[str, Any]) -> None:
    node["spec"]["taints"].append(
        {
            "key": IMPENDING_TERMINATION_TAINT,
            "effect": "NoSchedule",
            "timeAdded": TAINTED_AT.isoformat().replace("+00:00", "Z"),
        }
    )


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with serve_fake_kubernetes(FakeKubernetes()) as fake:
        yield fake


@pytest.fixture
def api_client(kube: FakeKubernetes) -> Iterator[ApiClient]:
    client = ApiClient(Configuration(host=kube.endpoint))
    yield client
    client.close()  # type: ignore[no-untyped-call]  # the package leaves it unannotated


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@dataclass
class Run:
    """A source's `signals()` running in a task, and what it has yielded so far."""

    stop: asyncio.Event
    task: asyncio.Task[None]
    seen: list[NodeSignal] = field(default_factory=list)


@asynccontextmanager
async def running(source: KubernetesNodeSource) -> AsyncIterator[Run]:
    stop = asyncio.Event()
    seen: list[NodeSignal] = []

    async def collect() -> None:
        async for signal in source.signals(stop):
            seen.append(signal)

    run = Run(stop=stop, task=asyncio.create_task(collect()), seen=seen)
    try:
        yield run
    finally:
        stop.set()
        await asyncio.wait_for(run.task, timeout=10)


def watches(kube: FakeKubernetes) -> list[dict[str, str]]:
    return [r.query for r in kube.requests if r.is_watch]


def lists(kube: FakeKubernetes) -> int:
    return sum(1 for r in kube.requests if not r.is_watch)


async def watching(kube: FakeKubernetes, count: int = 1) -> None:
    await eventually(lambda: len(watches(kube)) >= count)


async def test_a_taint_on_a_spot_node_is_one_notice(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """The termination taint added to a watched spot node yields one notice, with the
    spot deadline and the node's pool; the node's later changes do not repeat it (the
    deletion of another node afterwards shows they were read)."""
    other = spot_node("gke-spotrain-gpu-spot-5f1c2a3b-m3n9", "0d4c2a1e-7b6f-4e5d-9c8b-a7f6e5d4c3b2")
    kube.add_node(SPOT)
    kube.add_node(other)
    async with running(KubernetesNodeSource.over(api_client, clock)) as run:
        await watching(kube)
        kube.modify_node(SPOT_NAME, add_termination_taint)
        kube.modify_node(SPOT_NAME, lambda n: n["metadata"]["labels"].update(team="research"))
        kube.delete_node(other["metadata"]["name"])
        await eventually(lambda: len(run.seen) >= 2)
    notice, lost = run.seen
    assert notice.data == NodePreempting(
        node=SPOT_NAME,
        pool="gpu-spot",
        deadline=TAINTED_AT + timedelta(seconds=15),
        source=NoticeSource.K8S,
    )
    assert isinstance(lost.data, NodeLost)
    assert lost.data.node == other["metadata"]["name"]


async def test_a_deleted_node_is_lost(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """A node deleted while watched yields a loss at the time it was seen."""
    kube.add_node(SPOT)
    async with running(KubernetesNodeSource.over(api_client, clock)) as run:
        await watching(kube)
        kube.delete_node(SPOT_NAME)
        await eventually(lambda: len(run.seen) >= 1)
    (lost,) = run.seen
    assert lost.key == f"{SPOT['metadata']['uid']}:deleted"
    assert lost.data == NodeLost(
        node=SPOT_NAME, pool="gpu-spot", source=NoticeSource.K8S, lost_at=clock.now()
    )


async def test_a_relist_after_410_repeats_signals_under_the_same_keys(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """A node tainted before the watcher started is told at the list; after a 410 the
    relist tells it again under the same key, so the bus drops the repeat."""
    tainted = copy.deepcopy(SPOT)
    add_termination_taint(tainted)
    kube.add_node(tainted)
    source = KubernetesNodeSource.over(api_client, clock, relist_delay_s=0.05)
    async with running(source) as run:
        await eventually(lambda: len(run.seen) == 1)
        await watching(kube)
        clock.advance(timedelta(minutes=5))
        kube.compact()
        await eventually(lambda: len(run.seen) == 2)
        await watching(kube, 3)
    assert lists(kube) == 2
    first, second = run.seen
    assert first.key == second.key
    assert first.event_id == second.event_id
    assert isinstance(second.data, NodePreempting)
    assert second.data.deadline == TAINTED_AT + timedelta(seconds=15)


async def test_a_node_gone_between_lists_is_lost_on_relist(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """A node deleted while no watch could tell (the history compacted away) is found
    missing by the relist and reported lost under the key its deletion would have had."""
    other = spot_node("gke-spotrain-gpu-spot-5f1c2a3b-m3n9", "0d4c2a1e-7b6f-4e5d-9c8b-a7f6e5d4c3b2")
    kube.add_node(SPOT)
    kube.add_node(other)
    source = KubernetesNodeSource.over(api_client, clock, relist_delay_s=0.05)
    async with running(source) as run:
        await watching(kube)
        with kube.held():
            kube.delete_node(SPOT_NAME)
            kube.compact()
        await eventually(lambda: len(run.seen) >= 1)
        await watching(kube, 3)
    assert lists(kube) == 2
    (lost,) = run.seen
    assert lost.key == f"{SPOT['metadata']['uid']}:deleted"
    assert lost.data == NodeLost(
        node=SPOT_NAME, pool="gpu-spot", source=NoticeSource.K8S, lost_at=clock.now()
    )


async def test_a_cluster_autoscaler_scale_down_yields_nothing(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """The autoscaler's taint, and the shutdown of the VM it removes, are no notice; a
    notice on another node afterwards shows those events were read."""
    other = spot_node("gke-spotrain-gpu-spot-5f1c2a3b-m3n9", "0d4c2a1e-7b6f-4e5d-9c8b-a7f6e5d4c3b2")
    kube.add_node(SPOT)
    kube.add_node(other)
    async with running(KubernetesNodeSource.over(api_client, clock)) as run:
        await watching(kube)
        kube.modify_node(SPOT_NAME, lambda n: n.update(spec=copy.deepcopy(SCALE_DOWN["spec"])))
        kube.modify_node(
            SPOT_NAME,
            lambda n: n.update(status=copy.deepcopy(SCALE_DOWN_SHUTTING_DOWN["status"])),
        )
        kube.modify_node(other["metadata"]["name"], add_termination_taint)
        await eventually(lambda: len(run.seen) >= 1)
    (notice,) = run.seen
    assert notice.data.node == other["metadata"]["name"]


async def test_the_watch_resumes_where_the_server_ended_it(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """When the server ends a watch, the source watches again from the last version it
    saw, without listing again, and still hears what comes next."""
    kube.add_node(SPOT)
    async with running(KubernetesNodeSource.over(api_client, clock)) as run:
        await watching(kube)
        relabelled = kube.modify_node(
            SPOT_NAME, lambda n: n["metadata"]["labels"].update(team="research")
        )
        await asyncio.sleep(0.2)
        kube.close_watches()
        await watching(kube, 2)
        kube.modify_node(SPOT_NAME, add_termination_taint)
        await eventually(lambda: len(run.seen) >= 1)
    assert lists(kube) == 1
    assert watches(kube)[1]["resourceVersion"] == relabelled["metadata"]["resourceVersion"]
    assert [type(s.data) for s in run.seen] == [NodePreempting]


async def test_stop_ends_a_waiting_watch_promptly(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """Setting `stop` ends `signals()` at once, though the watch would stay open for
    minutes, and leaves no watching thread behind."""
    kube.add_node(SPOT)
    async with running(KubernetesNodeSource.over(api_client, clock, watch_timeout_s=600)) as run:
        await watching(kube)
        await asyncio.sleep(0.1)
        started = time.monotonic()
        run.stop.set()
        await asyncio.wait_for(run.task, timeout=5)
        elapsed_s = time.monotonic() - started
    assert elapsed_s < 1.0
    assert run.seen == []
    assert not any(t.name == "k8s-node-watch" for t in threading.enumerate())


async def test_a_refused_list_ends_the_source_with_its_error(
    kube: FakeKubernetes, clock: FixedClock
) -> None:
    """An API server that refuses the list ends `signals()` with the client's error, for
    the runtime to start it again."""
    wrong = ApiClient(Configuration(host=f"{kube.endpoint}/elsewhere"))
    try:
        source = KubernetesNodeSource.over(wrong, clock)
        with pytest.raises(ApiException) as raised:
            async for _ in source.signals(asyncio.Event()):
                pass
    finally:
        wrong.close()  # type: ignore[no-untyped-call]
    assert raised.value.status == 404


async def test_the_production_client_follows_a_kubeconfig(
    kube: FakeKubernetes,
    clock: FixedClock,
    tmp_path: Path,
) -> None:
    """The production client reads a kubeconfig: its server, its credentials."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": kube.endpoint}}],
                "users": [{"name": "watcher", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "watcher"}}],
                "current-context": "fake",
            }
        )
    )
    tainted = copy.deepcopy(SPOT)
    add_termination_taint(tainted)
    kube.add_node(tainted)
    client = kubernetes_api_client(kubeconfig)
    try:
        async with running(KubernetesNodeSource.over(client, clock)) as run:
            await eventually(lambda: len(run.seen) >= 1)
    finally:
        client.close()  # type: ignore[no-untyped-call]
    assert [s.data.node for s in run.seen] == [SPOT_NAME]
    (listed,) = [r for r in kube.requests if not r.is_watch]
    assert listed.authorization == "Bearer not-a-secret"


async def test_a_maintenance_scheduled_days_ahead_is_told_once_it_is_near(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """Issue 20, 7: GKE labels a GPU node with its host maintenance's time, maybe days
    ahead, and the label does not change as the time comes: the source reads its nodes
    again at each watch's end, and tells the notice once within the hour."""
    when = clock.now() + timedelta(days=2)

    def schedule(node: dict[str, Any]) -> None:
        labels = node["metadata"]["labels"]
        labels["cloud.google.com/scheduled-maintenance-time"] = str(int(when.timestamp()))
        del labels["cloud.google.com/gke-spot"]

    kube.add_node(SPOT)
    kube.modify_node(SPOT_NAME, schedule)
    async with running(KubernetesNodeSource.over(api_client, clock)) as run:
        await watching(kube)
        kube.close_watches()
        await watching(kube, 2)
        assert run.seen == []
        clock.advance(timedelta(days=2) - timedelta(minutes=30))
        kube.close_watches()
        await eventually(lambda: len(run.seen) == 1)
    (signal,) = run.seen
    assert isinstance(signal.data, NodePreempting)
    assert signal.data.deadline == when


async def test_a_node_pools_longer_shutdown_grace_is_its_notice(
    kube: FakeKubernetes, api_client: ApiClient, clock: FixedClock
) -> None:
    """Issue 36, 4: a Spot node pool given 120 s of shutdown grace (15 of them for critical
    pods) gives a training pod 105 s; the source reads it from the GKE API through the real
    client, and a pool it cannot find keeps GKE's default 15 s."""
    compute = FakeCompute(project="proj", zones=["europe-west4-a"])
    gke = FakeGke(
        project="proj",
        location="europe-west4",
        cluster="train",
        compute=compute,
        pools={
            "gpu-spot": FakeNodePool(
                "gpu-spot",
                [],
                kubelet_config={
                    "shutdownGracePeriodSeconds": 120,
                    "shutdownGracePeriodCriticalPodsSeconds": 15,
                },
            )
        },
    )
    other = spot_node("gke-spotrain-gpu-old-5f1c2a3b-m3n9", "0d4c2a1e-7b6f-4e5d-9c8b-a7f6e5d4c3b2")
    other["metadata"]["labels"]["cloud.google.com/gke-nodepool"] = "gpu-old"
    kube.add_node(SPOT)
    kube.add_node(other)
    with serve_fake_gke(gke):
        graces = NodePoolGraces(
            connect_cluster_manager(gke.endpoint),
            "projects/proj/locations/europe-west4/clusters/train",
            clock=time.monotonic,
        )
        async with running(KubernetesNodeSource.over(api_client, clock, graces=graces)) as run:
            await watching(kube)
            kube.modify_node(SPOT_NAME, add_termination_taint)
            kube.modify_node(other["metadata"]["name"], add_termination_taint)
            await eventually(lambda: len(run.seen) >= 2)
    deadlines = {
        s.data.node: s.data.deadline for s in run.seen if isinstance(s.data, NodePreempting)
    }
    assert deadlines == {
        SPOT_NAME: TAINTED_AT + timedelta(seconds=105),
        other["metadata"]["name"]: TAINTED_AT + timedelta(seconds=15),
    }
