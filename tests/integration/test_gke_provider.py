"""The GKE pool provider through the real google-cloud-container and google-cloud-compute
REST clients, against local fakes of the GKE and Compute APIs that share one world: node
pools whose VMs are zonal managed instance groups (tests/fakes/gke_server.py,
tests/fakes/compute_server.py). Kubernetes' node list is the VMs that booted.

Issue 20's problems each have a test here that fails on the provider as it was (setSize on
the node pool, sizes in memory, releases by count):
3. busy is not a stock-out, and a real stock-out is seen: `test_an_operation_on_the_node_
   pool_is_busy_not_a_stock_out`, `test_a_rate_limit_is_busy`, `test_a_zone_out_of_the_
   machine_type_shows_as_not_started`;
4. a failed release is never announced: `test_a_failed_deletion_raises_and_the_vm_stays`;
5. the chosen VM goes, never another: `test_release_deletes_that_vm_and_no_other`;
6. a restart sees the VMs still booting: `test_a_restarted_provider_sees_the_vms_booting`.

Issue 36's, each failing on the provider as it was: a VM its group recreates under its
name is a new life (`test_a_preempted_vm_made_again_under_its_name_is_a_new_life`), one
recreated into a stock-out did not start (`test_a_vm_made_again_into_a_stock_out_did_not_
start`), a control-plane upgrade holds nothing up (`test_a_control_plane_upgrade_holds_no_
growth_or_release`), and a surge upgrade's replacement is maintenance (`test_a_node_a_surge_
upgrade_replaces_ended_for_maintenance`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from google.api_core.exceptions import BadRequest
from google.cloud.compute_v1 import CapacityAdviceResponse
from pydantic import ValidationError

from services.scaler.adapters.gke import (
    ClusterRef,
    ComputeOperationRecords,
    GkeError,
    GkePoolProvider,
    KubeNode,
    NodePoolAutoscaledError,
    NodePoolNotFoundError,
    _advice_request,
    connect_advice,
    connect_cluster_manager,
    connect_compute_operations,
    connect_instance_groups,
    first_end_since,
    in_maintenance,
    not_started,
    read_advice,
    spread,
)
from services.scaler.model import PoolSpec
from services.scaler.ports import ProviderBusyError
from services.scaler.settings import ScalerSettings
from shared.events.data import NodeEndSource
from shared.events.types import CapacityClass
from shared.policy.cost.node_ends import NodeEnd
from shared.policy.deadline import SpotAdvice
from tests.fakes.clock import FixedClock
from tests.fakes.compute_server import (
    MAX_PAGE,
    STOCK_OUT,
    FakeCompute,
    FakeGroup,
    FakeOperation,
    serve_fake_compute,
)
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
SPOT_B = SPOT.model_copy(update={"name": "gpu-spot-b", "zone": ZONES[1]})
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
    "gpu-spot-b": "np-gpu-spot",
    "gpu-on-demand": "np-gpu-od",
    "cpu": "np-cpu",
    "gone": "np-gone",
}
ZONE_OF = {"gpu-spot-b": ZONES[1]}


@pytest.mark.parametrize(
    ("sizes", "count", "expected"),
    [
        pytest.param([1, 1, 1], 2, [1, 1, 0], id="even-zones-fill-in-order"),
        pytest.param([3, 1, 2], 2, [0, 2, 0], id="the-smallest-first"),
        pytest.param([3, 1, 2], 4, [1, 2, 1], id="until-level-then-in-turn"),
        pytest.param([2], 3, [3], id="one-zone-takes-all"),
        pytest.param([0, 0], 0, [0, 0], id="nothing-asked"),
        pytest.param([], 2, [], id="no-group"),
    ],
)
def test_spread(sizes: list[int], count: int, expected: list[int]) -> None:
    assert spread(sizes, count) == expected


@pytest.mark.parametrize(
    ("action", "errors", "waited_s", "why"),
    [
        pytest.param("NONE", [], 5000.0, None, id="running"),
        pytest.param("CREATING", [], 10.0, None, id="being-made"),
        pytest.param(
            "CREATING",
            [("ZONE_RESOURCE_POOL_EXHAUSTED", "no L4 here")],
            1.0,
            "ZONE_RESOURCE_POOL_EXHAUSTED in z: no L4 here",
            id="stock-out-at-once",
        ),
        pytest.param(
            "VERIFYING", [], 601.0, "not made in z after 601 s (VERIFYING)", id="timed-out"
        ),
        pytest.param("DELETING", [("QUOTA_EXCEEDED", "q")], 9999.0, None, id="going-anyway"),
    ],
)
def test_not_started(
    action: str, errors: list[tuple[str, str]], waited_s: float, why: str | None
) -> None:
    assert not_started(action, errors, waited_s=waited_s, timeout_s=600.0, zone="z") == why


T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("ends_min", "since_min", "found_min"),
    [
        pytest.param([10, 40], 0, 10, id="the-first-lifes-end"),
        pytest.param([10, 40], 20, 40, id="the-next-lifes-end"),
        pytest.param([10], 20, None, id="a-life-still-running"),
        pytest.param([], 0, None, id="no-record"),
    ],
)
def test_first_end_since(ends_min: list[int], since_min: int, found_min: int | None) -> None:
    ends = [T0 + timedelta(minutes=m) for m in ends_min]
    found = first_end_since(ends, T0 + timedelta(minutes=since_min))
    assert found == (None if found_min is None else T0 + timedelta(minutes=found_min))


@pytest.mark.parametrize(
    ("at_min", "windows", "inside"),
    [
        pytest.param(5, [(0, 10)], True, id="inside-a-done-upgrade"),
        pytest.param(15, [(0, 10)], False, id="after-it"),
        pytest.param(15, [(0, None)], True, id="inside-one-still-running"),
        pytest.param(-1, [(0, None)], False, id="before-it"),
        pytest.param(5, [], False, id="no-upgrade"),
    ],
)
def test_in_maintenance(at_min: int, windows: list[tuple[int, int | None]], inside: bool) -> None:
    spans = [
        (T0 + timedelta(minutes=a), None if b is None else T0 + timedelta(minutes=b))
        for a, b in windows
    ]
    assert in_maintenance(T0 + timedelta(minutes=at_min), spans) is inside


@pytest.mark.parametrize(
    ("scores", "advice"),
    [
        pytest.param(
            {"obtainability": 0.9, "estimated_uptime": "3600s"},
            SpotAdvice(obtainability=0.9, uptime_h=1.0),
            id="an-hour",
        ),
        pytest.param(
            {"obtainability": 0.4, "estimated_uptime": "600s"},
            SpotAdvice(obtainability=0.4, uptime_h=600 / 3600),
            id="ten-minutes",
        ),
        pytest.param(
            {"obtainability": 0.2}, SpotAdvice(obtainability=0.2, uptime_h=None), id="no-uptime"
        ),
        pytest.param(
            {"obtainability": 0.2, "estimated_uptime": "an hour"},
            SpotAdvice(obtainability=0.2, uptime_h=None),
            id="an-uptime-not-in-seconds-is-none",
        ),
        pytest.param(None, None, id="nothing-recommended"),
    ],
)
def test_read_advice(scores: dict[str, object] | None, advice: SpotAdvice | None) -> None:
    recommendations = [] if scores is None else [{"scores": scores}]
    reply = CapacityAdviceResponse(recommendations=recommendations)
    assert read_advice(reply) == advice


def test_a_growth_never_shrinks() -> None:
    with pytest.raises(ValueError, match="adds VMs"):
        spread([1], -1)


def _group(compute: FakeCompute, pool: str, zone: str, running: int) -> FakeGroup:
    base = f"gke-train-{pool}-{zone[-1]}"
    return compute.add_group(
        zone, f"{base}-grp", base, [f"{base}-{i:04x}" for i in range(100, 100 + running)]
    )


@pytest.fixture
def compute() -> Iterator[FakeCompute]:
    fake = FakeCompute(project="proj", zones=ZONES, operation_s=0.2)
    with serve_fake_compute(fake) as served:
        yield served


@pytest.fixture
def gke(compute: FakeCompute) -> Iterator[FakeGke]:
    fake = FakeGke(
        project="proj",
        location="europe-west4",
        cluster="train",
        compute=compute,
        pools={
            "np-gpu-spot": FakeNodePool(
                "np-gpu-spot", [_group(compute, "np-gpu-spot", z, 1) for z in ZONES]
            ),
            "np-gpu-od": FakeNodePool("np-gpu-od", [_group(compute, "np-gpu-od", ZONES[0], 3)]),
            "np-cpu": FakeNodePool(
                "np-cpu",
                [_group(compute, "np-cpu", z, 1) for z in ZONES],
                autoscaling={"enabled": True, "minNodeCount": 1, "maxNodeCount": 5},
            ),
        },
    )
    with serve_fake_gke(fake) as served:
        yield served


class BootedNodes:
    """Kubernetes' registered nodes of each node pool: its VMs that booted."""

    def __init__(self, gke: FakeGke, clock: FixedClock) -> None:
        self._gke = gke
        self._clock = clock

    def nodes(self, gke_pool: str) -> list[KubeNode]:
        pool = self._gke.pools.get(gke_pool)
        if pool is None:
            return []
        at = self._clock.now() - timedelta(hours=1)
        return [
            KubeNode(name=vm, created_at=at)
            for group in pool.groups
            for vm in self._gke.compute.running(group)
        ]


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


