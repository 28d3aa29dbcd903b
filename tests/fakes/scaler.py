"""Fakes of the scaler's ports: a provider whose nodes join a fake Ray at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from services.scaler.adapters.node_history import BusNodeHistory
from services.scaler.handlers import Deps
from services.scaler.model import Demand, PoolSpec, ScalerConfig, StoppedNode, queueing
from services.scaler.ports import ObservedNode, ProvidedNode, ProviderBusyError
from shared.clock import Clock
from shared.events.data import NodeEndSource
from shared.messaging.memory import InMemoryBus
from shared.policy.cost.node_ends import NodeEnd
from shared.policy.pool_knowledge import PoolsKnowledge
from shared.pools import NodeSightings, OwnersSpend, PoolsStatus
from shared.ray_head import RayHeadUnavailableError
from tests.fakes.clock import FixedClock


class FakeCluster:
    """A provider and Ray's view in one: launched nodes are observed, idle and empty."""

    def __init__(self, clock: FixedClock) -> None:
        self._clock = clock
        self.launched: dict[str, tuple[PoolSpec, datetime]] = {}
        self.started: dict[str, tuple[PoolSpec, datetime]] = {}
        """Every node ever launched, running or not: the provider's start records."""
        self.idle_s: dict[str, float] = {}
        self.released: list[str] = []
        self._named = 0
        self.ends: dict[str, NodeEnd] = {}
        """When each node that stopped stopped, as the provider recorded it."""
        self.out_of_capacity: set[str] = set()
        """Pools whose launches fail, as a zone out of spot capacity answers."""
        self.busy: set[str] = set()
        """Pools whose launches are refused for now (another operation runs on them)."""
        self.unstarted: dict[str, str] = {}
        """Launched nodes the provider gave up starting, and why; they never join Ray."""
        self.release_fails: set[str] = set()
        """Nodes whose release fails (the cloud's delete refused): they keep running."""
        self.lives: dict[str, str] = {}
        """Which machine is behind each name, where a test says (a cloud VM's id)."""
        self.recreating: set[str] = set()
        """Names whose machine the provider is making again (a group recreating a VM)."""

    async def nodes(self) -> list[ProvidedNode]:
        return [
            ProvidedNode(
                name=name,
                pool=pool.name,
                launched_at=at,
                not_started=self.unstarted.get(name),
                life=None if name in self.recreating else self.lives.get(name),
                recreating=name in self.recreating,
            )
            for name, (pool, at) in self.launched.items()
        ]

    def recreate(self, node: str, *, maintenance: bool = False) -> None:
        """The machine behind `node` stops (preempted, or replaced by an upgrade or a
        repair when `maintenance`) and the provider makes another under its name, from
        now; it has no life until `boot_again`."""
        pool, _ = self.launched[node]
        now = self._clock.now()
        self.ends[node] = NodeEnd(now, NodeEndSource.RECORDED, maintenance=maintenance)
        self.launched[node] = (pool, now)
        self.recreating.add(node)
        self.lives.pop(node, None)

    def boot_again(self, node: str, life: str) -> None:
        self.recreating.discard(node)
        self.lives[node] = life

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        if pool.name in self.out_of_capacity:
            msg = f"ZONE_RESOURCE_POOL_EXHAUSTED: no capacity for {pool.name}"
            raise OSError(msg)
        if pool.name in self.busy:
            msg = f"another operation is running on {pool.name}"
            raise ProviderBusyError(msg)
        # Like a cloud's VM names, never used twice.
        names = [f"{pool.name}-{self._named + i + 1}" for i in range(count)]
        self._named += count
        for name in names:
            self.launched[name] = self.started[name] = (pool, self._clock.now())
        return names

    async def release(self, node: str) -> None:
        if node in self.release_fails:
            msg = f"deleting {node}: 503 backend error"
            raise OSError(msg)
        if self.launched.pop(node, None) is not None:
            self.ends.setdefault(node, NodeEnd(self._clock.now(), NodeEndSource.RECORDED))
        self.released.append(node)

    async def ended(self, nodes: Mapping[str, datetime]) -> dict[str, NodeEnd]:
        """The end on record of the life asked about: none for a life that began after."""
        return {
            name: end
            for name, since in nodes.items()
            if (end := self.ends.get(name)) is not None
            and not (end.source is NodeEndSource.RECORDED and end.at < since)
        }

    async def stopped(self) -> list[StoppedNode]:
        return [
            StoppedNode(name=name, pool=pool.name, launched_at=at)
            for name, (pool, at) in self.started.items()
            if name not in self.launched
        ]

    def stop(self, node: str, *, recorded: bool = True, stamped: datetime | None = None) -> None:
        """The node stops unasked (preempted, deleted, killed with its stack); the provider
        records when, unless `recorded` is False (its record lost, or never kept); then it
        may still have a last stamp of it alive (`stamped`)."""
        del self.launched[node]
        if recorded:
            self.ends[node] = NodeEnd(self._clock.now(), NodeEndSource.RECORDED)
        elif stamped is not None:
            self.ends[node] = NodeEnd(stamped, NodeEndSource.LAST_SEEN)

    async def observed(self) -> dict[str, ObservedNode]:
        return {
            name: ObservedNode(name=name, free=pool.shape, idle_s=self.idle_s.get(name, 0.0))
            for name, (pool, _) in self.launched.items()
            if name not in self.unstarted
        }


