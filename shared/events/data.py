"""The `data` of every event on the bus: one frozen model per event type.

These models are the contract with outside publishers (CLI, notebooks, Slack, any tool):
`spotrain schema` exports them as JSON Schema and AsyncAPI. Events are past-tense facts,
except the `*_requested` ones, which are requests a service may refuse.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Self

from pydantic import AwareDatetime, Field, field_validator, model_validator

from shared.events.types import (
    Attempt,
    Bundle,
    CapacityClass,
    EnvName,
    Frozen,
    JobId,
    Label,
    LongText,
    Name,
    ObjectRef,
    SecretName,
    ShortText,
    Step,
    Uri,
)


class EventData(Frozen):
    """Base of all event data; subclasses name their place in the catalog."""

    aggregate: ClassVar[str]
    event: ClassVar[str]
    version: ClassVar[int] = 1

    @classmethod
    def event_type(cls) -> str:
        """The versioned CloudEvents `type`, e.g. `spotrain.job.requested.v1`."""
        return f"spotrain.{cls.aggregate}.{cls.event}.v{cls.version}"


# --- jobs ---------------------------------------------------------------------------------


class JobRequested(EventData):
    """Someone asks the platform to run a training job."""

    aggregate = "job"
    event = "requested"

    job_id: JobId
    owner: Name
    experiment: Name | None = None
    entrypoint: Annotated[tuple[ShortText, ...], Field(min_length=1, max_length=256)]
    """The command as an argv list; it is quoted before it reaches any shell."""
    working_dir: ObjectRef | None = None
    worker: Bundle = Bundle()
    num_workers: Annotated[int, Field(ge=1, le=256)] = 1
    """The workers the job needs all of (a gang): a fixed count, or the least of a range."""
    max_workers: Annotated[int, Field(ge=2, le=256)] | None = None
    """The most workers of an elastic Ray Train job (`--workers MIN..MAX`): it runs with
    as many as capacity allows between `num_workers` and this, and goes on with fewer
    when a node goes; None for a fixed count."""
    capacity: CapacityClass = CapacityClass.ANY
    priority: Annotated[int, Field(ge=0, le=9)] = 5
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    checkpoint_interval_s: Annotated[int, Field(ge=1, le=86_400)] | None = None
    labels: Annotated[dict[Label, Annotated[str, Field(max_length=256)]], Field(max_length=32)] = (
        Field(default_factory=dict)
    )
    env: Annotated[dict[EnvName, Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = (
        Field(default_factory=dict)
    )
    secrets: Annotated[dict[EnvName, SecretName], Field(max_length=32)] = Field(
        default_factory=dict
    )
    """Environment variables the attempt gets from the platform's secrets, by name: the
    values never enter the bus, a record or a log."""
    pip: Annotated[tuple[Annotated[str, Field(max_length=256)], ...], Field(max_length=64)] = ()
    deadline: AwareDatetime | None = None
    """When the result is needed: the platform picks spot or on-demand over the job's life
    so that it ends before this, as cheaply as the deadline allows."""
    estimate_s: Annotated[int, Field(ge=1, le=366 * 86_400)] | None = None
    """The run time the submitter expects on uninterrupted capacity, until the job reports
    its own pace."""
    max_hours: Annotated[float, Field(gt=0, le=366 * 24)] | None = None
    """The longest the job may run, all attempts together; the platform stops it there. A
    team with a budget admits it at its worst case: GPUs x price x max hours."""

    @property
    def most_gpus(self) -> int:
        """The GPUs it may hold at once: an elastic job's at its MAX workers, which it
        grows to whenever there is room, so quotas and budgets count that many."""
        return self.worker.gpus * (self.max_workers or self.num_workers)

    @model_validator(mode="after")
    def _workers_are_a_range(self) -> Self:
        if self.max_workers is not None and self.max_workers <= self.num_workers:
            msg = (
                f"max_workers ({self.max_workers}) must be above num_workers "
                f"({self.num_workers}): a fixed count has no max_workers"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _secrets_are_not_env(self) -> Self:
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            msg = f"{both[0]} is set both as an environment variable and as a secret"
            raise ValueError(msg)
        return self


class JobAccepted(EventData):
    """The submitter validated a request and owns the job from now on."""

    aggregate = "job"
    event = "accepted"

    job_id: JobId
    owner: Name
    experiment: Name | None = None


class RejectionReason(StrEnum):
    INVALID = "invalid"
    QUOTA_EXCEEDED = "quota-exceeded"
    DUPLICATE = "duplicate"
    UNSCHEDULABLE = "unschedulable"
    DEADLINE_UNREACHABLE = "deadline-unreachable"
    """Its deadline has passed, or its estimate does not fit before it even on on-demand."""
    NO_TEAM = "no-team"
    """The platform runs with teams and the owner is in none."""
    OVER_BUDGET = "over-budget"
    """The job's worst-case cost does not fit what is left of its team's monthly budget."""


class JobRejected(EventData):
    """The submitter refused a request; `detail` says why in words a user can act on."""

    aggregate = "job"
    event = "rejected"

    job_id: JobId
    reason: RejectionReason
    detail: ShortText


class JobQueued(EventData):
    """An attempt waits for capacity: the exact demand the scaler acts on."""

    aggregate = "job"
    event = "queued"

    job_id: JobId
    attempt: Attempt
    bundles: Annotated[tuple[Bundle, ...], Field(min_length=1, max_length=256)]
    capacity: CapacityClass
    priority: Annotated[int, Field(ge=0, le=9)]
    deadline: AwareDatetime | None = None
    """The job's deadline, if it has one: the scaler picks spot or on-demand to meet it."""
    work_left_s: Annotated[float, Field(ge=0)] | None = None
    """Run time the attempt still needs: at the job's reported pace, else its estimate."""
    avoid_nodes: Annotated[tuple[Name, ...], Field(max_length=256)] = ()
    """Nodes the attempt must not be placed on (they went away under the job before): the
    room the scaler counts for it is room it can use."""
    requeued: Annotated[int, Field(ge=0, le=10_000)] = 0
    """How often this attempt went back to the queue for want of room (its placement
    failed before it ran): each time a new demand, as a fresh queued attempt."""


