"""Elastic demand: the workers a running multi-node attempt misses, from its `job.resized`.

Its MIN workers are a gang, placed all or none when it is queued (as any job's). Once it
runs, each worker it misses is a demand of its own, so capacity that comes one node at a
time is taken one worker at a time:
- below MIN (a node went and the group cannot go on), on the attempt's capacity at the
  job's priority: the attempt waits for these;
- from MIN to MAX, on spot only and at the lowest priority, after every other job's
  queued work: opportunistic, never a reason to buy on-demand.
Pure: the caller says when.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from services.scaler.model import Demand
from shared.events.data import JobResized
from shared.events.types import CapacityClass

OPPORTUNISTIC_PRIORITY = 0
"""Below any job's own priority (1-9 are the users'; 0 too, placed after them by age)."""


def growth_demand_id(job_id: str, worker: int) -> str:
    """The demand for the `worker`-th missing worker of a running job (0 is the first)."""
    return f"{job_id}.grow-{worker}"


def is_growth_of(demand_id: str, job_id: str) -> bool:
    head, _, worker = demand_id.rpartition(".grow-")
    return head == job_id and worker.isdigit()


def is_growth(demand_id: str) -> bool:
    head, _, worker = demand_id.rpartition(".grow-")
    return bool(head) and worker.isdigit()


_MOVE_SUFFIX = ".move"


def move_demand_id(job_id: str) -> str:
    """The room wanted for a running attempt of `job_id` to move to (make before break)."""
    return f"{job_id}{_MOVE_SUFFIX}"


def is_queued_attempt(demand: Demand) -> bool:
    """Whether the demand stands for an attempt waiting in the queue, to be handed to Ray
    once placed: not a running attempt's growth, nor room for a move, nor a gang whose
    driver runs already (`kept_at_start`)."""
    return (
        not demand.started
        and not is_growth(demand.job_id)
        and not (demand.job_id.endswith(_MOVE_SUFFIX))
    )


def served(demands: Iterable[Demand], in_room: Iterable[str]) -> list[str]:
    """The demands of running attempts that the nodes have room for now, growth and gangs
    started before their room was found: done with, since the attempt's own Ray Train
    takes that room (held on, they would buy another node while it does, its room taken by
    the workers the demand stands for). A queued attempt's demand stays until it starts."""
    room = set(in_room)
    return [d.job_id for d in demands if d.job_id in room and (d.started or is_growth(d.job_id))]


def kept_at_start(demand: Demand | None, attempt: int, *, in_room: bool) -> Demand | None:
    """What is still wanted of an attempt's demand once it has started, `in_room` if the
    last pass found room for it.

    A single-node attempt starts on its node: nothing. A multi-node attempt's driver asks
    for nothing and starts on the head at once, its gang still to be placed by Ray Train,
    maybe before any pass saw its demand, or while the nodes bought for it boot or fail to
    come: dropped then, the gang would wait for room nobody asks for. It stays, marked
    started, until a pass finds it room (`served`); unless the last pass already had room
    for it, which the gang is taking."""
    if demand is None or demand.attempt != attempt or len(demand.bundles) < 2 or in_room:
        return None
    return demand.model_copy(update={"started": True})


@dataclass(frozen=True)
class Growth:
    wanted: tuple[Demand, ...]
    """A demand per missing worker."""
    withdrawn: tuple[str, ...]
    """The demand ids of workers it no longer misses."""


def growth(resized: JobResized, at: datetime) -> Growth:
    """The demand for the workers the attempt misses now, and what to withdraw."""
    below_min = max(resized.min_workers - resized.workers, 0)
    opportunistic = max(resized.max_workers - max(resized.workers, resized.min_workers), 0)
    if resized.capacity is CapacityClass.ON_DEMAND:
        opportunistic = 0
    wanted: list[Demand] = []
    for k in range(below_min + opportunistic):
        needed = k < below_min
        wanted.append(
            Demand(
                job_id=growth_demand_id(resized.job_id, k),
                attempt=resized.attempt,
                bundles=(resized.worker,),
                capacity=resized.capacity if needed else CapacityClass.SPOT,
                priority=resized.priority if needed else OPPORTUNISTIC_PRIORITY,
                queued_at=at,
            )
        )
    withdrawn = tuple(
        growth_demand_id(resized.job_id, k) for k in range(len(wanted), resized.max_workers)
    )
    return Growth(wanted=tuple(wanted), withdrawn=withdrawn)