class FakeObserver:
    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster
        self.took_work: set[str] = set()
        """Nodes that took work since they were seen idle: Ray refuses to drain them."""
        self.drained: list[str] = []
        self.away = False
        """Ray's head does not answer."""

    async def nodes(self) -> dict[str, ObservedNode]:
        if self.away:
            msg = "Timed out while waiting for GCS to become available."
            raise RayHeadUnavailableError(msg)
        return await self._cluster.observed()

    async def drain_idle(self, node: str) -> str | None:
        if node in self.took_work:
            return "The node to be idle terminated is no longer idle."
        self.drained.append(node)
        return None


class InMemoryDemandStore:
    def __init__(self) -> None:
        self.demands: dict[str, Demand] = {}

    async def put(self, demand: Demand) -> None:
        stored = self.demands.get(demand.job_id)
        if stored is None or queueing(stored) <= queueing(demand):
            self.demands[demand.job_id] = demand

    async def place(self, demand: Demand, nodes: tuple[str, ...]) -> bool:
        if self.demands.get(demand.job_id) != demand:
            return False
        self.demands[demand.job_id] = demand.model_copy(update={"placed_on": nodes})
        return True

    async def remove(self, job_id: str, attempt: int) -> None:
        stored = self.demands.get(job_id)
        if stored is not None and stored.attempt <= attempt:
            del self.demands[job_id]

    async def get(self, job_id: str) -> Demand | None:
        return self.demands.get(job_id)

    async def all(self) -> list[Demand]:
        return list(self.demands.values())


class RecordingStatusBoard:
    def __init__(self) -> None:
        self.latest: PoolsStatus | None = None
        self.latest_sightings: NodeSightings | None = None
        self.latest_knowledge: PoolsKnowledge | None = None
        self.latest_spend: OwnersSpend | None = None

    async def publish_spend(self, spend: OwnersSpend) -> None:
        self.latest_spend = spend

    async def publish_status(self, status: PoolsStatus) -> None:
        self.latest = status

    async def publish_sightings(self, sightings: NodeSightings) -> None:
        self.latest_sightings = sightings

    async def sightings(self) -> NodeSightings | None:
        return self.latest_sightings

    async def publish_knowledge(self, knowledge: PoolsKnowledge) -> None:
        self.latest_knowledge = knowledge

    async def knowledge(self) -> PoolsKnowledge | None:
        return self.latest_knowledge


def scaler_deps(
    clock: Clock,
    cluster: FakeCluster,
    pools: Sequence[PoolSpec],
    config: ScalerConfig,
    *,
    bus: InMemoryBus | None = None,
    **more: Any,
) -> Deps:
    """The scaler's dependencies over these fakes (a provider and Ray's view in one, the
    demand and status in memory, the node history on the bus); `more` sets the rest."""
    bus = bus or InMemoryBus()
    return Deps(
        bus=bus,
        clock=clock,
        pools=pools,
        config=config,
        provider=more.pop("provider", cluster),
        observer=more.pop("observer", FakeObserver(cluster)),
        demand=more.pop("demand", InMemoryDemandStore()),
        status=more.pop("status", RecordingStatusBoard()),
        history=BusNodeHistory(bus),
        **more,
    )
