"""The GKE pool provider through the real google-cloud-container REST client, against a
local fake of the GKE API; Kubernetes' node list is a fake `NodeDirectory`."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from services.scaler.adapters.gke import (
    ClusterRef,
    ComputeOperationRecords,
    GkeError,
    GkePoolProvider,
    KubeNode,
    NodePoolAutoscaledError,
    NodePoolNotFoundError,
    connect_cluster_manager,
    connect_compute_operations,
    per_zone_count,
)
from services.scaler.model import PoolSpec
from services.scaler.settings import ScalerSettings
from shared.cost.node_ends import NodeEnd
from shared.events.data import NodeEndSource
from shared.events.types import CapacityClass
from tests.fakes.clock import FixedClock
from tests.fakes.compute_server import MAX_PAGE, FakeCompute, FakeOperation, serve_fake_compute
from tests.fakes.gke_server import FakeGke, FakeNodePool, serve_fake_gke

pytestmark = pytest.mark.integration

ZONES = ["europe-west4-a", "europe-west4-b", "europe-west4-c"]
SPOT = PoolSpec(
    name="gpu-spot",
    capacity=CapacityClass.SPOT,
    gpus=1,
    cpus=4,
    price_per_hour_usd=1.0,
    max_nodes=12,
)
ON_DEMAND = PoolSpec(
    name="gpu-on-demand",
    capacity=CapacityClass.ON_DEMAND,
    gpus=1,
    cpus=4,
    price_per_hour_usd=3.0,
    max_nodes=4,
)
AUTOSCALED = PoolSpec(
    name="cpu", capacity=CapacityClass.ON_DEMAND, gpus=0, cpus=8, price_per_hour_usd=0.3
)
MISSING = PoolSpec(name="gone", capacity=CapacityClass.SPOT, gpus=0, cpus=8, price_per_hour_usd=0.3)
NODE_POOLS = {
    "gpu-spot": "np-gpu-spot",
    "gpu-on-demand": "np-gpu-od",
    "cpu": "np-cpu",
    "gone": "np-gone",
}


class FakeNodeDirectory:
    """Kubernetes' registered nodes per GKE node pool, as the test sets them."""

    def __init__(self, clock: FixedClock) -> None:
        self._clock = clock
        self.registered: dict[str, list[str]] = {}

    def nodes(self, gke_pool: str) -> list[KubeNode]:
        at = self._clock.now() - timedelta(hours=1)
        return [KubeNode(name=n, created_at=at) for n in self.registered.get(gke_pool, [])]


@pytest.mark.parametrize(
    ("current", "delta", "zones", "max_total", "expected"),
    [
        pytest.param(3, 2, 3, 100, 2, id="grow-rounds-up-to-whole-zone"),
        pytest.param(3, 3, 3, 100, 2, id="grow-exact-multiple"),
        pytest.param(0, 1, 1, 100, 1, id="one-zone-exact"),
        pytest.param(0, 1, 3, 100, 1, id="one-node-in-three-zones-is-three"),
        pytest.param(3, 2, 3, 5, 1, id="capped-below-max-total"),
        pytest.param(3, 9, 3, 12, 4, id="capped-at-max-total"),
        pytest.param(3, -1, 3, 3, 1, id="shrink-by-one-of-three-zones-holds"),
        pytest.param(3, -3, 3, 3, 0, id="shrink-a-whole-step"),
        pytest.param(3, -1, 1, 3, 2, id="shrink-one-zone"),
        pytest.param(1, -5, 2, 10, 0, id="never-below-zero"),
    ],
)
def test_per_zone_count(
    current: int, delta: int, zones: int, max_total: int, expected: int
) -> None:
    """setSize's per-zone count rounds the wanted total up and stays under the maximum."""
    assert per_zone_count(current, delta, zones, max_total) == expected


def test_per_zone_count_needs_a_zone() -> None:
    """A node pool without zones is a bug, not a size."""
    with pytest.raises(ValueError, match="at least one zone"):
        per_zone_count(1, 1, 0, 10)


@pytest.fixture
def gke() -> Iterator[FakeGke]:
    fake = FakeGke(
        project="proj",
        location="europe-west4",
        cluster="train",
        pools={
            "np-gpu-spot": FakeNodePool("np-gpu-spot", ZONES, node_count=1),
            "np-gpu-od": FakeNodePool("np-gpu-od", ZONES[:1], node_count=3),
            "np-cpu": FakeNodePool(
                "np-cpu",
                ZONES,
                node_count=1,
                autoscaling={"enabled": True, "minNodeCount": 1, "maxNodeCount": 5},
            ),
        },
    )
    with serve_fake_gke(fake) as served:
        yield served


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def directory(clock: FixedClock) -> FakeNodeDirectory:
    nodes = FakeNodeDirectory(clock)
    nodes.registered = {
        "np-gpu-spot": ["gke-spot-a1", "gke-spot-b1", "gke-spot-c1"],
        "np-gpu-od": ["gke-od-1", "gke-od-2", "gke-od-3"],
        "np-cpu": ["gke-cpu-a1", "gke-cpu-b1", "gke-cpu-c1"],
    }
    return nodes