def _provider(gke: FakeGke, clock: FixedClock, **options: float) -> GkePoolProvider:
    return GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        groups=connect_instance_groups(gke.compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools=NODE_POOLS,
        zones=ZONE_OF,
        directory=BootedNodes(gke, clock),
        clock=clock,
        poll_s=0.05,
        operation_timeout_s=options.get("operation_timeout_s", 10.0),
        start_timeout_s=options.get("start_timeout_s", 600.0),
    )


@pytest.fixture
def provider(gke: FakeGke, clock: FixedClock) -> GkePoolProvider:
    return _provider(gke, clock)


def _names(nodes: list[tuple[str, str]], pool: str) -> list[str]:
    return sorted(name for name, of in nodes if of == pool)


async def test_nodes_are_the_vms_of_each_pools_groups(provider: GkePoolProvider) -> None:
    """Every zone's VMs under the pool; a pool with a zone has that zone's only."""
    nodes = [(n.name, n.pool) for n in await provider.nodes()]
    assert _names(nodes, "gpu-spot") == [
        "gke-train-np-gpu-spot-a-0064",
        "gke-train-np-gpu-spot-b-0064",
        "gke-train-np-gpu-spot-c-0064",
    ]
    assert _names(nodes, "gpu-spot-b") == ["gke-train-np-gpu-spot-b-0064"]
    assert len(_names(nodes, "gpu-on-demand")) == 3
    assert _names(nodes, "gone") == []


