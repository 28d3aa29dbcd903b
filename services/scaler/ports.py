"""What the scaler needs from the world, each with the semantics it relies on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from services.scaler.model import Demand, ObservedNode, PoolSpec, ProvidedNode, StoppedNode
from shared.events import Event
from shared.policy.cost.node_ends import NodeEnd
from shared.policy.deadline import SpotAdvice
from shared.policy.pool_knowledge import PoolsKnowledge
from shared.pools import NodeSightings, OwnersSpend, PoolsStatus


class ProviderBusyError(OSError):
    """The provider cannot change a pool now (another operation on it runs, a rate limit):
    try again next pass. It says nothing of capacity, so it is never read as a stock-out."""


class PoolProvider(Protocol):
    """Starts and stops the nodes of pools (local `ray start` processes, GKE node pools).

    Eventually consistent: a launched node shows in `nodes()` at once but joins Ray only
    after its boot time. Not idempotent by itself: the scaler decides counts from a fresh
    `nodes()` every time, so a repeated decision sees the nodes the last one launched.
    """

    async def nodes(self) -> list[ProvidedNode]: ...

    async def launch(self, pool: PoolSpec, count: int) -> list[str]:
        """Start `count` nodes of the pool; returns their names. `ProviderBusyError` when
        it cannot now; any other `OSError` is read as no capacity of this kind for now."""
        ...

    async def release(self, node: str) -> None:
        """Stop one node; a no-op for a node already gone. An error means the node still
        runs (and is still billed)."""
        ...

    async def ended(self, nodes: Mapping[str, datetime]) -> dict[str, NodeEnd]:
        """When each of these nodes stopped (each by its name, with when the life asked
        about began: a provider that makes a machine again under its name has recorded
        one end per life), as far as the provider recorded it (a local node's recorded
        exit or last stamp, a VM's preemption or deletion); a node it kept no record of
        is left out, and the scaler falls back on its own last sighting."""
        ...

    async def stopped(self) -> list[StoppedNode]:
        """Every node this provider launched and knows to have stopped, as far back as it
        keeps records. A scaler that dies between a launch and its announcement leaves a
        node no event names: if that node stops before the next scaler lists it, this
        record is the only trace of it, and what it is billed from."""
        ...


class ClusterObserver(Protocol):
    """Ray's own view of its nodes: free resources and how long each has been idle. Both
    calls raise `shared.ray_head.RayHeadUnavailableError` while Ray's head does not answer."""

    async def nodes(self) -> dict[str, ObservedNode]:
        """Live nodes by spotrain node name; nodes spotrain did not start are left out."""
        ...

    async def drain_idle(self, node: str) -> str | None:
        """Ask Ray to let an idle node go before its VM is deleted (Ray's idle-termination
        drain, which Ray refuses for a node that took work since it was seen idle).
        None once Ray agreed, or when Ray holds no such live node; else Ray's refusal.
        Once agreed, Ray places nothing more there."""
        ...


class DemandStore(Protocol):
    """Pending demand, in a bucket the scaler alone writes, so a restart loses none."""

    async def put(self, demand: Demand) -> None:
        """Store a job's pending demand, unless a later attempt's (or a later queueing of
        the same attempt, `Demand.requeued`) is already stored."""
        ...

    async def place(self, demand: Demand, nodes: tuple[str, ...]) -> bool:
        """Mark this very demand placed on `nodes`, by compare-and-set: False, and nothing
        written, when the stored one is gone or changed meanwhile (its job started or was
        cancelled, or it was queued anew)."""
        ...

    async def remove(self, job_id: str, attempt: int) -> None:
        """Drop the job's demand if it is for `attempt` or an earlier one: a late event of
        a lost attempt must not drop the demand of the attempt that resumes it."""
        ...

    async def get(self, job_id: str) -> Demand | None: ...

    async def all(self) -> list[Demand]: ...


class StatusBoard(Protocol):
    """Where the scaler posts the pools' status for clients; last write wins."""

    async def publish_status(self, status: PoolsStatus) -> None: ...

    async def publish_sightings(self, sightings: NodeSightings) -> None:
        """When each open node was last seen alive; last write wins."""
        ...

    async def sightings(self) -> NodeSightings | None:
        """What the last `publish_sightings` wrote (by this process or one before it)."""
        ...

    async def publish_spend(self, spend: OwnersSpend) -> None:
        """What each owner spent this month, for team budgets."""
        ...

    async def publish_knowledge(self, knowledge: PoolsKnowledge) -> None:
        """What has been learnt of each pool; last write wins."""
        ...

    async def knowledge(self) -> PoolsKnowledge | None:
        """What the last `publish_knowledge` wrote (by this process or one before it)."""
        ...


class NodeEventHistory(Protocol):
    """The node lifetime events on record (`node.launched`, `node.released`, `node.lost`),
    for a scaler that starts and must know which nodes the ledger still bills."""

    async def node_events(self) -> list[Event[Any]]:
        """Every stored node lifetime event, oldest first; unreadable ones left out."""
        ...


__all__ = ["ObservedNode", "ProvidedNode"]


class CostEventFeed(Protocol):
    """The events cost accounting reads: every one stored, then each new one."""

    async def follow(self, stop: asyncio.Event, add: Callable[[Event[Any]], None]) -> None:
        """Hand each event to `add` until `stop`; an event may come more than once, and
        events of different aggregates in any order."""
        ...


@runtime_checkable
class CapacityAdvisor(Protocol):
    """A provider that can say what the cloud forecasts of its spot pools (Compute Engine's
    capacity advice; the local stack's market trace)."""

    async def advice(self, pools: Sequence[PoolSpec]) -> dict[str, SpotAdvice]:
        """For each of these spot pools it can advise on: how likely a VM is to be had now,
        and how long most run before they are taken back. Errors are `OSError`s."""
        ...