@pytest.fixture
def provider(gke: FakeGke, directory: FakeNodeDirectory, clock: FixedClock) -> GkePoolProvider:
    return GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools=NODE_POOLS,
        directory=directory,
        clock=clock,
    )


def _names(nodes: list[tuple[str, str]], pool: str) -> list[str]:
    return sorted(name for name, of in nodes if of == pool)


async def test_nodes_are_the_kubernetes_nodes_of_each_pool(provider: GkePoolProvider) -> None:
    """Before any resize, nodes() is what Kubernetes lists, under spotrain pool names."""
    nodes = [(n.name, n.pool) for n in await provider.nodes()]
    assert _names(nodes, "gpu-spot") == ["gke-spot-a1", "gke-spot-b1", "gke-spot-c1"]
    assert _names(nodes, "gone") == []


async def test_launch_reads_the_pool_then_sets_a_per_zone_count_rounded_up(
    provider: GkePoolProvider, gke: FakeGke, clock: FixedClock
) -> None:
    """3 zones at 1 node each, launch 2: 5 nodes round up to 2 per zone, 6 in all."""
    launched = await provider.launch(SPOT, 2)

    assert [(r.method, r.path) for r in gke.requests] == [
        ("GET", "/v1/projects/proj/locations/europe-west4/clusters/train/nodePools/np-gpu-spot"),
        (
            "POST",
            "/v1/projects/proj/locations/europe-west4/clusters/train/nodePools/np-gpu-spot:setSize",
        ),
    ]
    assert gke.set_sizes() == [("np-gpu-spot", 2)]
    assert gke.pools["np-gpu-spot"].node_count == 2
    assert launched == ["np-gpu-spot-pending-3", "np-gpu-spot-pending-4", "np-gpu-spot-pending-5"]
    spot = [n for n in await provider.nodes() if n.pool == "gpu-spot"]
    assert len(spot) == 6, "a launched node shows at once, before its VM registers"
    assert {n.launched_at for n in spot if "pending" in n.name} == {clock.now()}


async def test_launch_counts_from_the_size_it_set_not_the_lagging_node_list(
    provider: GkePoolProvider, gke: FakeGke
) -> None:
    """A second launch before the VMs register grows from 6, not from the 3 registered."""
    await provider.launch(SPOT, 2)
    await provider.launch(SPOT, 1)
    assert gke.set_sizes() == [("np-gpu-spot", 2), ("np-gpu-spot", 3)]


async def test_launch_never_exceeds_the_pool_maximum(
    provider: GkePoolProvider, gke: FakeGke
) -> None:
    """Rounding up to whole zones stops at max_nodes; a launch with no room sets nothing."""
    await provider.launch(SPOT, 20)
    assert gke.set_sizes() == [("np-gpu-spot", 4)]
    assert await provider.launch(SPOT, 1) == []
    assert gke.set_sizes() == [("np-gpu-spot", 4)]


async def test_an_autoscaled_pool_is_not_resized(provider: GkePoolProvider, gke: FakeGke) -> None:
    """GKE's cluster autoscaler owns an autoscaled pool: the provider refuses and says why."""
    with pytest.raises(NodePoolAutoscaledError, match=r"np-cpu has autoscaling on \(min 1, max 5"):
        await provider.launch(AUTOSCALED, 1)
    with pytest.raises(OSError, match="cluster autoscaler owns its size"):
        await provider.release("gke-cpu-a1")
    assert gke.set_sizes() == []


async def test_a_missing_node_pool_is_a_clear_os_error(provider: GkePoolProvider) -> None:
    """GKE's 404 leaves the adapter as an OSError naming the node pool, not a google error."""
    with pytest.raises(NodePoolNotFoundError) as raised:
        await provider.launch(MISSING, 1)
    assert isinstance(raised.value, OSError)
    assert "reading GKE node pool projects/proj/locations/europe-west4" in str(raised.value)
    assert "nodePools/np-gone: not found" in str(raised.value)
    assert raised.value.__cause__ is not None
    assert type(raised.value.__cause__).__module__.startswith("google.")


async def test_an_unmapped_pool_is_an_os_error(provider: GkePoolProvider) -> None:
    """A spotrain pool without a GKE node pool in the settings cannot be launched."""
    stray = MISSING.model_copy(update={"name": "stray"})
    with pytest.raises(GkeError, match="no GKE node pool is mapped to pool 'stray'"):
        await provider.launch(stray, 1)


