"""Elastic demand: what a running multi-node attempt misses, from its `job.resized`."""

from __future__ import annotations

import pytest

from services.scaler.model import Demand
from services.scaler.policy.elastic import (
    OPPORTUNISTIC_PRIORITY,
    growth,
    growth_demand_id,
    is_growth_of,
    kept_at_start,
    served,
)
from shared.events.data import JobResized, ResizeReason
from shared.events.types import Bundle, CapacityClass
from tests.events import NOW


def resized(workers: int, low: int, high: int, capacity: CapacityClass) -> JobResized:
    return JobResized(
        job_id="job-1",
        attempt=3,
        workers=workers,
        min_workers=low,
        max_workers=high,
        reason=ResizeReason.SHRANK,
        worker=Bundle(gpus=1, cpus=4),
        capacity=capacity,
        priority=7,
    )


S, OD, ANY = CapacityClass.SPOT, CapacityClass.ON_DEMAND, CapacityClass.ANY
P = OPPORTUNISTIC_PRIORITY


@pytest.mark.parametrize(
    ("shape", "capacity", "wanted", "withdrawn"),
    [
        pytest.param((4, 2, 4), S, [], [0, 1, 2, 3], id="full"),
        pytest.param((3, 2, 4), S, [(S, P)], [1, 2, 3], id="one-short-opportunistic"),
        pytest.param((2, 2, 4), ANY, [(S, P), (S, P)], [2, 3], id="any-grows-on-spot-only"),
        pytest.param((2, 2, 4), OD, [], [0, 1, 2, 3], id="on-demand-grows-not"),
        # Below MIN the group cannot go on: those at the job's priority, on its capacity.
        pytest.param((1, 2, 4), OD, [(OD, 7)], [1, 2, 3], id="on-demand-below-min"),
        pytest.param(
            (1, 2, 4), S, [(S, 7), (S, P), (S, P)], [3], id="below-min-then-opportunistic"
        ),
        pytest.param((3, 4, 4), S, [(S, 7)], [1, 2, 3], id="a-fixed-gang-short-of-one"),
    ],
)
def test_what_a_resized_attempt_misses(
    shape: tuple[int, int, int],
    capacity: CapacityClass,
    wanted: list[tuple[CapacityClass, int]],
    withdrawn: list[int],
) -> None:
    workers, low, high = shape  # workers now, MIN, MAX
    found = growth(resized(workers, low, high, capacity), NOW)
    assert [(d.capacity, d.priority) for d in found.wanted] == wanted
    assert [d.job_id for d in found.wanted] == [
        growth_demand_id("job-1", k) for k in range(len(wanted))
    ]
    assert all(d.attempt == 3 and d.bundles == (Bundle(gpus=1, cpus=4),) for d in found.wanted)
    assert found.withdrawn == tuple(growth_demand_id("job-1", k) for k in withdrawn)


@pytest.mark.parametrize(
    ("demand_id", "job_id", "matches"),
    [
        ("job-1.grow-0", "job-1", True),
        ("job-1.grow-12", "job-1", True),
        ("job-1.move", "job-1", False),
        ("job-10.grow-0", "job-1", False),
        ("job-1", "job-1", False),
        ("job-1.grow-x", "job-1", False),
    ],
)
def test_a_growth_demand_is_known_by_its_job(demand_id: str, job_id: str, matches: bool) -> None:
    assert is_growth_of(demand_id, job_id) is matches


def demand(job_id: str, *, workers: int = 2, attempt: int = 1, started: bool = False) -> Demand:
    return Demand(
        job_id=job_id,
        attempt=attempt,
        bundles=(Bundle(gpus=1, cpus=4),) * workers,
        capacity=S,
        queued_at=NOW,
        started=started,
    )


def test_only_running_attempts_demand_in_room_is_done_with() -> None:
    demands = [
        demand("job-1.grow-0", workers=1),
        demand("job-2"),  # queued: it stays until its attempt starts
        demand("job-2.move"),
        demand("job-3.grow-4", workers=1),  # not in room
        demand("job-4", started=True),
        demand("job-5", started=True),  # not in room
    ]
    in_room = ["job-1.grow-0", "job-2", "job-2.move", "job-4"]
    assert served(demands, in_room) == ["job-1.grow-0", "job-4"]


@pytest.mark.parametrize(
    ("stored", "attempt", "in_room", "kept"),
    [
        pytest.param(None, 1, False, False, id="none-stored"),
        pytest.param(demand("job-1", workers=1), 1, False, False, id="single-node-on-its-node"),
        pytest.param(demand("job-1"), 1, False, True, id="gang-no-room-found-yet"),
        pytest.param(demand("job-1"), 1, True, False, id="gang-taking-the-room-found"),
        pytest.param(demand("job-1", attempt=2), 1, False, False, id="a-later-attempts-demand"),
        pytest.param(demand("job-1", started=True), 1, False, True, id="told-twice"),
    ],
)
def test_what_a_started_attempt_still_wants(
    stored: Demand | None, attempt: int, in_room: bool, kept: bool
) -> None:
    still = kept_at_start(stored, attempt, in_room=in_room)
    assert (still is not None) is kept
    if still is not None:
        assert stored is not None
        assert still.started
        assert still.model_copy(update={"started": stored.started}) == stored
