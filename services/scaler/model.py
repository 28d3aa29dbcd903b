"""The scaler's value types: pools, the nodes it sees, pending demand, and its plan."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AwareDatetime, Field

from shared.events.types import Bundle, CapacityClass, Frozen, Name


class Room(Frozen):
    """Free resources on a node; unlike a job's bundle, any of them may be zero."""

    gpus: Annotated[int, Field(ge=0)] = 0
    cpus: Annotated[float, Field(ge=0)] = 0.0
    memory_gb: Annotated[float, Field(ge=0)] = 0.0
    gpu_type: Name | None = None


class PoolSpec(Frozen):
    """A node shape with a capacity class, a price and size limits."""

    name: Name
    capacity: CapacityClass
    gpus: Annotated[int, Field(ge=0, le=16)]
    cpus: Annotated[float, Field(gt=0)]
    memory_gb: Annotated[float, Field(ge=0)] = 0.0
    gpu_type: Name | None = None
    price_per_hour_usd: Annotated[float, Field(ge=0)]
    boot_time_s: Annotated[float, Field(ge=0)] = 60.0
    min_nodes: Annotated[int, Field(ge=0)] = 0
    max_nodes: Annotated[int, Field(ge=0)] = 10
    zone: Name | None = None
    """Where its nodes run. The same shape in several zones is several pools, each with its
    own market (stock-outs and preemptions differ by zone); a gang stays in one zone."""

    @property
    def shape(self) -> Room:
        return Room(
            gpus=self.gpus, cpus=self.cpus, memory_gb=self.memory_gb, gpu_type=self.gpu_type
        )


class ProvidedNode(Frozen):
    """A node a provider launched and has not released, whether or not it joined Ray."""

    name: str
    pool: str
    launched_at: AwareDatetime
    not_started: str | None = None
    """Why the provider gave up on starting it (the zone out of this machine type, a
    quota, a create that never finished), with the cloud's words; None while it runs or
    may yet. Such a node never ran: the scaler removes it and stops asking the pool for a
    while, as for a failed growth."""
    life: str | None = None
    """Which machine is behind the name now (a GCE VM's `id`), where the provider can
    make another under the same name; None where it is not known (yet), or a name is
    never used twice. A name whose life changes is a node that ended and another."""
    recreating: bool = False
    """The provider is making the name's machine again (a managed instance group
    recreating a preempted or deleted VM): the machine before is gone."""


class StoppedNode(Frozen):
    """A node a provider launched that no longer runs; when it ended, `ended()` says."""

    name: str
    pool: str
    launched_at: AwareDatetime


class ObservedNode(Frozen):
    """A live node as Ray sees it."""

    name: str
    free: Room
    idle_s: float
    draining: bool = False
    """Ray was told the node goes away (a preemption notice), or has already let it go (a
    drained node leaves Ray once idle, before its VM is gone): nothing new goes there."""


class NodeView(Frozen):
    """One node as the scaler sees it: launched by a provider, maybe already in Ray."""

    name: Name
    pool: Name
    ready: bool
    """In the Ray cluster; a booting node is counted but not yet usable."""
    free: Room
    idle_s: Annotated[float, Field(ge=0)] = 0.0
    age_s: Annotated[float, Field(ge=0)] = 3600.0
    """Time since the provider launched it."""
    draining: bool = False
    """Going away (a preemption notice): it offers no room, and never makes its pool wait."""


class Demand(Frozen):
    """One queued attempt's exact shape: all of its bundles are placed, or none."""

    job_id: str
    attempt: int
    bundles: tuple[Bundle, ...]
    capacity: CapacityClass
    priority: int = 5
    queued_at: AwareDatetime
    deadline: AwareDatetime | None = None
    work_left_s: float | None = None
    """Run time still needed, at the job's pace or its estimate (None: not known)."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes it must not be placed on (they went away under its job before)."""
    requeued: int = 0
    """Which queueing of its attempt this is (`JobQueued.requeued`)."""
    placed_on: tuple[str, ...] = ()
    """The nodes a pass placed it on (`job.placed`), one per bundle: their room is held
    for it until it starts, as long as they are up and not draining."""
    started: bool = False
    """The attempt runs, its gang not yet placed: a multi-node driver asks for nothing and
    starts on the head at once (`policy.elastic.kept_at_start`); done with once a pass
    finds it room, as growth is (`policy.elastic.served`)."""


