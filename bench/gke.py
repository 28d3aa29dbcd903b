"""The scaler on GKE's second contact (issue 36), through the real GKE and Compute clients
against the local fakes (tests/fakes/gke_server.py, compute_server.py), each figure beside
the provider as it was, in the same run:

- VMs made again under their names: --vms spot VMs run; --preempted of them are taken back
  one after another, and their groups recreate each under its name (as a managed instance
  group does). gke_recreated_nodes_closed: first lives the scaler closed on the ledger
  (goal: every one preempted), counted as take-backs; the baseline provider (names only,
  no lives) closes none and bills each VM as one node for ever.
- A control-plane upgrade (`UPGRADE_MASTER`, --upgrade-s long) starts as a job queues:
  gke_busy_during_cluster_upgrade_s, how long the scaler's growth was refused as busy
  (goal 0); the baseline, the rule as it was (any operation on the cluster is busy).

    python bench/gke.py [--vms 6] [--preempted 4] [--upgrade-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from services.scaler.adapters.gke import (
    ClusterRef,
    ComputeOperationRecords,
    GkePoolProvider,
    KubeNode,
    connect_cluster_manager,
    connect_compute_operations,
    connect_instance_groups,
)
from services.scaler.adapters.node_history import BusNodeHistory
from services.scaler.handlers import Deps, on_job_queued, reconcile
from services.scaler.model import ObservedNode, PoolSpec, ProvidedNode, ScalerConfig, StoppedNode
from services.scaler.ports import PoolProvider, ProviderBusyError
from shared.clock import SystemClock
from shared.events import decode, new_event
from shared.events.data import JobQueued, NodeReleased, PoolResizeFailed
from shared.events.types import Bundle, CapacityClass
from shared.messaging.memory import InMemoryBus
from shared.policy.cost.node_ends import NodeEnd
from tests.fakes.compute_server import FakeCompute, serve_fake_compute
from tests.fakes.gke_server import FakeGke, FakeNodePool, serve_fake_gke
from tests.fakes.scaler import InMemoryDemandStore, RecordingStatusBoard

ZONE = "europe-west4-a"
SPOT = PoolSpec(
    name="gpu-spot",
    capacity=CapacityClass.SPOT,
    gpus=1,
    cpus=4,
    price_per_hour_usd=1.0,
    max_nodes=32,
    boot_time_s=0,
)


class NamesOnly:
    """The provider as it was: a VM is its name (no life, never `recreating`)."""

    def __init__(self, provider: GkePoolProvider) -> None:
        self._provider = provider

    async def nodes(self) -> list[ProvidedNode]:
        listed = await self._provider.nodes()
        return [n.model_copy(update={"life": None, "recreating": False}) for n in listed]

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        return await self._provider.launch(pool, count)

    async def release(self, node: str) -> None:
        await self._provider.release(node)

    async def ended(self, nodes: Mapping[str, datetime]) -> dict[str, NodeEnd]:
        return await self._provider.ended(nodes)

    async def stopped(self) -> list[StoppedNode]:
        return []


class ClusterWideBusy(GkePoolProvider):
    """The rule as it was: any GKE operation on the cluster holds every pool."""

    def _refuse_while_operating(self, gke_pool: str) -> None:
        for operation in self._operations():
            if operation.status.name in ("PENDING", "RUNNING", "ABORTING"):
                msg = f"GKE operation {operation.name} is running on the cluster"
                raise ProviderBusyError(msg)


class Booted:
    """Kubernetes' nodes: the VMs that run."""

    def __init__(self, gke: FakeGke) -> None:
        self._gke = gke

    def nodes(self, gke_pool: str) -> list[KubeNode]:
        at = datetime.now().astimezone() - timedelta(hours=1)
        return [
            KubeNode(name=vm, created_at=at)
            for group in self._gke.pools[gke_pool].groups
            for vm in self._gke.compute.running(group)
        ]


class RayView:
    """Ray's view: each running VM a live node with its room free, busy (never idle)."""

    def __init__(self, gke: FakeGke) -> None:
        self._gke = gke

    async def nodes(self) -> dict[str, ObservedNode]:
        running = [
            vm for g in self._gke.pools["np-gpu-spot"].groups for vm in self._gke.compute.running(g)
        ]
        return {vm: ObservedNode(name=vm, free=SPOT.shape, idle_s=0.0) for vm in running}

    async def drain_idle(self, node: str) -> str | None:
        return "busy"


def _world(vms: int) -> tuple[FakeCompute, FakeGke]:
    compute = FakeCompute(project="proj", zones=[ZONE], operation_s=0.05, boot_s=0.3)
    group = compute.add_group(
        ZONE,
        "gke-np-gpu-spot-grp",
        "gke-np-gpu-spot",
        [f"gke-np-gpu-spot-{i:04x}" for i in range(vms)],
    )
    gke = FakeGke(
        project="proj",
        location="europe-west4",
        cluster="train",
        compute=compute,
        pools={"np-gpu-spot": FakeNodePool("np-gpu-spot", [group])},
    )
    return compute, gke


