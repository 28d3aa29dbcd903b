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
    on_job_resumed,
    track_attempts,
)
from services.submitter.model import RayJobState
from shared.events import decode, new_event
from shared.events.data import (
    InterruptionCause,
    JobCancelRequested,
    JobResumed,
    RejectionReason,
)
from shared.events.types import CapacityClass
from shared.jobs import JobRecord
from shared.messaging import Unhandleable
from shared.messaging.memory import InMemoryBus
from shared.policy.teams import TeamHold, TeamHolds, parse_teams
from tests.events import NOW, job_requested
from tests.fakes.clock import FixedClock
from tests.fakes.submitter import (
    FakeProgress,
    FakeRay,
    FixedTeams,
    InMemoryJobStore,
    InMemoryTeamHolds,
    place_queued,
    submitter_deps,
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
    return submitter_deps(tmp_path, teams=FixedTeams(TEAMS), holds=InMemoryTeamHolds())


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
    await place_queued(deps)
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
    await place_queued(deps)
    assert of(deps, "j-3") == ["accepted"], "nothing freed yet"
    status = holds(deps).status
    assert status is not None
    assert status.waiting == {"vision": 1}

    ray_of(deps).set("j-1-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    assert "j-1" not in holds(deps).holds.holds, "an ended job gives its GPUs back"
    await admit_waiting(deps)
    await place_queued(deps)
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


# --- preemption that checkpoints first ------------------------------------------------------


def clock(deps: Deps) -> FixedClock:
    assert isinstance(deps.clock, FixedClock)
    return deps.clock


async def running(deps: Deps, job_id: str, **fields: Any) -> None:
    """Submit a job and let Ray start it, then let it run past the minimum runtime."""
    await on_job_requested(job_requested(job_id, **fields), deps)
    await place_queued(deps)
    ray_of(deps).set(f"{job_id}-1", RayJobState.RUNNING, node="local-spot-0")
    await track_attempts(deps)
    assert store(deps).records[job_id][0].state.value == "running"


def interrupted(deps: Deps, job_id: str) -> list[Any]:
    return [d for kind, d in published(deps) if kind == "interrupted" and d.job_id == job_id]


async def test_a_higher_priority_job_makes_a_lower_one_checkpoint_and_give_way(
    deps: Deps,
) -> None:
    await running(deps, "low", **gpus(4, priority=2))
    clock(deps).advance(timedelta(seconds=deps.min_runtime_before_preemption_s + 1))
    await on_job_requested(job_requested("high", **gpus(4, owner="bob", priority=9)), deps)
    await place_queued(deps)
    assert of(deps, "high") == ["accepted", "queued"], "admitted on the room low gives"
    assert set(holds(deps).holds.holds) == {"high"}
    asked = store(deps).records["low"][0].current
    assert asked is not None
    assert (asked.give_way, asked.give_way_for) == (InterruptionCause.PRIORITY, "high")
    progress = deps.progress
    assert isinstance(progress, FakeProgress)
    assert ("file:///checkpoints/low", 1) in progress.checkpoint_requests, "CHECKPOINT_NOW"

    # It checkpoints and exits; Ray calls that a failure: it is the preemption.
    ray_of(deps).set("low-1", RayJobState.FAILED, message="exit 1")
    await track_attempts(deps)
    [lost] = interrupted(deps, "low")
    assert lost.cause is InterruptionCause.PRIORITY
    # The checkpointer resumes it from its checkpoint: it waits for quota, no demand yet.
    resumed = JobResumed(
        job_id="low", attempt=2, from_checkpoint="file:///checkpoints/low/step-40",
        from_step=40, capacity=CapacityClass.SPOT,
    )  # fmt: skip
    await on_job_resumed(new_event(resumed, source="tests", time=NOW), deps)
    await place_queued(deps)
    record = store(deps).records["low"][0]
    assert record.waiting_for is not None
    assert record.waiting_for.startswith("gave way to high: a higher priority job")
    assert of(deps, "low")[-1] == "interrupted", "no job.queued while it waits"
    assert [p.submission_id for p, _ in ray_of(deps).submitted] == ["low-1", "high-1"]
    assert record.interruptions == 0, "a platform stop spends no restart budget"

    ray_of(deps).set("high-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    await admit_waiting(deps)
    await place_queued(deps)
    plan = ray_of(deps).submitted[-1][0]
    assert plan.submission_id == "low-2"
    assert plan.env_vars["SPOTRAIN_RESUME_FROM"] == "file:///checkpoints/low/step-40"
    # Placed back on the node it left: that node is healthy, and not one to avoid.
    assert plan.entrypoint_label_selector == {"spotrain-node": "in(gpu-spot-1)"}
    [requeued] = [
        d for kind, d in published(deps) if kind == "queued" and (d.job_id, d.attempt) == ("low", 2)
    ]
    assert requeued.avoid_nodes == ()
    assert of(deps, "low")[-1] == "queued"


async def test_a_job_within_its_minimum_runtime_is_not_asked_yet(deps: Deps) -> None:
    await running(deps, "low", **gpus(4, priority=2))
    await on_job_requested(job_requested("high", **gpus(4, owner="bob", priority=9)), deps)
    await place_queued(deps)
    assert of(deps, "high") == ["accepted"]
    current = store(deps).records["low"][0].current
    assert current is not None
    assert current.give_way is None


async def test_one_that_does_not_stop_within_the_grace_is_stopped_by_ray(deps: Deps) -> None:
    await running(deps, "low", **gpus(4, priority=2))
    clock(deps).advance(timedelta(seconds=deps.min_runtime_before_preemption_s + 1))
    await on_job_requested(job_requested("high", **gpus(4, owner="bob", priority=9)), deps)
    await place_queued(deps)
    await track_attempts(deps)
    assert "low-1" not in ray_of(deps).stopped, "within the grace: it may still checkpoint"
    clock(deps).advance(timedelta(seconds=deps.give_way_grace_s))
    await track_attempts(deps)
    assert "low-1" in ray_of(deps).stopped
    await track_attempts(deps)
    [lost] = interrupted(deps, "low")
    assert lost.cause is InterruptionCause.PRIORITY, "stopped by Ray, still the preemption"
    assert store(deps).records["low"][0].state.value == "interrupted"


async def test_the_lender_takes_back_what_another_team_borrowed(deps: Deps) -> None:
    await running(deps, "v-1", **gpus(4))
    await running(deps, "v-2", **gpus(2, owner="bob"))  # borrowed from nlp's idle quota
    clock(deps).advance(timedelta(seconds=deps.min_runtime_before_preemption_s + 1))
    await on_job_requested(job_requested("c-1", **gpus(4, owner="carol")), deps)
    await place_queued(deps)
    assert of(deps, "c-1") == ["accepted", "queued"]
    asked = store(deps).records["v-2"][0].current
    assert asked is not None
    assert asked.give_way is InterruptionCause.RECLAIMED
    untouched = store(deps).records["v-1"][0].current
    assert untouched is not None
    assert untouched.give_way is None, "work on vision's own guarantee stays"


async def test_one_decision_per_team_and_pass_however_many_wait(deps: Deps) -> None:
    await on_job_requested(job_requested("j-0", **gpus(6)), deps)
    for n in range(1, 6):
        await on_job_requested(job_requested(f"j-{n}", **gpus(1)), deps)
    holds(deps).reads = 0
    await admit_waiting(deps)
    assert holds(deps).reads == 2, "one decision for the first waiting job, one for the status"


async def test_a_reason_written_by_another_replica_does_not_lose_the_quota(
    tmp_path: Path,
) -> None:
    """Between this replica's hold and its record write, another replica (deciding from an
    older view) wrote the job a new reason to wait: the hold is what counts, so the record
    is read again and the job runs."""

    class AnotherReplicaWritesFirst(InMemoryJobStore):
        def __init__(self) -> None:
            super().__init__()
            self.armed = False

        async def update(self, record: JobRecord, revision: int) -> int:
            if self.armed and record.waiting_for is None:
                self.armed = False
                current, at = self.records[record.job_id]
                reason = current.model_copy(update={"waiting_for": "an older view's reason"})
                await super().update(reason, at)
            return await super().update(record, revision)

    racing = AnotherReplicaWritesFirst()
    deps = submitter_deps(
        tmp_path, store=racing, teams=FixedTeams(TEAMS), holds=InMemoryTeamHolds()
    )
    await on_job_requested(job_requested("j-1", **gpus(6)), deps)
    await on_job_requested(job_requested("j-2", **gpus(2, owner="bob")), deps)
    await place_queued(deps)
    ray_of(deps).set("j-1-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    racing.armed = True
    await admit_waiting(deps)
    await place_queued(deps)
    assert not racing.armed, "the other replica did write first"
    record = racing.records["j-2"][0]
    assert record.waiting_for is None
    assert [p.submission_id for p, _ in ray_of(deps).submitted][-1] == "j-2-1"
