"""The simulated cluster's state as the trace replay keeps it, and what a policy under
simulation sees and decides at a tick. Plain data: no policy, no clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from services.scaler.model import Demand, NodeView, PoolSpec, ScalerConfig
from shared.events.types import Bundle, CapacityClass
from shared.policy.deadline import SpotAdvice

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated second 0; the policy takes aware datetimes."""

CPUS_PER_GPU = 1.0
"""A trace gives GPUs only; each bundle asks one CPU per GPU, so CPUs never bind on a pool
with at least as many CPUs as GPUs (which `simulate.load_pools` checks)."""


@dataclass(eq=False, slots=True)
class SimNode:
    """One launched node: booting until `ready_s`, then in the cluster until released."""

    name: str
    pool: PoolSpec
    launched_s: float
    ready_s: float
    ready: bool = False
    free_gpus: int = 0
    idle_since_s: float | None = None
    """When it last became empty (or ready while empty); None while something runs on it."""
    placed_s: float | None = None
    """When a policy last placed a job on it (`Decision.placements`)."""
    jobs: dict[int, int] = field(default_factory=dict)
    """Job index → GPUs that job holds here."""
    view: NodeView | None = None
    """The policy's view of it, kept while nothing about it changes."""


@dataclass(eq=False, slots=True)
class SimJob:
    """One trace job: its bundles, and where its current attempt stands."""

    index: int
    job_id: str
    arrival_s: float
    gpus: int
    duration_s: float
    bundles: tuple[int, ...]
    """GPUs per bundle, largest first; all are placed or none (gang)."""
    attempt: int = 1
    queued_s: float = 0.0
    started_s: float | None = None
    waited_s: float = 0.0
    done: bool = False
    deadline_s: float | None = None
    saved_s: float = 0.0
    """Work kept by checkpoints from earlier attempts: the next one runs the rest."""
    finished_s: float | None = None
    capacity: CapacityClass = CapacityClass.ANY
    """What its current attempt may run on: a deadline policy may pin it to spot or to
    on-demand; the placement honours it."""
    demand: Demand | None = None
    """The policy's view of this attempt, built once per attempt and capacity."""

    @property
    def remaining_s(self) -> float:
        return self.duration_s - self.saved_s

    def to_demand(self, capacity: CapacityClass | None = None) -> Demand:
        """Its current attempt as demand, on its capacity class or the one given."""
        capacity = capacity or self.capacity
        if (
            self.demand is None
            or self.demand.attempt != self.attempt
            or self.demand.capacity is not capacity
        ):
            # model_construct: the simulator built these values itself, so validating each
            # of hundreds of thousands of them would only cost time.
            self.demand = Demand.model_construct(
                job_id=self.job_id,
                attempt=self.attempt,
                bundles=tuple(
                    Bundle.model_construct(gpus=b, cpus=b * CPUS_PER_GPU, memory_gb=0.0)
                    for b in self.bundles
                ),
                capacity=capacity,
                priority=5,
                queued_at=EPOCH + timedelta(seconds=self.queued_s),
            )
        return self.demand


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What a policy sees at a decision tick: every live node (booting or ready) and every
    queued job, in queue order."""

    now_s: float
    pools: Sequence[PoolSpec]
    config: ScalerConfig
    nodes: Sequence[SimNode]
    pending: Sequence[SimJob]
    idle: Sequence[SimNode]
    """The ready nodes running nothing, of `nodes`."""
    sizes: Mapping[str, int]
    """Nodes per pool, of `nodes`."""
    stocked_out_s: Mapping[str, float] = field(default_factory=dict)
    """Per pool, when a launch last failed for want of capacity (a spot stock-out)."""
    taken_back: Mapping[str, int] = field(default_factory=dict)
    """Per pool, nodes its market took back so far."""
    node_hours: Mapping[str, float] = field(default_factory=dict)
    """Per pool, node-hours of the nodes that have ended so far."""
    restart_overhead_s: float = 0.0
    """What a start may cost a job: a boot, and the work a loss without notice undoes."""
    decision_interval_s: float = 10.0
    """How far apart the replay's decisions may fall: how long a wait lasts at least."""
    idle_periods: Mapping[str, Sequence[float | None]] = field(default_factory=dict)
    """Per pool, recent idle periods: work came for the node after so many seconds, or
    None when none came within the configured timeout (`Simulation._demand_came`)."""
    idle_periods_ended: Mapping[str, int] = field(default_factory=dict)
    """Per pool, how many such periods have ended in all."""
    advice: Mapping[str, SpotAdvice] = field(default_factory=dict)
    """Per market pool, the cloud's forecast now, for a policy told one (`told_advice`)."""


@dataclass(frozen=True, slots=True)
class Decision:
    launch: dict[str, int] = field(default_factory=dict)
    """Pool name → nodes to add now."""
    release: tuple[str, ...] = ()
    """Names of idle nodes to remove now."""
    idle_timeouts: dict[str, float] = field(default_factory=dict)
    """Pool → the idle timeout it applies now, if not the configured one (the replay sets
    its alarms by it)."""
    capacity: dict[int, CapacityClass] = field(default_factory=dict)
    """Job index → what its current attempt may run on from now (a deadline policy's
    choice); jobs not named keep theirs."""
    placements: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Job index → the ready nodes its current attempt starts on now, one per bundle,
    largest bundle first (a policy that places its jobs)."""


class SimPolicy(Protocol):
    """A scaling policy under simulation. `decide` may keep bookkeeping between calls (the
    naive policy remembers which attempts it launched for) but reads no clock."""

    name: str
    watches_queue: bool
    """False for a policy that ignores queued work: it is asked only at the start and after
    a loss, which keeps a replay with a long queue fast."""
    told_advice: bool
    """Whether the replay tells it each market's forecast (`ClusterState.advice`)."""
    places_jobs: bool
    """Whether a job starts only where the policy places it (`Decision.placements`), as
    spotrain's do: the scaler's pass places each queued attempt (`job.placed`) before Ray
    gets it. Otherwise the replay places like Ray: at once, on any free room, best fit."""
    interval_s: float
    """How often the system it stands for decides, live: a job that needs a node waits for
    the next decision, so this is part of every wait for a boot."""

    def decide(self, state: ClusterState) -> Decision: ...
