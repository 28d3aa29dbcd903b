"""The kuberay pool provider through the real `kubernetes` client, against a local fake of the
API server's RayClusters and Pods; the test plays the KubeRay operator (`operate`) and the
scheduler (`schedule`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from services.scaler.adapters.kuberay import KubeRayError, KubeRayPoolProvider, connect_kubernetes
from services.scaler.adapters.node_history import BusNodeHistory
from services.scaler.bootstrap import _provider
from services.scaler.handlers import Deps, on_job_queued, reconcile
from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.settings import ScalerSettings
from shared.events import decode, new_event
from shared.events.data import JobQueued, NodeLaunched, NodeReleased, PoolResizeFailed
from shared.events.types import Bundle, CapacityClass
from shared.messaging.memory import InMemoryBus
from tests.fakes.clock import FixedClock
from tests.fakes.kuberay_server import MERGE_PATCH, FakeKubeRay, serve_fake_kuberay
from tests.fakes.scaler import InMemoryDemandStore, RecordingStatusBoard

pytestmark = pytest.mark.integration

DATA = Path(__file__).parents[1] / "data" / "kuberay"
CLUSTER = json.loads((DATA / "raycluster.json").read_text())
RUNNING = json.loads((DATA / "worker-pod-running.json").read_text())
NAMESPACE = "spotrain"
NAME = "spotrain"
SPOT = PoolSpec(
    name="gpu-spot",
    capacity=CapacityClass.SPOT,
    gpus=1,
    cpus=4,
    price_per_hour_usd=1.0,
    max_nodes=4,
)
CPU = PoolSpec(name="cpu", capacity=CapacityClass.ON_DEMAND, gpus=0, cpus=8, price_per_hour_usd=0.3)
TPU = PoolSpec(name="tpu", capacity=CapacityClass.SPOT, gpus=0, cpus=8, price_per_hour_usd=2.0)


class NoRay:
    """Ray's view, empty: no worker has joined yet."""

    async def nodes(self) -> dict[str, Any]:
        return {}

    async def drain_idle(self, node: str) -> str | None:
        return None


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def kube(clock: FixedClock) -> Iterator[FakeKubeRay]:
    fake = FakeKubeRay(namespace=NAMESPACE)
    fake.add_cluster(CLUSTER)
    fake.add_pod(RUNNING)  # gpu-spot's first worker, on its node
    fake.operate(NAME, clock.now())  # gpu-spot's second (Pending), cpu's one
    with serve_fake_kuberay(fake) as served:
        yield served


@pytest.fixture
def api(kube: FakeKubeRay) -> Iterator[ApiClient]:
    client = connect_kubernetes(kube.endpoint)
    yield client
    client.close()  # type: ignore[no-untyped-call]  # the package leaves it unannotated


@pytest.fixture
def provider(api: ApiClient) -> KubeRayPoolProvider:
    return KubeRayPoolProvider(api=api, cluster=NAME, namespace=NAMESPACE)


async def _names(provider: KubeRayPoolProvider, pool: str) -> list[str]:
    return sorted(n.name for n in await provider.nodes() if n.pool == pool)


async def test_nodes_are_the_worker_pods_by_node_or_placeholder(
    provider: KubeRayPoolProvider, kube: FakeKubeRay
) -> None:
    pending = [p["metadata"]["name"] for p in kube.pods_of(NAME, "gpu-spot")]
    pending.remove(RUNNING["metadata"]["name"])
    assert await _names(provider, "gpu-spot") == sorted(
        ["gke-training-gpu-spot-3f2a1b7c-x9k2", f"pending-{pending[0]}"]
    )
    assert len(await _names(provider, "cpu")) == 1
    selectors = {r.query["labelSelector"] for r in kube.requests if r.path.endswith("/pods")}
    assert selectors == {"ray.io/cluster=spotrain,ray.io/node-type=worker"}