def _provider(gke: FakeGke, kind: type[GkePoolProvider] = GkePoolProvider) -> GkePoolProvider:
    return kind(
        client=connect_cluster_manager(gke.endpoint),
        groups=connect_instance_groups(gke.compute.endpoint),
        cluster=ClusterRef(project="proj", location="europe-west4", cluster="train"),
        node_pools={"gpu-spot": "np-gpu-spot"},
        directory=Booted(gke),
        clock=SystemClock(),
        records=ComputeOperationRecords(connect_compute_operations(gke.compute.endpoint), "proj"),
        poll_s=0.02,
    )


def _deps(provider: PoolProvider, gke: FakeGke) -> Deps:
    bus = InMemoryBus()
    return Deps(
        bus=bus,
        clock=SystemClock(),
        pools=(SPOT,),
        config=ScalerConfig(budget_per_hour_usd=100, idle_timeout_s=3600, settle_s=0),
        provider=provider,
        observer=RayView(gke),
        demand=InMemoryDemandStore(),
        status=RecordingStatusBoard(),
        history=BusNodeHistory(bus),
    )


async def recreations(vms: int, preempted: int, *, baseline: bool) -> tuple[int, int]:
    """(first lives closed on the ledger, take-backs counted)."""
    compute, gke = _world(vms)
    with serve_fake_compute(compute), serve_fake_gke(gke):
        provider = _provider(gke)
        deps = _deps(NamesOnly(provider) if baseline else provider, gke)
        await reconcile(deps)
        names = sorted(deps.billed_nodes)[:preempted]
        for name in names:
            compute.preempt(name)
            for _ in range(20):  # passes, until it runs again
                await reconcile(deps)
                if name in compute.running(gke.pools["np-gpu-spot"].groups[0]):
                    break
                await asyncio.sleep(0.1)
            await reconcile(deps)
        assert isinstance(deps.bus, InMemoryBus)
        events = [decode(m.data).data for m in deps.bus.messages]
        closed = sum(
            1
            for e in events
            if isinstance(e, NodeReleased) and e.node in names and e.reason.value == "gone"
        )
        return closed, deps.memory.knowledge["gpu-spot"].taken_back


async def cluster_upgrade(upgrade_s: float, *, baseline: bool) -> float:
    """Seconds the growth for a queued job was refused as busy while the control plane
    upgraded."""
    compute, gke = _world(0)
    with serve_fake_compute(compute), serve_fake_gke(gke):
        provider = _provider(gke, ClusterWideBusy if baseline else GkePoolProvider)
        deps = _deps(provider, gke)
        gke.start_operation("UPGRADE_MASTER", None, upgrade_s)
        queued = JobQueued(
            job_id="job-1",
            attempt=1,
            bundles=(Bundle(gpus=1),),
            capacity=CapacityClass.SPOT,
            priority=5,
        )
        await on_job_queued(new_event(queued, source="bench", time=SystemClock().now()), deps)
        started = time.monotonic()
        refused_at: float | None = None
        assert isinstance(deps.bus, InMemoryBus)
        while not compute.changes and time.monotonic() - started < upgrade_s + 30:
            await reconcile(deps)
            events = [decode(m.data).data for m in deps.bus.messages]
            if refused_at is None and any(isinstance(e, PoolResizeFailed) for e in events):
                refused_at = time.monotonic()
            if not compute.changes:
                await asyncio.sleep(0.25)
        return 0.0 if refused_at is None else time.monotonic() - refused_at


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=6)
    parser.add_argument("--preempted", type=int, default=4)
    parser.add_argument("--upgrade-s", type=float, default=20.0)
    args = parser.parse_args()
    closed, taken = await recreations(args.vms, args.preempted, baseline=False)
    closed_before, taken_before = await recreations(args.vms, args.preempted, baseline=True)
    busy = await cluster_upgrade(args.upgrade_s, baseline=False)
    busy_before = await cluster_upgrade(args.upgrade_s, baseline=True)
    print(f"{args.preempted} of {args.vms} spot VMs preempted and made again under their names")
    print(f"{'':<34}{'now':>10}{'as it was':>12}")
    print(f"{'first lives closed':<34}{closed:>10}{closed_before:>12}")
    print(f"{'take-backs counted':<34}{taken:>10}{taken_before:>12}")
    print(
        f"{f'growth held by a {args.upgrade_s:.0f} s upgrade (s)':<34}"
        f"{busy:>10.1f}{busy_before:>12.1f}"
    )
    print(f"gke_recreated_nodes_closed: {closed}")
    print(f"gke_recreated_nodes_closed_baseline: {closed_before}")
    print(f"gke_recreated_take_backs: {taken}")
    print(f"gke_busy_during_cluster_upgrade_s: {busy:.1f}")
    print(f"gke_busy_during_cluster_upgrade_s_baseline: {busy_before:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
