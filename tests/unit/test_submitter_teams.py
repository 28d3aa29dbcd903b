"""The submitter under a teams file: refused without a team or beyond what the team can
ever hold, waiting with the reason when its quota is taken, given it when quota frees,
holds released as jobs end, and a team admin may cancel the team's jobs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from services.submitter import metrics
from services.submitter.handlers import (
    Deps,
    admit_waiting,
    on_job_cancel_requested,
    on_job_requested,
    track_attempts,
)
from services.submitter.model import RayJobState
from services.submitter.policy import Quotas
from shared.events import decode, new_event
from shared.events.data import JobCancelRequested, RejectionReason
from shared.events.types import CapacityClass
from shared.messaging import Unhandleable
from shared.messaging.memory import InMemoryBus
from shared.teams import TeamHold, TeamHolds, parse_teams
from tests.events import NOW, job_requested
from tests.fakes.clock import FixedClock
from tests.fakes.submitter import (
    FakeProgress,
    FakeRay,
    FakeWorkspaces,
    FixedTeams,
    InMemoryJobStore,
    InMemoryTeamHolds,
)

TEAMS = parse_teams(
    """
[teams.vision]
members = ["alice", "bob", "vera"]
admins = ["vera"]
[teams.vision.quota.spot]
guaranteed_gpus = 4
borrow_gpus = 2