class JobPlaced(EventData):
    """The scaler found room for a queued attempt on named nodes and holds it for that
    attempt alone: the submitter hands it to Ray now, pinned to those nodes. Until then
    nothing of the attempt is in Ray (the platform's queue, not Ray's, is where it waits)."""

    aggregate = "job"
    event = "placed"

    job_id: JobId
    attempt: Attempt
    requeued: Annotated[int, Field(ge=0, le=10_000)] = 0
    """The `job.queued` this placement answers (`JobQueued.requeued`)."""
    nodes: Annotated[tuple[Name, ...], Field(min_length=1, max_length=256)]
    """The node of each of its bundles, in the order of the demand's bundles."""
    pool: Name | None = None
    """The pool of the first bundle's node."""


class JobStarted(EventData):
    """Ray runs an attempt."""

    aggregate = "job"
    event = "started"

    job_id: JobId
    attempt: Attempt
    submission_id: Name
    pool: Name | None = None
    nodes: Annotated[tuple[Name, ...], Field(max_length=256)] = ()


class JobProgress(EventData):
    """Training code reported where it is."""

    aggregate = "job"
    event = "progress"

    job_id: JobId
    attempt: Attempt
    step: Step
    total_steps: Step | None = None
    metrics: Annotated[dict[Label, float], Field(max_length=64)] = Field(default_factory=dict)
    eta_s: Annotated[float, Field(ge=0)] | None = None


class JobCheckpointed(EventData):
    """An attempt wrote a complete checkpoint."""

    aggregate = "job"
    event = "checkpointed"

    job_id: JobId
    attempt: Attempt
    step: Step
    uri: Uri


class InterruptionCause(StrEnum):
    PREEMPTED = "preempted"
    NODE_LOST = "node-lost"
    MOVED = "moved"
    """The platform stopped it to go on elsewhere (`job.resumed` with `moved`): not a loss,
    so it spends none of the job's restart budget."""
    RECLAIMED = "reclaimed"
    """The platform stopped it, checkpoint first, to give its team's borrowed quota back to
    the team that lent it: not the job's loss either, and no restart budget spent."""
    PRIORITY = "priority"
    """The platform stopped it, checkpoint first, to run a higher priority job of its team."""
    HEAD_LOST = "head-lost"
    """The platform's own Ray node went, and the attempt with it: the head (a head back
    without its state no longer knows the attempt; one back with it says the attempt's
    supervisor died there), or the node off the pools that ran its driver. Not the job's
    loss: no restart budget spent, and it goes on on the same capacity."""
    SHORT_OF_WORKERS = "short-of-workers"
    """An elastic attempt held fewer than its MIN workers for too long (their nodes went
    and no room came back): the platform stopped it to go on as a new attempt from its
    latest checkpoint, where the checkpointer finds capacity. A loss: it spends the budget."""


class MoveReason(StrEnum):
    """Why the platform moved a running attempt to other capacity."""

    SPOT_RETURNED = "spot-returned"
    """Spot is back, and the deadline leaves room for the restarts of a round trip."""