async def test_release_decrements_a_one_zone_pool(
    provider: GkePoolProvider, gke: FakeGke, directory: FakeNodeDirectory
) -> None:
    """Releasing one node of a one-zone pool of 3 sets its size to 2, once."""
    await provider.release("gke-od-2")
    await provider.release("gke-od-2")  # still listed while GKE removes a VM: not twice
    assert gke.set_sizes() == [("np-gpu-od", 2)]

    directory.registered["np-gpu-od"] = ["gke-od-1", "gke-od-3"]  # GKE chose gke-od-2
    assert _names([(n.name, n.pool) for n in await provider.nodes()], "gpu-on-demand") == [
        "gke-od-1",
        "gke-od-3",
    ]
    await provider.release("gke-od-3")
    assert gke.set_sizes() == [("np-gpu-od", 2), ("np-gpu-od", 1)]


async def test_release_in_a_multi_zone_pool_waits_for_a_whole_per_zone_step(
    provider: GkePoolProvider, gke: FakeGke
) -> None:
    """setSize counts per zone, so 3 zones shrink only once 3 nodes are released."""
    await provider.release("gke-spot-a1")
    await provider.release("gke-spot-b1")
    assert gke.set_sizes() == []
    await provider.release("gke-spot-c1")
    assert gke.set_sizes() == [("np-gpu-spot", 0)]


async def test_releasing_a_node_already_gone_does_nothing(
    provider: GkePoolProvider, gke: FakeGke
) -> None:
    """Release is a no-op for a node no pool lists: no GKE call at all."""
    await provider.release("gke-long-gone")
    assert gke.requests == []


def test_settings_read_the_gke_cluster_and_pool_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gke provider's cluster and pool map come from SPOTRAIN_SCALER_GKE_*."""
    monkeypatch.setenv("SPOTRAIN_SCALER_PROVIDER", "gke")
    monkeypatch.setenv("SPOTRAIN_SCALER_GKE_PROJECT", "proj")
    monkeypatch.setenv("SPOTRAIN_SCALER_GKE_LOCATION", "europe-west4")
    monkeypatch.setenv("SPOTRAIN_SCALER_GKE_CLUSTER", "train")
    monkeypatch.setenv("SPOTRAIN_SCALER_GKE_NODE_POOLS", '{"gpu-spot": "np-gpu-spot"}')
    settings = ScalerSettings()
    assert settings.gke_node_pools == {"gpu-spot": "np-gpu-spot"}
    assert settings.gke_api_endpoint is None


def test_settings_refuse_an_incomplete_gke_provider() -> None:
    """Choosing gke without naming the cluster fails at start, naming what is missing."""
    with pytest.raises(ValidationError, match="SPOTRAIN_SCALER_GKE_CLUSTER"):
        ScalerSettings(provider="gke", gke_project="proj", gke_location="europe-west4")


@pytest.fixture
def compute() -> Iterator[FakeCompute]:
    fake = FakeCompute(project="proj", zones=ZONES)
    with serve_fake_compute(fake) as served:
        yield served


async def test_the_end_of_a_vm_is_compute_engines_record_of_its_preemption_or_deletion(
    gke: FakeGke, directory: FakeNodeDirectory, clock: FixedClock, compute: FakeCompute
) -> None:
    """Through the real GlobalOperationsClient, over pages: the first of a VM's preemption
    and deletion, only for the VMs asked about, nothing for one with no record."""
    at = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    compute.operations = [
        FakeOperation(ZONES[0], "compute.instances.preempted", "gke-spot-a1", at),
        FakeOperation(ZONES[0], "delete", "gke-spot-a1", at + timedelta(seconds=40)),
        FakeOperation(ZONES[1], "delete", "gke-spot-b1", at + timedelta(minutes=5)),
        FakeOperation(ZONES[2], "compute.instances.preempted", "someone-elses-vm", at),
        FakeOperation(ZONES[2], "delete", "gke-spot-c1", at, status="RUNNING"),
        *(FakeOperation(ZONES[2], "delete", f"old-{i}", at) for i in range(MAX_PAGE + 3)),
    ]
    records = ComputeOperationRecords(connect_compute_operations(compute.endpoint), "proj")
    provider = GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools=NODE_POOLS,
        directory=directory,
        clock=clock,
        records=records,
    )
    ends = await provider.ended(["gke-spot-a1", "gke-spot-b1", "gke-spot-c1", "never-seen"])
    assert ends == {
        "gke-spot-a1": NodeEnd(at, NodeEndSource.RECORDED),
        "gke-spot-b1": NodeEnd(at + timedelta(minutes=5), NodeEndSource.RECORDED),
    }
    assert len(compute.requests) == 2, "two pages"
    assert compute.requests[0]["filter"] == [ComputeOperationRecords.FILTER]


def test_an_unreadable_record_is_a_gke_error(compute: FakeCompute) -> None:
    """A filter the API refuses, or a project it does not know: an OSError, said once."""
    records = ComputeOperationRecords(connect_compute_operations(compute.endpoint), "other")
    with pytest.raises(GkeError, match="Compute operations of project other"):
        records.ended(["n"])