[teams.nlp]
members = ["carol"]
[teams.nlp.quota.spot]
guaranteed_gpus = 4
"""
)


@pytest.fixture
def deps(tmp_path: Path) -> Deps:
    return Deps(
        bus=InMemoryBus(),
        clock=FixedClock(),
        store=InMemoryJobStore(),
        ray=FakeRay(),
        workspaces=FakeWorkspaces(tmp_path),
        progress=FakeProgress(),
        quotas=Quotas(max_gpus_per_job=8, max_gpus_per_owner=16),
        checkpoint_root="file:///checkpoints",
        teams=FixedTeams(TEAMS),
        holds=InMemoryTeamHolds(),
    )


def published(deps: Deps) -> list[tuple[str, Any]]:
    bus = deps.bus
    assert isinstance(bus, InMemoryBus)
    return [(decode(m.data).type.split(".")[2], decode(m.data).data) for m in bus.messages]


def of(deps: Deps, job_id: str) -> list[str]:
    return [kind for kind, data in published(deps) if data.job_id == job_id]


def holds(deps: Deps) -> InMemoryTeamHolds:
    assert isinstance(deps.holds, InMemoryTeamHolds)
    return deps.holds


def store(deps: Deps) -> InMemoryJobStore:
    assert isinstance(deps.store, InMemoryJobStore)
    return deps.store


def gpus(n: int, owner: str = "alice", **fields: Any) -> dict[str, Any]:
    return {"owner": owner, "worker": {"gpus": n}, "capacity": CapacityClass.SPOT, **fields}


async def test_someone_in_no_team_is_refused(deps: Deps) -> None:
    await on_job_requested(job_requested("j-1", **gpus(1, owner="mallory")), deps)
    [(kind, rejected)] = published(deps)
    assert kind == "rejected"
    assert rejected.reason is RejectionReason.NO_TEAM
    assert rejected.detail.startswith("mallory is in no team")
    assert holds(deps).holds == TeamHolds()


async def test_a_job_larger_than_its_team_can_ever_hold_is_refused(deps: Deps) -> None:
    await on_job_requested(job_requested("j-1", **gpus(7)), deps)
    [(kind, rejected)] = published(deps)
    assert kind == "rejected"
    assert rejected.reason is RejectionReason.QUOTA_EXCEEDED
    assert rejected.detail == (
        "the job asks for 7 spot GPUs; team vision can hold at most 6 (4 guaranteed + 2 borrowed)"
    )


async def test_over_quota_waits_with_the_reason_and_runs_when_quota_frees(deps: Deps) -> None:
    await on_job_requested(job_requested("j-1", **gpus(4)), deps)
    await on_job_requested(job_requested("j-2", **gpus(2, owner="bob")), deps)  # borrows
    await on_job_requested(job_requested("j-3", **gpus(2, owner="bob")), deps)
    assert of(deps, "j-1") == ["accepted", "queued"]
    assert of(deps, "j-2") == ["accepted", "queued"]
    assert of(deps, "j-3") == ["accepted"], "accepted, but no demand until it has quota"
    waiting = store(deps).records["j-3"][0]
    assert waiting.state.value == "queued"
    assert waiting.attempts == ()
    assert waiting.waiting_for == (
        "team vision holds 6 spot GPUs; with this job's 2 that is 8, over its 4 guaranteed + 2 "
        "it may borrow"
    )
    assert [plan.submission_id for plan, _ in ray_of(deps).submitted] == ["j-1-1", "j-2-1"]
    hold = holds(deps).holds.holds["j-2"]
    assert (hold.team, hold.gpus, hold.borrowed) == ("vision", 2, True)
    assert not holds(deps).holds.holds["j-1"].borrowed

    await admit_waiting(deps)
    assert of(deps, "j-3") == ["accepted"], "nothing freed yet"
    status = holds(deps).status
    assert status is not None
    assert status.waiting == {"vision": 1}

    ray_of(deps).set("j-1-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    assert "j-1" not in holds(deps).holds.holds, "an ended job gives its GPUs back"
    await admit_waiting(deps)
    assert of(deps, "j-3") == ["accepted", "queued"]
    assert store(deps).records["j-3"][0].waiting_for is None
    assert ray_of(deps).submitted[-1][0].submission_id == "j-3-1"
    status = holds(deps).status
    assert status is not None
    assert status.waiting == {}


async def test_another_teams_idle_quota_is_borrowed_only_up_to_the_limit(deps: Deps) -> None:
    await on_job_requested(job_requested("c-1", **gpus(4, owner="carol")), deps)
    await on_job_requested(job_requested("j-1", **gpus(5)), deps)
    assert of(deps, "j-1") == ["accepted"]
    record = store(deps).records["j-1"][0]
    assert record.waiting_for == "4 of the teams' 8 spot GPUs are free; the job asks for 5"
    assert record.team == "vision"


async def test_a_lost_compare_and_set_is_decided_again(deps: Deps) -> None:
    before = metrics.HOLD_CONFLICTS._value.get()
    holds(deps).conflicts = 2
    await on_job_requested(job_requested("j-1", **gpus(2)), deps)
    assert of(deps, "j-1") == ["accepted", "queued"]
    assert "j-1" in holds(deps).holds.holds
    assert metrics.HOLD_CONFLICTS._value.get() - before == 2


async def test_a_hold_left_by_a_crash_is_dropped_after_its_grace(deps: Deps) -> None:
    ghost = TeamHold(
        job_id="ghost",
        team="vision",
        owner="alice",
        capacity=CapacityClass.SPOT,
        gpus=6,
        priority=5,
        borrowed=True,
        since=NOW - timedelta(seconds=deps.hold_grace_s + 1),
    )
    holds(deps).holds = TeamHolds(holds={"ghost": ghost})
    holds(deps).revision = 1
    await on_job_requested(job_requested("j-1", **gpus(4)), deps)
    assert of(deps, "j-1") == ["accepted", "queued"]
    assert set(holds(deps).holds.holds) == {"j-1"}


async def test_a_young_hold_without_its_record_is_kept(deps: Deps) -> None:
    """Another replica wrote the hold and is about to write the record."""
    young = TeamHold(
        job_id="elsewhere",
        team="vision",
        owner="bob",
        capacity=CapacityClass.SPOT,
        gpus=6,
        priority=5,
        borrowed=True,
        since=NOW,
    )
    holds(deps).holds = TeamHolds(holds={"elsewhere": young})
    holds(deps).revision = 1
    await on_job_requested(job_requested("j-1", **gpus(1)), deps)
    assert of(deps, "j-1") == ["accepted"]


async def test_a_waiting_job_is_cancelled_at_once(deps: Deps) -> None:
    await on_job_requested(job_requested("j-1", **gpus(6)), deps)
    await on_job_requested(job_requested("j-2", **gpus(1)), deps)
    await on_job_cancel_requested(cancel("j-2", "alice"), deps)
    assert of(deps, "j-2") == ["accepted", "cancelled"]
    await admit_waiting(deps)
    assert of(deps, "j-2") == ["accepted", "cancelled"]


async def test_a_team_admin_may_cancel_the_teams_jobs_and_no_one_else(deps: Deps) -> None:
    await on_job_requested(job_requested("j-1", **gpus(1)), deps)
    with pytest.raises(
        Unhandleable, match="bob may not cancel j-1: only alice or an admin of team vision may"
    ):
        await on_job_cancel_requested(cancel("j-1", "bob"), deps)
    with pytest.raises(Unhandleable, match="carol may not cancel"):
        await on_job_cancel_requested(cancel("j-1", "carol"), deps)
    await on_job_cancel_requested(cancel("j-1", "vera"), deps)
    assert store(deps).records["j-1"][0].cancel_requested


def cancel(job_id: str, by: str) -> Any:
    return new_event(JobCancelRequested(job_id=job_id, requested_by=by), source="tests", time=NOW)


def ray_of(deps: Deps) -> FakeRay:
    assert isinstance(deps.ray, FakeRay)
    return deps.ray