async def test_launch_grows_the_group_and_its_pods_show_then_get_their_nodes(
    provider: KubeRayPoolProvider, kube: FakeKubeRay, clock: FixedClock
) -> None:
    assert await provider.launch(SPOT, 1) == [], "KubeRay names the pods, later"
    patches = [r for r in kube.requests if r.method == "PATCH"]
    assert [r.content_type for r in patches] == [MERGE_PATCH]
    assert kube.group(NAME, "gpu-spot")["replicas"] == 3
    assert kube.group(NAME, "cpu")["replicas"] == 1, "the other group as it was"

    clock.advance(timedelta(seconds=5))
    (created,) = kube.operate(NAME, clock.now())
    nodes = {n.name: n for n in await provider.nodes()}
    assert nodes[f"pending-{created}"].launched_at == clock.now()

    clock.advance(timedelta(seconds=60))
    kube.schedule(created, "gke-training-gpu-spot-new", clock.now())
    nodes = {n.name: n for n in await provider.nodes()}
    assert f"pending-{created}" not in nodes
    assert nodes["gke-training-gpu-spot-new"].pool == "gpu-spot"
    assert nodes["gke-training-gpu-spot-new"].launched_at == clock.now()


async def test_launch_stops_at_max_replicas(
    provider: KubeRayPoolProvider, kube: FakeKubeRay
) -> None:
    await provider.launch(SPOT, 10)
    assert kube.group(NAME, "gpu-spot")["replicas"] == 4
    await provider.launch(SPOT, 1)
    assert len([r for r in kube.requests if r.method == "PATCH"]) == 1, "nothing to patch"


async def test_release_removes_exactly_that_worker(
    provider: KubeRayPoolProvider, kube: FakeKubeRay, clock: FixedClock
) -> None:
    node = "gke-training-gpu-spot-3f2a1b7c-x9k2"
    others = [n for n in await _names(provider, "gpu-spot") if n != node]
    await provider.release(node)
    group = kube.group(NAME, "gpu-spot")
    assert group["replicas"] == 1
    assert group["scaleStrategy"]["workersToDelete"] == [RUNNING["metadata"]["name"]]
    await provider.release(node)  # asked again before KubeRay acted: no second replica off
    assert kube.group(NAME, "gpu-spot")["replicas"] == 1

    assert kube.operate(NAME, clock.now()) == []
    assert await _names(provider, "gpu-spot") == others
    await provider.release(node)  # gone: a no-op
    assert len([r for r in kube.requests if r.method == "PATCH"]) == 1


async def test_a_terminating_worker_is_no_longer_a_node(
    provider: KubeRayPoolProvider, kube: FakeKubeRay, clock: FixedClock
) -> None:
    kube.terminate(RUNNING["metadata"]["name"], clock.now())
    assert "gke-training-gpu-spot-3f2a1b7c-x9k2" not in await _names(provider, "gpu-spot")


async def test_api_errors_are_os_errors(provider: KubeRayPoolProvider, kube: FakeKubeRay) -> None:
    kube.fail_next = [500]
    with pytest.raises(KubeRayError, match=r"listing the worker pods.*500"):
        await provider.nodes()
    kube.fail_next = [503]
    with pytest.raises(OSError, match=r"reading RayCluster spotrain/spotrain.*503"):
        await provider.launch(SPOT, 1)
    with pytest.raises(KubeRayError, match="no worker group 'tpu'"):
        await provider.launch(TPU, 1)
    assert kube.group(NAME, "gpu-spot")["replicas"] == 2


async def test_a_cluster_changed_since_it_was_read_is_not_overwritten(
    provider: KubeRayPoolProvider, kube: FakeKubeRay
) -> None:
    """The patch carries the version it was computed from; a newer one refuses it (409)."""
    original = kube.answer

    def edit_between_read_and_patch(received: Any) -> Any:
        if received.method == "PATCH":
            kube.edit_cluster(NAME, {"metadata": {"labels": {"edited": "by-hand"}}})
        return original(received)

    kube.answer = edit_between_read_and_patch  # type: ignore[method-assign]
    with pytest.raises(KubeRayError, match="409"):
        await provider.launch(SPOT, 1)
    assert kube.group(NAME, "gpu-spot")["replicas"] == 2


async def test_the_cluster_missing_is_an_os_error(api: ApiClient) -> None:
    provider = KubeRayPoolProvider(api=api, cluster="other", namespace=NAMESPACE)
    with pytest.raises(KubeRayError, match="404"):
        await provider.launch(SPOT, 1)


def scaler_deps(
    bus: InMemoryBus, provider: KubeRayPoolProvider, clock: FixedClock, *, settle_s: float
) -> Deps:
    """The scaler with this provider, no Ray (nothing registers) and in-memory stores."""
    return Deps(
        bus=bus,
        clock=clock,
        pools=(SPOT, CPU),
        config=ScalerConfig(budget_per_hour_usd=10, idle_timeout_s=600, settle_s=settle_s),
        provider=provider,
        observer=NoRay(),
        demand=InMemoryDemandStore(),
        status=RecordingStatusBoard(),
        history=BusNodeHistory(bus),
    )


