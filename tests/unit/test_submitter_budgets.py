"""Team budgets at admission: a job's worst case (GPUs x the dearest GPU-hour it could be
billed x its max hours) against what the team spent this month by the ledger and what its
running jobs may still spend; a job past its max hours is stopped."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from services.submitter.handlers import Deps, admit_waiting, on_job_requested, track_attempts
from services.submitter.model import RayJobState
from shared.events import decode
from shared.events.data import RejectionReason
from shared.events.types import CapacityClass
from shared.messaging.memory import InMemoryBus
from shared.policy.teams import parse_teams
from shared.pools import OwnersSpend, PoolsStatus, PoolStatus
from tests.events import NOW, job_requested
from tests.fakes.clock import FixedClock
from tests.fakes.submitter import (
    FakeRay,
    FixedPools,
    FixedTeams,
    InMemoryJobStore,
    InMemoryTeamHolds,
    place_queued,
    submitter_deps,
)

TEAMS = parse_teams(
    """
[teams.vision]
members = ["alice", "bob"]
monthly_budget_usd = 100
[teams.vision.quota.spot]
guaranteed_gpus = 8
[teams.vision.quota.on-demand]
guaranteed_gpus = 8
"""
)


def pool(name: str, capacity: CapacityClass, price: float) -> PoolStatus:
    return PoolStatus(
        pool=name, capacity=capacity, price_per_hour_usd=price, nodes=0, ready=0,
        gpus_total=0, gpus_free=0, pending_jobs=0, pending_gpus=0, target=0, min_nodes=0,
        max_nodes=4, gpus_per_node=2,
    )  # fmt: skip


# A GPU-hour: $1.00 on spot, $2.50 on-demand (per node of two GPUs: $2 and $5).
POOLS = PoolsStatus(
    updated_at=NOW,
    budget_per_hour_usd=100,
    cost_per_hour_usd=0,
    pools=(pool("gpu-spot", CapacityClass.SPOT, 2.0), pool("gpu-od", CapacityClass.ON_DEMAND, 5.0)),
    blocked_jobs=0,
)


def spend(**by_owner: float) -> OwnersSpend:
    return OwnersSpend(since=NOW.replace(day=1), at=NOW, by_owner=by_owner)


@pytest.fixture
def deps(tmp_path: Path) -> Deps:
    return submitter_deps(
        tmp_path,
        teams=FixedTeams(TEAMS),
        holds=InMemoryTeamHolds(),
        pools=FixedPools(POOLS, spend(alice=30.0, bob=10.0, carol=500.0)),
        default_max_hours=24,
    )


def answers(deps: Deps, job_id: str) -> list[tuple[str, Any]]:
    bus = deps.bus
    assert isinstance(bus, InMemoryBus)
    events = [decode(m.data) for m in bus.messages]
    return [
        (e.type.split(".")[2], e.data) for e in events if getattr(e.data, "job_id", None) == job_id
    ]


def store(deps: Deps) -> InMemoryJobStore:
    assert isinstance(deps.store, InMemoryJobStore)
    return deps.store


def request(job_id: str, gpus: int, max_hours: float | None, **fields: Any) -> Any:
    return job_requested(
        job_id, owner=fields.pop("owner", "alice"), worker={"gpus": gpus},
        capacity=fields.pop("capacity", CapacityClass.SPOT), max_hours=max_hours, **fields,
    )  # fmt: skip


async def test_a_job_whose_worst_case_does_not_fit_the_budget_is_refused_with_the_sums(
    deps: Deps,
) -> None:
    # The team spent $40 (alice 30 + bob 10; carol is not a member): $60 is left.
    await on_job_requested(request("big", 4, max_hours=16), deps)
    [(kind, rejected)] = answers(deps, "big")
    assert kind == "rejected"
    assert rejected.reason is RejectionReason.OVER_BUDGET
    assert rejected.detail == (
        "team vision spent $40.00 this month and its running jobs may spend $0.00 more; "
        "this job may cost $64.00: $104.00 is over the budget of $100.00"
    )


async def test_any_capacity_is_priced_at_its_dearest_and_fits_when_it_does(deps: Deps) -> None:
    await on_job_requested(request("fits", 2, max_hours=12, capacity=CapacityClass.ANY), deps)
    assert [kind for kind, _ in answers(deps, "fits")] == ["accepted", "queued"]
    hold = holds(deps).holds.holds["fits"]
    assert hold.worst_case_usd == pytest.approx(2 * 2.5 * 12), "on-demand's GPU-hour"


async def test_running_jobs_reserve_their_worst_case_and_a_later_job_waits_for_them(
    deps: Deps,
) -> None:
    await on_job_requested(request("first", 2, max_hours=10), deps)  # $20 of the $60 left
    await on_job_requested(request("second", 2, max_hours=12), deps)  # $24: $44
    await on_job_requested(request("third", 2, max_hours=10), deps)  # $20 more: $64 > $60
    await place_queued(deps)
    assert [kind for kind, _ in answers(deps, "third")] == ["accepted"]
    waiting = store(deps).records["third"][0].waiting_for
    assert waiting is not None
    assert "its running jobs may spend $44.00 more" in waiting
    ray = deps.ray
    assert isinstance(ray, FakeRay)
    ray.set("first-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    await admit_waiting(deps)
    await place_queued(deps)
    assert [kind for kind, _ in answers(deps, "third")] == ["accepted", "queued"]


async def test_without_prices_a_budgeted_team_waits_rather_than_guesses(deps: Deps) -> None:
    pools = deps.pools
    assert isinstance(pools, FixedPools)
    pools.latest_spend = None
    await on_job_requested(request("early", 1, max_hours=1), deps)
    record = store(deps).records["early"][0]
    assert record.waiting_for is not None
    assert "does not know its GPU prices or spend yet" in record.waiting_for


async def test_a_job_without_max_hours_is_held_to_the_default_and_stopped_there(
    deps: Deps,
) -> None:
    await on_job_requested(request("open", 1, max_hours=None), deps)
    await place_queued(deps)
    record = store(deps).records["open"][0]
    assert record.max_hours == 24
    assert holds(deps).holds.holds["open"].worst_case_usd == pytest.approx(24.0)
    ray = deps.ray
    assert isinstance(ray, FakeRay)
    ray.set("open-1", RayJobState.RUNNING)
    await track_attempts(deps)
    clock = deps.clock
    assert isinstance(clock, FixedClock)
    clock.advance(timedelta(hours=23))
    await track_attempts(deps)
    assert "open-1" not in ray.stopped
    clock.advance(timedelta(hours=1, seconds=1))
    await track_attempts(deps)
    assert "open-1" in ray.stopped
    await track_attempts(deps)
    record = store(deps).records["open"][0]
    assert record.state.value == "cancelled"
    assert record.detail == "stopped after 24 h of running, its limit (--max-hours)"
    assert "open" not in holds(deps).holds.holds, "its reservation goes with it"


def holds(deps: Deps) -> InMemoryTeamHolds:
    assert isinstance(deps.holds, InMemoryTeamHolds)
    return deps.holds