def queueing(demand: Demand) -> tuple[int, int]:
    """Which queueing of its job a demand stands for: a later one replaces an earlier one,
    never the other way round (a late event must not bring back an old demand)."""
    return demand.attempt, demand.requeued


class ScalerConfig(Frozen):
    budget_per_hour_usd: Annotated[float, Field(ge=0)] = 50.0
    idle_timeout_s: Annotated[float, Field(ge=0)] = 300.0
    any_fallback_after_s: Annotated[float, Field(ge=0)] = 600.0
    """An `any` job waiting this long for spot capacity may take on-demand nodes (one with
    a deadline and a known pace goes by the deadline policy instead)."""
    pass_interval_s: Annotated[float, Field(gt=0)] = 2.0
    """How often the scaler decides: the deadline policy's decision interval."""
    max_launch_per_pool: Annotated[int, Field(ge=1)] = 20
    """The most nodes one decision adds to one pool (the scale-up rate)."""
    settle_s: Annotated[float, Field(ge=0)] = 20.0
    """After a launch, a pool adds no node for this long: work placed on the new nodes is
    still pending in the demand until its job reports started, and must not count twice."""
    capacity_retry_after_s: Annotated[float, Field(ge=0)] = 300.0
    """A pool whose resize failed (e.g. no spot capacity in the zone) is not grown for this
    long; meanwhile `any` jobs take on-demand capacity at once."""
    learn_idle_timeout: bool = True
    """Whether each pool's idle timeout is the one its idle periods say costs least
    (`policy.keepalive`), never above `idle_timeout_s`; off, `idle_timeout_s` always."""


class Reason(StrEnum):
    PENDING_DEMAND = "pending-demand"
    IDLE = "idle"
    BELOW_MIN = "below-min"
    STEADY = "steady"


class BlockedReason(StrEnum):
    NO_POOL_FITS = "no-pool-fits"
    OUT_OF_CAPACITY = "out-of-capacity"
    """Every pool the job may use failed its last growth (a stock-out): it waits."""
    POOL_AT_MAX = "pool-at-max"
    OVER_BUDGET = "over-budget"
    SETTLING = "settling"


class PoolPlan(Frozen):
    pool: Name
    current: int
    target: int
    reason: Reason


class Blocked(Frozen):
    job_id: str
    attempt: int
    reason: BlockedReason
    detail: str
    pool: Name | None = None
    """The pool that would have grown, when one could have."""


class Placement(Frozen):
    """Room on named, ready nodes that a queued attempt may take now: Ray gets it pinned
    there, and the room is held for it until it starts."""

    job_id: str
    attempt: int
    requeued: int = 0
    nodes: tuple[Name, ...]
    """One per bundle."""
    pool: Name


class ScalePlan(Frozen):
    """The decision: a target per pool, which idle nodes to release, what is blocked, and
    which queued attempts take room on which nodes."""

    pools: tuple[PoolPlan, ...]
    release: tuple[Name, ...] = ()
    blocked: tuple[Blocked, ...] = ()
    in_room: tuple[str, ...] = ()
    """The demands that fit in room the nodes have now, placed before any node was bought
    in this decision (whose room would count too)."""
    placements: tuple[Placement, ...] = ()
    """Queued attempts (`elastic.is_queued_attempt`) placed by this decision on ready nodes
    (placed anew, or again when a node they were placed on went before they started), in
    the platform's order. Growth and moves take room too, but hand nothing to Ray."""

    def target(self, pool: str) -> int:
        return next(p.target for p in self.pools if p.pool == pool)