async def test_one_reconcile_pass_announces_the_workers_as_nodes(
    provider: KubeRayPoolProvider, clock: FixedClock
) -> None:
    bus = InMemoryBus()
    deps = scaler_deps(bus, provider, clock, settle_s=60)
    await reconcile(deps)
    events = [decode(m.data).data for m in bus.messages]
    launched = sorted((e.node, e.pool) for e in events if isinstance(e, NodeLaunched))
    expected = sorted((n.name, n.pool) for n in await provider.nodes())
    assert launched == expected
    assert len(launched) == 3
    assert not [e for e in events if isinstance(e, NodeReleased)]


async def test_bootstrap_builds_the_kuberay_provider_from_its_settings(kube: FakeKubeRay) -> None:
    settings = ScalerSettings(
        provider="kuberay",
        kuberay_cluster=NAME,
        kuberay_namespace=NAMESPACE,
        kuberay_api_endpoint=kube.endpoint,
    )
    async with AsyncExitStack() as stack:
        provider = _provider(settings, stack, {})
        assert isinstance(provider, KubeRayPoolProvider)
        assert len(await provider.nodes()) == 3


def test_the_kuberay_provider_needs_its_cluster_and_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPOTRAIN_SCALER_PROVIDER", "kuberay")
    with pytest.raises(ValueError, match="SPOTRAIN_SCALER_KUBERAY_CLUSTER"):
        ScalerSettings()
    monkeypatch.setenv("SPOTRAIN_SCALER_KUBERAY_CLUSTER", NAME)
    monkeypatch.setenv("SPOTRAIN_SCALER_KUBERAY_NAMESPACE", NAMESPACE)
    assert ScalerSettings().kuberay_cluster == NAME


async def test_a_reconcile_pass_grows_the_worker_group_for_queued_work(
    provider: KubeRayPoolProvider, kube: FakeKubeRay, clock: FixedClock
) -> None:
    bus = InMemoryBus()
    deps = scaler_deps(bus, provider, clock, settle_s=0)
    queued = JobQueued(
        job_id="job-1",
        attempt=1,
        bundles=(Bundle(gpus=1),) * 3,
        capacity=CapacityClass.SPOT,
        priority=5,
    )
    await on_job_queued(new_event(queued, source="submitter", time=clock.now()), deps)
    kube.fail_next = [0, 0, 503]  # the pod list, the RayCluster read: fine; the patch fails
    await reconcile(deps)
    events = [decode(m.data).data for m in bus.messages]
    assert [e.pool for e in events if isinstance(e, PoolResizeFailed)] == ["gpu-spot"]
    assert kube.group(NAME, "gpu-spot")["replicas"] == 2

    # Past the capacity retry time.
    deps.memory = deps.memory.model_copy(update={"out_of_capacity_until": {}})
    await reconcile(deps)
    assert kube.group(NAME, "gpu-spot")["replicas"] == 3, "two workers there, three wanted"
    kube.operate(NAME, clock.now())
    await reconcile(deps)
    events = [decode(m.data).data for m in bus.messages]
    assert len([e for e in events if isinstance(e, NodeLaunched) and e.pool == "gpu-spot"]) == 3


def test_a_ray_cluster_the_operator_refuses_gets_no_pods(clock: FixedClock) -> None:
    """Issue 20, 1: KubeRay v1.5 refuses `labels` among rayStartParams (the chart's old way
    of naming each Ray node's Kubernetes node), records InvalidRayClusterSpec and makes
    nothing; the chart now writes the labels to a file (tests/helm checks it passes)."""
    old = copy.deepcopy(CLUSTER)
    old["spec"]["workerGroupSpecs"][0]["rayStartParams"]["labels"] = (
        "spotrain-node=${SPOTRAIN_NODE_NAME},spotrain-pool=gpu-spot"
    )
    fake = FakeKubeRay(namespace=NAMESPACE)
    fake.add_cluster(old)
    assert fake.operate(NAME, clock.now()) == []
    [(reason, cluster, message)] = fake.events
    assert (reason, cluster) == ("InvalidRayClusterSpec", NAME)
    assert "rayStartParams['labels'] is not supported for gpu-spot group" in message
