"""The pools' status as the scaler's `pools` bucket holds it: written by the scaler alone,
read by `spotrain pools` and dashboards."""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, Field

from shared.events.types import CapacityClass, Frozen
from shared.messaging.ports import KeyValue
from shared.policy.deadline import SpotAdvice, SpotOutlook

STATUS_KEY = "status"
SIGHTINGS_KEY = "sightings"
SPEND_KEY = "spend"


def pools_bucket(prefix: str) -> str:
    return f"{prefix}-pools"


class PoolStatus(Frozen):
    pool: str
    capacity: CapacityClass
    price_per_hour_usd: float
    nodes: int
    ready: int
    gpus_total: int
    gpus_free: int
    pending_jobs: int
    pending_gpus: int
    target: int
    min_nodes: int
    max_nodes: int
    gpus_per_node: int | None = None
    """Its node shape's GPUs (None from a scaler that did not say)."""
    out_of_capacity_until: AwareDatetime | None = None
    """Its last growth failed (a stock-out): the scaler tries again from then."""
    taken_back: int = 0
    """Nodes it took back (or lost) unasked, as far as the scaler has watched it."""
    stock_outs: int = 0
    """Growths it refused for want of capacity."""
    outlook: SpotOutlook | None = None
    """A spot pool's availability as seen (`shared.policy.deadline`): for deadline decisions."""
    advice: SpotAdvice | None = None
    """What the cloud forecasts of a spot pool now (its capacity advice), where it says."""

    @property
    def can_grow(self) -> bool:
        """Whether the scaler would add a node to it now."""
        return self.out_of_capacity_until is None and self.nodes < self.max_nodes


class QueuedAttempt(Frozen):
    """An attempt in the platform's queue, where it stands and why it waits."""

    job_id: str
    attempt: int
    position: int
    """1 takes the next room that fits it (`services.scaler.policy.placement_order`)."""
    why: str


class PoolsStatus(Frozen):
    updated_at: AwareDatetime
    budget_per_hour_usd: float
    cost_per_hour_usd: float
    pools: tuple[PoolStatus, ...]
    blocked_jobs: int
    queue: tuple[QueuedAttempt, ...] = ()
    """The queued attempts the scaler places, in the order they take room (at most
    `MAX_QUEUE_SHOWN`)."""
    ray_head_away_since: AwareDatetime | None = None
    """Since when the scaler has not reached Ray's head; None while it answers. While it is
    away nothing is placed, grown or released, and the rest is the last pass's."""

    def place_of(self, job_id: str, attempt: int) -> QueuedAttempt | None:
        return next((q for q in self.queue if q.job_id == job_id and q.attempt == attempt), None)


MAX_QUEUE_SHOWN = 2000


class OwnersSpend(Frozen):
    """What each owner's jobs cost since the start of the month, as the scaler's ledger
    attributes it (`spotrain cost --by owner --since` the month's first day); written by
    the scaler each cost pass, read by the submitter for team budgets."""

    since: AwareDatetime
    at: AwareDatetime
    by_owner: dict[str, float]


def gpu_hour_usd(status: PoolsStatus, capacity: CapacityClass) -> float | None:
    """The dearest GPU-hour a job of this capacity could be billed (an `any` job may run on
    either); None when no pool of it has said its shape."""
    classes = (
        {CapacityClass.SPOT, CapacityClass.ON_DEMAND}
        if capacity is CapacityClass.ANY
        else {capacity}
    )
    prices = [
        pool.price_per_hour_usd / pool.gpus_per_node
        for pool in status.pools
        if pool.capacity in classes and pool.gpus_per_node
    ]
    return max(prices, default=None)


class NodeSightings(Frozen):
    """When each node open on the ledger was last seen alive by the scaler's provider.

    Written by the scaler each pass; a restarted scaler reads it to close the nodes that
    stopped while it was away at their last sighting, and `spotrain cost` bills a node no
    further than its last sighting.
    """

    updated_at: AwareDatetime
    pass_interval_s: float = Field(gt=0)
    """How often the scaler looks: a sighting much older than this is stale."""
    seen: dict[str, AwareDatetime]
    lives: dict[str, str] = Field(default_factory=dict)
    """Which machine each open node is, where the provider said so only after its launch
    (a VM made for it once the launch returned): a restarted scaler tells a machine made
    again under the node's name while it was away from the one it billed."""

    def stale_after_s(self) -> float:
        """How old a sighting may be before its node counts as unaccounted for: a few
        missed passes, and never less than the time a slow pass may take."""
        return max(3 * self.pass_interval_s, 15.0)


def billed_up_to(sightings: NodeSightings | None) -> dict[str, datetime]:
    """Where the ledger stops billing each open node: its last sighting. With no sightings
    at all (no scaler pass yet), every open node stops at its launch: never a guess."""
    return dict(sightings.seen) if sightings is not None else {}


class PoolsBucket:
    """The scaler's pools bucket, read (by the submitter for budgets, the checkpointer for
    capacity): its status, with prices, and each owner's spend."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def status(self) -> PoolsStatus | None:
        """The scaler's latest view; None before its first pass."""
        entry = await self._kv.get(STATUS_KEY)
        return PoolsStatus.model_validate_json(entry.value) if entry else None

    async def spend(self) -> OwnersSpend | None:
        """What each owner spent this month by the ledger; None before the scaler said."""
        entry = await self._kv.get(SPEND_KEY)
        return OwnersSpend.model_validate_json(entry.value) if entry else None