async def test_launch_grows_the_smallest_zones_and_waits_for_each_operation(
    provider: GkePoolProvider, compute: FakeCompute, clock: FixedClock
) -> None:
    """3 zones of 1 VM, launch 2: zones a and b go to 2, and only once both resizes are
    DONE does the launch return, with the names the new VMs will have."""
    compute.boot_s = 3600.0
    launched = await provider.launch(SPOT, 2)
    assert compute.changes == [
        ("resize", "gke-train-np-gpu-spot-a-grp", "2"),
        ("resize", "gke-train-np-gpu-spot-b-grp", "2"),
    ]
    answered = {name: status for name, status in compute.polled}
    assert answered == {"operation-1-resize": "DONE", "operation-2-resize": "DONE"}
    assert len(launched) == 2
    assert [name.rsplit("-", 1)[0] for name in sorted(launched)] == [
        "gke-train-np-gpu-spot-a",
        "gke-train-np-gpu-spot-b",
    ]
    spot = {n.name: n for n in await provider.nodes() if n.pool == "gpu-spot"}
    assert len(spot) == 5, "a launched VM shows at once, before it boots"
    assert {spot[name].launched_at for name in launched} == {clock.now()}
    assert all(spot[name].not_started is None for name in launched)


async def test_launch_never_exceeds_the_pool_maximum(
    provider: GkePoolProvider, compute: FakeCompute
) -> None:
    """4 at most, 3 there: a launch of 5 makes 1; a launch with no room changes nothing."""
    assert len(await provider.launch(ON_DEMAND, 5)) == 1
    assert await provider.launch(ON_DEMAND, 1) == []
    assert compute.changes == [("resize", "gke-train-np-gpu-od-a-grp", "4")]