class JobInterrupted(EventData):
    """An attempt stopped because its capacity went away, not because of its own code."""

    aggregate = "job"
    event = "interrupted"

    job_id: JobId
    attempt: Attempt
    node: Name
    cause: InterruptionCause


class JobResumed(EventData):
    """A new attempt was submitted from the latest checkpoint (or from scratch)."""

    aggregate = "job"
    event = "resumed"

    job_id: JobId
    attempt: Attempt
    from_checkpoint: Uri | None = None
    from_step: Step = 0
    steps_lost: Step = 0
    capacity: CapacityClass
    moved: MoveReason | None = None
    """Set when the attempt it follows was still running and the platform moved it (its
    deadline policy): that attempt is stopped, and it is not counted as a loss."""


class JobMoveRequested(EventData):
    """The platform would move a running attempt to `capacity`, and asks for room there
    first (make before break): the scaler grows a pool of it as for a queued attempt of
    this shape, learning meanwhile whether the market has any, and the attempt is moved
    only once there is room. Withdrawn when the attempt ends, however it ends."""

    aggregate = "job"
    event = "move_requested"

    job_id: JobId
    attempt: Attempt
    """The running attempt that would move."""
    capacity: CapacityClass
    bundles: Annotated[tuple[Bundle, ...], Field(min_length=1, max_length=256)]
    priority: Annotated[int, Field(ge=0, le=9)] = 5
    reason: MoveReason


class ResizeReason(StrEnum):
    """Why a multi-node attempt's worker count changed (it is the same attempt throughout:
    Ray Train restarts its group within the job, from the latest checkpoint)."""

    COUNTED = "counted"
    """The first count the attempt reported."""
    SHRANK = "shrank"
    """It goes on with fewer workers: a node went, with or without notice."""
    GREW = "grew"
    """Capacity came back and Ray Train took it."""
    MOVED = "moved"
    """As many workers as before, on other nodes: Ray Train restarted its group after a
    loss, and other room was there at once."""


class JobResized(EventData):
    """A running multi-node attempt has a new number of workers, as its training reports
    it or Ray says (0: its group is down, waiting for room). Below `max_workers`, the
    scaler looks for room for the missing workers (past `min_workers` on spot at the
    lowest priority); the attempt goes on meanwhile."""

    aggregate = "job"
    event = "resized"

    job_id: JobId
    attempt: Attempt
    workers: Annotated[int, Field(ge=0, le=256)]
    previous: Annotated[int, Field(ge=0, le=256)] | None = None
    """The count before; None for the first."""
    min_workers: Annotated[int, Field(ge=1, le=256)]
    max_workers: Annotated[int, Field(ge=1, le=256)]
    reason: ResizeReason
    worker: Bundle
    """One worker's bundle: what each missing worker needs."""
    capacity: CapacityClass
    """Where the attempt's workers run (spot or on-demand)."""
    priority: Annotated[int, Field(ge=0, le=9)] = 5
    step: Step | None = None
    """The step it reported with the new count."""
    nodes: Annotated[tuple[Name, ...], Field(max_length=256)] = ()
    """The nodes that hold its workers from now on, one per worker, as Ray's state API
    says; empty where it could not say. What cost charges the attempt for."""
    steps_lost: Step = 0
    """The steps the restart went back: the work since the group's latest checkpoint."""


class JobSucceeded(EventData):
    aggregate = "job"
    event = "succeeded"

    job_id: JobId
    attempt: Attempt


class JobFailed(EventData):
    """An attempt failed for its own reasons and the job will not be retried."""

    aggregate = "job"
    event = "failed"

    job_id: JobId
    attempt: Attempt
    message: LongText


class JobCancelRequested(EventData):
    aggregate = "job"
    event = "cancel_requested"

    job_id: JobId
    requested_by: Name


class JobCancelled(EventData):
    aggregate = "job"
    event = "cancelled"

    job_id: JobId
    attempt: Attempt | None = None


# --- pools --------------------------------------------------------------------------------


class PoolResizeRequested(EventData):
    """The scaler decided a pool's new size and asked its provider for it."""

    aggregate = "pool"
    event = "resize_requested"

    pool: Name
    from_size: Annotated[int, Field(ge=0)]
    to_size: Annotated[int, Field(ge=0)]
    reason: Name


class PoolResized(EventData):
    aggregate = "pool"
    event = "resized"

    pool: Name
    size: Annotated[int, Field(ge=0)]