async def test_a_pool_with_a_zone_grows_in_that_zone_only(
    provider: GkePoolProvider, compute: FakeCompute
) -> None:
    await provider.launch(SPOT_B, 2)
    assert compute.changes == [("resize", "gke-train-np-gpu-spot-b-grp", "3")]


async def test_release_deletes_that_vm_and_no_other(
    provider: GkePoolProvider, gke: FakeGke, compute: FakeCompute
) -> None:
    """Issue 20, 5: the idle VM the scaler chose goes, its busy neighbours stay; a shrink
    by size (the node pool's setSize) lets the group pick at random."""
    od = [n.name for n in await provider.nodes() if n.pool == "gpu-on-demand"]
    await provider.release(od[1])
    left = [n.name for n in await provider.nodes() if n.pool == "gpu-on-demand"]
    assert left == [od[0], od[2]]
    assert compute.changes == [("deleteInstances", "gke-train-np-gpu-od-a-grp", od[1])]
    assert gke.set_sizes() == []
    await provider.release(od[1])  # already gone: nothing asked
    assert len(compute.changes) == 1


async def test_releasing_a_node_no_pool_holds_changes_nothing(
    provider: GkePoolProvider, compute: FakeCompute
) -> None:
    await provider.release("gke-long-gone")
    assert compute.changes == []


async def test_a_failed_deletion_raises_and_the_vm_stays(
    provider: GkePoolProvider, compute: FakeCompute
) -> None:
    """Issue 20, 4: when Compute Engine's deletion fails the release raises (so no
    `node.released` is announced) and the VM is still listed, to be billed and retried."""
    od = sorted(n.name for n in await provider.nodes() if n.pool == "gpu-on-demand")
    compute.failing_deletes = 1
    with pytest.raises(GkeError, match=f"deleting VM {od[0]}"):
        await provider.release(od[0])
    assert od[0] in {n.name for n in await provider.nodes()}
    await provider.release(od[0])
    assert od[0] not in {n.name for n in await provider.nodes()}


async def test_a_restarted_provider_sees_the_vms_booting(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    """Issue 20, 6: what was asked lives in the groups, not in memory. A new provider lists
    the VMs still booting, grows from the groups' targets, and a release of a running VM
    leaves every booting one alone."""
    compute.boot_s = 3600.0
    booting = await _provider(gke, clock).launch(SPOT, 2)
    restarted = _provider(gke, clock)
    spot = {n.name for n in await restarted.nodes() if n.pool == "gpu-spot"}
    assert set(booting) <= spot
    assert len(spot) == 5
    await restarted.launch(SPOT, 1)
    assert compute.changes[-1] == ("resize", "gke-train-np-gpu-spot-c-grp", "2")
    await restarted.release("gke-train-np-gpu-spot-a-0064")
    assert set(booting) <= {n.name for n in await restarted.nodes()}


async def test_an_operation_on_the_node_pool_is_busy_not_a_stock_out(
    provider: GkePoolProvider, gke: FakeGke, compute: FakeCompute
) -> None:
    """Issue 20, 3: while GKE upgrades the node pool, its groups are not touched, and the
    launch says busy (the scaler tries again) rather than failing like a stock-out."""
    gke.start_operation("UPGRADE_NODES", "np-gpu-spot", seconds=30)
    with pytest.raises(ProviderBusyError, match=r"operation-1-upgrade_nodes \(UPGRADE_NODES\)"):
        await provider.launch(SPOT, 1)
    od = [n.name for n in await provider.nodes() if n.pool == "gpu-on-demand"]
    await provider.release(od[0])  # another node pool's operation is no reason to wait
    assert compute.changes == [("deleteInstances", "gke-train-np-gpu-od-a-grp", od[0])]


def test_gkes_refusal_of_a_second_operation_reads_as_busy(gke: FakeGke) -> None:
    """GKE's 400 FAILED_PRECONDITION with reason CLUSTER_ALREADY_HAS_OPERATION, through the
    real client, is busy; any other 400 is an error."""
    client = connect_cluster_manager(gke.endpoint)
    name = "projects/proj/locations/europe-west4/clusters/train/nodePools/np-gpu-od"
    client.set_node_pool_size(request={"name": name, "node_count": 3})
    with pytest.raises(ProviderBusyError, match="incompatible operation operation-1"):
        GkePoolProvider._call(
            "resizing", lambda: client.set_node_pool_size(request={"name": name, "node_count": 2})
        )


async def test_a_rate_limit_is_busy(provider: GkePoolProvider, compute: FakeCompute) -> None:
    compute.writes_per_s = 0
    with pytest.raises(ProviderBusyError, match="429"):
        await provider.launch(SPOT, 1)


async def test_an_operation_that_outlives_the_wait_is_busy(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    compute.operation_s = 30.0
    provider = _provider(gke, clock, operation_timeout_s=0.3)
    with pytest.raises(ProviderBusyError, match="still running after 0 s"):
        await provider.launch(SPOT, 1)


async def test_a_zone_out_of_the_machine_type_shows_as_not_started(
    provider: GkePoolProvider, compute: FakeCompute
) -> None:
    """Issue 20, 3: a real stock-out never fails the resize; the group keeps retrying the
    create. The VM is listed as not started, with Compute Engine's words, and can go."""
    compute.stocked_out.add(ZONES[1])
    [made] = await provider.launch(SPOT_B, 1)
    [node] = [n for n in await provider.nodes() if n.name == made and n.pool == "gpu-spot-b"]
    assert node.not_started is not None
    assert node.not_started.startswith(f"{STOCK_OUT} in {ZONES[1]}: The zone")
    await provider.release(made)
    assert made not in {n.name for n in await provider.nodes()}


async def test_a_vm_not_made_in_time_shows_as_not_started(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    compute.boot_s = 3600.0
    provider = _provider(gke, clock, start_timeout_s=600.0)
    [made] = await provider.launch(ON_DEMAND, 1)
    clock.advance(timedelta(seconds=599))
    assert {n.name: n.not_started for n in await provider.nodes()}[made] is None
    clock.advance(timedelta(seconds=2))
    why = {n.name: n.not_started for n in await provider.nodes()}[made]
    assert why == f"not made in {ZONES[0]} after 601 s (CREATING)"


async def test_an_autoscaled_pool_is_not_resized(
    provider: GkePoolProvider, compute: FakeCompute
) -> None:
    """GKE's cluster autoscaler owns an autoscaled pool: the provider refuses, says why and
    how to turn it off."""
    with pytest.raises(NodePoolAutoscaledError, match=r"np-cpu has autoscaling on \(min 1, max 5"):
        await provider.launch(AUTOSCALED, 1)
    assert compute.changes == []


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


async def test_the_end_of_a_vm_is_compute_engines_record_of_its_preemption_or_deletion(
    gke: FakeGke, clock: FixedClock, compute: FakeCompute
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
        groups=connect_instance_groups(compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools=NODE_POOLS,
        directory=BootedNodes(gke, clock),
        clock=clock,
        records=records,
    )
    since = at - timedelta(hours=1)
    names = ["gke-spot-a1", "gke-spot-b1", "gke-spot-c1", "never-seen"]
    ends = await provider.ended(dict.fromkeys(names, since))
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
        records.ended({"n": datetime.now(UTC)})


def _checked(gke: FakeGke, clock: FixedClock, node_pools: dict[str, str]) -> GkePoolProvider:
    return GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        groups=connect_instance_groups(gke.compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools=node_pools,
        zones={"gpu-spot-d": "europe-west4-d"},
        directory=BootedNodes(gke, clock),
        clock=clock,
    )


@pytest.mark.parametrize(
    ("node_pools", "refusal"),
    [
        pytest.param(
            {"cpu": "np-cpu"},
            r"pool cpu: GKE node pool np-cpu has autoscaling on .* --no-enable-autoscaling",
            id="autoscaled",
        ),
        pytest.param(
            {"gone": "np-gone"},
            r"pool gone: reading GKE node pool .*np-gone: not found .* map the pool to one",
            id="missing",
        ),
        pytest.param(
            {"gpu-spot-d": "np-gpu-spot"},
            "pool gpu-spot-d: GKE node pool np-gpu-spot has no instance group in zone "
            "europe-west4-d",
            id="no-group-in-the-zone",
        ),
    ],
)
def test_a_pool_the_scaler_cannot_resize_stops_it_at_start(
    gke: FakeGke, clock: FixedClock, node_pools: dict[str, str], refusal: str
) -> None:
    with pytest.raises(GkeError, match=refusal):
        _checked(gke, clock, node_pools).check()


def test_unreadable_instance_groups_stop_the_scaler_at_start_naming_the_permission(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    del compute.groups[(ZONES[0], "gke-train-np-gpu-od-a-grp")]
    with pytest.raises(GkeError, match=r"needs compute.instanceGroupManagers.get"):
        _checked(gke, clock, {"gpu-on-demand": "np-gpu-od"}).check()
    _checked(gke, clock, {"gpu-spot": "np-gpu-spot"}).check()


def test_pools_that_share_an_instance_group_stop_the_scaler_at_start(
    gke: FakeGke, clock: FixedClock
) -> None:
    """A zone-less pool and a one-zone pool on the same node pool would list its VMs twice."""
    provider = GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        groups=connect_instance_groups(gke.compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools={"gpu-spot": "np-gpu-spot", "gpu-spot-b": "np-gpu-spot"},
        zones=ZONE_OF,
        directory=BootedNodes(gke, clock),
        clock=clock,
    )
    with pytest.raises(GkeError, match="pools gpu-spot and gpu-spot-b share the instance group"):
        provider.check()


async def test_a_vm_made_and_gone_while_no_scaler_watched_is_on_record(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    """Compute Engine's insert, then its preemption, of a VM of a pool's group: the scaler
    that comes back bills it from its making (issue 16 left this to issue 20)."""
    records = ComputeOperationRecords(connect_compute_operations(compute.endpoint), "proj")
    provider = GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        groups=connect_instance_groups(compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools={"gpu-spot": "np-gpu-spot", "gpu-on-demand": "np-gpu-od"},
        directory=BootedNodes(gke, clock),
        clock=clock,
        records=records,
        poll_s=0.05,
    )
    [made] = await provider.launch(ON_DEMAND, 1)
    assert made in {n.name for n in await provider.nodes()}  # it boots
    compute.preempt(made)
    compute.operations.append(
        FakeOperation(ZONES[0], "insert", "someone-elses-vm", datetime.now(UTC))
    )
    [stopped] = await provider.stopped()
    inserted = next(
        o for o in compute.operations if o.instance == made and o.operation_type == "insert"
    )
    assert (stopped.name, stopped.pool) == (made, "gpu-on-demand")
    assert stopped.launched_at == inserted.end_time.replace(
        microsecond=(inserted.end_time.microsecond // 1000) * 1000
    )
    ended = await provider.ended({made: stopped.launched_at})
    assert ended[made].source is NodeEndSource.RECORDED


def _recorded(gke: FakeGke, clock: FixedClock, directory: object = None) -> GkePoolProvider:
    compute = gke.compute
    return GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        groups=connect_instance_groups(compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools={"gpu-spot": "np-gpu-spot", "gpu-on-demand": "np-gpu-od"},
        directory=directory or BootedNodes(gke, clock),  # type: ignore[arg-type]
        clock=clock,
        records=ComputeOperationRecords(connect_compute_operations(compute.endpoint), "proj"),
        poll_s=0.05,
    )


async def test_a_preempted_vm_made_again_under_its_name_is_a_new_life(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    """The VM is TERMINATED, still itself, until its group recreates it under its name:
    listed as `recreating` from when that was seen, then with the new VM's id, the same
    life since; the record of the end of the life before is found for that life, and
    none for the next."""
    provider = _recorded(gke, clock)
    first = {n.name: n for n in await provider.nodes() if n.pool == "gpu-spot"}
    name = "gke-train-np-gpu-spot-a-0064"
    assert first[name].life is not None
    assert not first[name].recreating
    clock.advance(timedelta(minutes=10))
    compute.boot_s = 3600.0
    compute.recreate_after_s = 3600.0
    compute.preempt(name)
    [stopped] = [n for n in await provider.nodes() if n.name == name]
    assert (stopped.recreating, stopped.life) == (False, first[name].life), "not yet remade"
    compute.recreate_after_s = 0.0
    clock.advance(timedelta(seconds=30))
    [again] = [n for n in await provider.nodes() if n.name == name]
    assert (again.recreating, again.life, again.not_started) == (True, None, None)
    assert again.launched_at == clock.now()
    compute.boot_s = 0.0
    clock.advance(timedelta(minutes=2))
    [booted] = [n for n in await provider.nodes() if n.name == name]
    assert not booted.recreating
    assert booted.life not in (None, first[name].life)
    assert booted.launched_at == again.launched_at, "one life since it was being made"
    preempted = next(o for o in compute.operations if o.instance == name)
    ended = await provider.ended({name: first[name].launched_at})
    assert ended[name].at.replace(microsecond=0) == preempted.end_time.replace(microsecond=0)
    assert not ended[name].maintenance
    assert await provider.ended({name: datetime.now(UTC) + timedelta(minutes=1)}) == {}


class StaleNodes(BootedNodes):
    """Kubernetes still lists a node whose VM is being made again (its Node object
    outlives the VM)."""

    def __init__(self, gke: FakeGke, clock: FixedClock, stale: str) -> None:
        super().__init__(gke, clock)
        self._stale = stale

    def nodes(self, gke_pool: str) -> list[KubeNode]:
        listed = super().nodes(gke_pool)
        if gke_pool == "np-gpu-spot" and self._stale not in {n.name for n in listed}:
            listed.append(KubeNode(self._stale, datetime.now(UTC) - timedelta(hours=2)))
        return listed


async def test_a_vm_made_again_into_a_stock_out_did_not_start(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    """Compute Engine retries the recreation for ever in a zone out of the machine type;
    the node is not started, with its words, though Kubernetes still lists it, and goes."""
    name = "gke-train-np-gpu-spot-b-0064"
    provider = _recorded(gke, clock, StaleNodes(gke, clock, name))
    compute.stocked_out.add(ZONES[1])
    compute.preempt(name)
    [node] = [n for n in await provider.nodes() if n.name == name]
    assert node.recreating
    assert node.not_started is not None
    assert node.not_started.startswith(f"{STOCK_OUT} in {ZONES[1]}")
    await provider.release(name)
    assert name not in {n.name for n in await provider.nodes()}


async def test_a_control_plane_upgrade_holds_no_growth_or_release(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    """An operation on the cluster itself (a control-plane upgrade, many minutes long) is
    no reason to wait: the pool grows and shrinks under it."""
    gke.start_operation("UPGRADE_MASTER", None, seconds=600)
    provider = _provider(gke, clock)
    [made] = await provider.launch(SPOT, 1)
    await provider.release(made)
    assert [verb for verb, _, _ in compute.changes] == ["resize", "deleteInstances"]


async def test_a_node_a_surge_upgrade_replaces_ended_for_maintenance(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    """GKE's surge upgrade adds a VM under a new name and deletes the old one, inside an
    `UPGRADE_NODES` operation on the node pool: the old VM's end is maintenance, and the
    node pool is left alone while it runs."""
    provider = _recorded(gke, clock)
    old = "gke-train-np-gpu-spot-a-0064"
    since = datetime.now(UTC) - timedelta(minutes=1)
    made = gke.surge_upgrade("np-gpu-spot", old, seconds=600)
    listed = {n.name for n in await provider.nodes()}
    assert made in listed
    assert old not in listed
    ended = await provider.ended({old: since})
    assert ended[old].maintenance
    with pytest.raises(ProviderBusyError, match="UPGRADE_NODES"):
        await provider.launch(SPOT, 1)
    od = next(n.name for n in await provider.nodes() if n.pool == "gpu-on-demand")
    compute.preempt(od)
    assert not (await provider.ended({od: since}))[od].maintenance, "another node pool"


async def test_the_capacity_advice_answers_for_the_pools_zones(
    gke: FakeGke, compute: FakeCompute, clock: FixedClock
) -> None:
    """Issue 36, 5: through the real AdviceClient, one request per spot pool, for one VM of
    its node pool's machine type in any one of its zones: the best zone's obtainability and
    estimated uptime. A pool in one zone is advised on that zone; an on-demand pool is not
    asked about."""
    compute.advice = {
        (ZONES[0], "g2-standard-8"): (0.2, 600),
        (ZONES[1], "g2-standard-8"): (0.9, 3600),
    }
    provider = GkePoolProvider(
        client=connect_cluster_manager(gke.endpoint),
        groups=connect_instance_groups(compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools={**NODE_POOLS, "gpu-spot-a": "np-gpu-spot"},
        zones={**ZONE_OF, "gpu-spot-a": ZONES[0]},
        directory=BootedNodes(gke, clock),
        clock=clock,
        advisor=connect_advice(compute.endpoint),
    )
    spot_a = SPOT.model_copy(update={"name": "gpu-spot-a", "zone": ZONES[0]})
    advice = await provider.advice([SPOT, SPOT_B, spot_a, ON_DEMAND])
    assert advice == {
        "gpu-spot": SpotAdvice(obtainability=0.9, uptime_h=1.0),
        "gpu-spot-b": SpotAdvice(obtainability=0.9, uptime_h=1.0),
        "gpu-spot-a": SpotAdvice(obtainability=0.2, uptime_h=600 / 3600),
    }
    first = compute.advised[0]
    assert first["instanceProperties"]["scheduling"]["provisioningModel"] == "SPOT"
    assert [z["zone"] for z in first["distributionPolicy"]["zones"]] == [
        f"projects/proj/zones/{zone}" for zone in ZONES
    ]
    assert len(compute.advised) == 3


def test_a_refused_advice_request_is_a_gke_error(compute: FakeCompute) -> None:
    """The API's 400 for a request it does not take (a zone of another region), through the
    real client."""
    request = _advice_request("proj", "g2-standard-8", ["us-central1-a"])
    with pytest.raises(BadRequest, match="zone"):
        connect_advice(compute.endpoint).capacity(
            project="proj", region="europe-west4", capacity_advice_request_resource=request
        )