class PoolResizeFailed(EventData):
    aggregate = "pool"
    event = "resize_failed"

    pool: Name
    to_size: Annotated[int, Field(ge=0)]
    message: LongText


# --- nodes --------------------------------------------------------------------------------


class NodeJoined(EventData):
    """A node of a pool joined the Ray cluster."""

    aggregate = "node"
    event = "joined"

    node: Name
    pool: Name
    capacity: CapacityClass
    resources: Bundle


class NodeLaunched(EventData):
    """A provider started a node for a pool: from `launched_at` on, the node is billed.

    It carries the node's shape and the prices it is billed at, so that cost accounting
    needs nothing but the bus.
    """

    aggregate = "node"
    event = "launched"

    node: Name
    pool: Name
    capacity: CapacityClass
    """`spot` or `on-demand`: the class of the capacity itself, never `any`."""
    gpus: Annotated[int, Field(ge=0, le=16)]
    gpu_type: Name | None = None
    cpus: Annotated[float, Field(gt=0, le=1024)]
    memory_gb: Annotated[float, Field(ge=0, le=65_536)] = 0.0
    price_per_hour_usd: Annotated[float, Field(ge=0, le=100_000)]
    on_demand_pool: Name | None = None
    """The on-demand pool of the same shape this node is measured against (itself for an
    on-demand node); None when no such pool is configured."""
    on_demand_price_per_hour_usd: Annotated[float, Field(ge=0, le=100_000)] | None = None
    """That pool's price: what this node would cost on on-demand capacity."""
    launched_at: AwareDatetime
    host: Name | None = None
    """The machine's name, where the node is not named by it: a VM its group made again
    under its name is a new node (`<host>@<launch second>`), which Ray, Kubernetes and
    the attempts still call by the machine's name. None: the node's name is its host."""
    life: Name | None = None
    """Which machine it is behind its name (a GCE VM's `id`), where the provider says."""

    @field_validator("capacity")
    @classmethod
    def _a_node_is_spot_or_on_demand(cls, capacity: CapacityClass) -> CapacityClass:
        if capacity is CapacityClass.ANY:
            msg = "a node's capacity is spot or on-demand, not any"
            raise ValueError(msg)
        return capacity


class ReleaseReason(StrEnum):
    SCALED_DOWN = "scaled-down"
    """The scaler released it (idle, or above the pool's target)."""
    GONE = "gone"
    """The provider stopped listing it unasked: preempted, deleted by hand, or a
    placeholder that became a real node."""
    GONE_WHILE_UNWATCHED = "gone-while-unwatched"
    """It stopped while no scaler was watching (the scaler was down or restarting), and the
    scaler found it gone at its next start: its end is the provider's record, else the last
    time it was seen alive, never the time it was found gone."""
    STACK_STOPPED = "stack-stopped"
    """`spotrain down` stopped it with the rest of the local stack."""
    NEVER_STARTED = "never-started"
    """The provider gave up on starting it (a stock-out that outlived the create, a
    quota): it never ran, and ends where it was launched, billed nothing."""
    MAINTENANCE = "maintenance"
    """The provider replaced or recreated it in an upgrade or repair of its pool (GKE's
    node upgrades and auto-repair): gone unasked, but not taken back by the market."""


class NodeEndSource(StrEnum):
    """How the end of a node's billing is known."""

    RECORDED = "recorded"
    """The provider recorded when it stopped (a release, a VM's deletion or preemption
    time, a local node's recorded exit)."""
    LAST_SEEN = "last-seen"
    """Only when it was last seen alive: it stopped at some time after, unrecorded, so
    its billing ends there rather than at a guess."""


class NodeReleased(EventData):
    """A node stopped being the platform's: its billing ends at `released_at`."""

    aggregate = "node"
    event = "released"

    node: Name
    pool: Name
    reason: ReleaseReason
    released_at: AwareDatetime
    end_source: NodeEndSource = NodeEndSource.RECORDED
    """Whether `released_at` is the provider's record or the node's last sighting."""


class NoticeSource(StrEnum):
    GCE_PUBSUB = "gce-pubsub"
    K8S = "k8s"
    METADATA = "metadata"
    LOCAL = "local"


class NodePreempting(EventData):
    """The cloud announced that a node will be taken away at `deadline`."""

    aggregate = "node"
    event = "preempting"

    node: Name
    pool: Name | None = None
    deadline: AwareDatetime
    source: NoticeSource


class NodeLost(EventData):
    """A node is gone: preempted, deleted, or dead."""

    aggregate = "node"
    event = "lost"

    node: Name
    pool: Name | None = None
    source: NoticeSource
    lost_at: AwareDatetime | None = None
