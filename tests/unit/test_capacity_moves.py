"""Moves of running deadline jobs between spot and on-demand: the checkpointer's pure
decision (`policy.move`, on `shared.policy.deadline`), its review and resume through the in-memory
bus, and how the submitter records a move (not a loss)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.checkpointer import policy
from services.checkpointer.handlers import Deps, on_job_interrupted, review_moves
from services.checkpointer.model import (
    Attempt,
    AttemptState,
    JobRecord,
    JobState,
    LatestCheckpoint,
    Move,
    MoveConfig,
    RecoveryConfig,
    Resume,
    Skip,
)
from services.submitter import policy as submitter_policy
from services.submitter.model import RayJobState, RayJobStatus
from shared.checkpoints import StopAsk, stop_ask
from shared.events import decode, new_event
from shared.events.data import (
    InterruptionCause,
    JobInterrupted,
    JobMoveRequested,
    JobRequested,
    JobResumed,
    MoveReason,
)
from shared.events.types import Bundle, CapacityClass
from shared.messaging.memory import InMemoryBus
from shared.pools import PoolsStatus, PoolStatus
from tests.events import NOW
from tests.fakes.checkpointer import FakeCheckpoints, FakeJobs, FakePools, FakeRayNodes
from tests.fakes.clock import FixedClock

CONFIG = MoveConfig(review_interval_s=5, checkpoint_wait_s=30, restart_overhead_s=60)
HOUR = 3600.0


def pool(
    name: str,
    capacity: CapacityClass,
    price: float,
    *,
    nodes: int = 1,
    max_nodes: int = 4,
    stocked_out: bool = False,
    gpus: int = 2,
) -> PoolStatus:
    return PoolStatus(
        pool=name,
        capacity=capacity,
        price_per_hour_usd=price,
        nodes=nodes,
        ready=nodes,
        gpus_total=gpus * nodes,
        gpus_free=0,
        pending_jobs=0,
        pending_gpus=0,
        target=nodes,
        min_nodes=0,
        max_nodes=max_nodes,
        gpus_per_node=gpus,
        out_of_capacity_until=NOW + timedelta(minutes=5) if stocked_out else None,
    )


def pools(
    *, spot_stocked_out: bool = False, spot_full: bool = False, spot_room: bool = False
) -> PoolsStatus:
    spot = pool(
        "gpu-spot",
        CapacityClass.SPOT,
        1.0,
        nodes=4 if spot_full else 1,
        stocked_out=spot_stocked_out,
    )
    if spot_room:
        spot = spot.model_copy(update={"gpus_free": 2})
    return PoolsStatus(
        updated_at=NOW,
        budget_per_hour_usd=100,
        cost_per_hour_usd=4,
        pools=(
            spot,
            pool("gpu-od", CapacityClass.ON_DEMAND, 3.0),
            pool("cpu", CapacityClass.ON_DEMAND, 0.1, gpus=0),
        ),
        blocked_jobs=0,
    )


def deadline_job(
    *,
    on: str,
    hours_left: float,
    work_left_h: float,
    capacity: CapacityClass = CapacityClass.ANY,
    earlier: tuple[Attempt, ...] = (),
    deadline: bool = True,
) -> JobRecord:
    """A job whose current attempt runs on pool `on`, at step 100 of 1,000, with the ETA
    that leaves `work_left_h` hours."""
    number = len(earlier) + 1
    running = Attempt(
        number=number,
        submission_id=f"job-1-{number}",
        state=AttemptState.RUNNING,
        submitted_at=NOW - timedelta(minutes=10),
        started_at=NOW - timedelta(minutes=9),
        step=100,
        total_steps=1000,
        eta_s=work_left_h * HOUR,
        nodes=(f"{on}-1",),
        pool=on,
    )
    request = JobRequested(
        job_id="job-1",
        owner="alice",
        entrypoint=("python", "train.py"),
        capacity=capacity,
        worker=Bundle(gpus=2),
        deadline=NOW + timedelta(hours=hours_left) if deadline else None,
    )
    return JobRecord(
        request=request,
        request_event_id="e-1",
        state=JobState.RUNNING,
        accepted_at=NOW - timedelta(hours=1),
        updated_at=NOW,
        attempts=(*earlier, running),
        checkpoint_uri="file:///c/job-1",
    )


@pytest.mark.parametrize(
    ("on", "hours_left", "work_left_h", "status", "expected"),
    [
        # On on-demand with room for a round trip, spot to be had: back to spot.
        ("gpu-od", 12, 4, pools(), (CapacityClass.SPOT, MoveReason.SPOT_RETURNED)),
        # ...but not while spot is stocked out or every spot pool is full: it stays.
        ("gpu-od", 5.3, 4.5, pools(spot_stocked_out=True), None),
        ("gpu-od", 5.3, 4.5, pools(spot_full=True), None),
        # Far ahead and no spot: it stays (live, it never stops to wait for spot).
        ("gpu-od", 12, 4, pools(spot_stocked_out=True), None),
        # Behind its reserve, but with room for a round trip's two restarts: spot still.
        ("gpu-od", 4.2, 4, pools(), (CapacityClass.SPOT, MoveReason.SPOT_RETURNED)),
        # Less than two restarts to spare: it stays on on-demand, whatever spot does.
        ("gpu-od", 4.03, 4, pools(), None),
        # On spot it stays while spot lasts: ahead, on the edge, or past saving by
        # on-demand (a restart would only end it later).
        ("gpu-spot", 12, 4, pools(), None),
        ("gpu-spot", 4.1, 4, pools(), None),
        ("gpu-spot", 3.9, 4, pools(), None),
    ],
)
def test_a_running_deadline_job_moves_as_the_deadline_policy_says(
    on: str,
    hours_left: float,
    work_left_h: float,
    status: PoolsStatus,
    expected: tuple[CapacityClass, MoveReason] | None,
) -> None:
    job = deadline_job(on=on, hours_left=hours_left, work_left_h=work_left_h)
    move = policy.move(job, status, NOW, CONFIG)
    assert (None if move is None else (move.capacity, move.reason)) == expected


def test_a_move_to_spot_waits_for_room_there() -> None:
    job = deadline_job(on="gpu-od", hours_left=12, work_left_h=4)
    without = policy.move(job, pools(), NOW, CONFIG)
    assert without is not None
    assert not without.room, "a spot pool that can grow is not room yet"
    with_room = policy.move(job, pools(spot_room=True), NOW, CONFIG)
    assert with_room is not None
    assert with_room.room


@pytest.mark.parametrize(
    "job",
    [
        deadline_job(on="gpu-od", hours_left=12, work_left_h=4, capacity=CapacityClass.ON_DEMAND),
        deadline_job(on="gpu-od", hours_left=12, work_left_h=4, deadline=False),
        deadline_job(on="gpu-unknown", hours_left=12, work_left_h=4),
    ],
    ids=["asked-for-on-demand", "no-deadline", "pool-unknown"],
)
def test_only_running_any_jobs_with_a_deadline_on_a_known_pool_move(job: JobRecord) -> None:
    assert policy.move(job, pools(), NOW, CONFIG) is None


def test_the_restart_overhead_is_measured_on_the_jobs_own_resumes() -> None:
    def resumed(number: int, took_s: float) -> Attempt:
        return Attempt(
            number=number,
            submission_id=f"job-1-{number}",
            state=AttemptState.LOST,
            submitted_at=NOW,
            started_at=NOW + timedelta(seconds=took_s),
            ended_at=NOW + timedelta(minutes=5),
        )

    first = deadline_job(on="gpu-od", hours_left=12, work_left_h=4)
    assert policy.restart_overhead_s(first, CONFIG) == 60
    first_attempt = first.attempts[0].model_copy(update={"started_at": NOW + timedelta(hours=9)})
    earlier = (first_attempt, resumed(2, 20), resumed(3, 40))
    job = deadline_job(on="gpu-od", hours_left=12, work_left_h=4, earlier=earlier)
    # Attempts 2, 3 and the running 4th (started a minute after its submission).
    assert policy.restart_overhead_s(job, CONFIG) == 40


@given(
    hours_left=st.floats(0.01, 48),
    work_left_h=st.floats(0.01, 48),
    on=st.sampled_from(["gpu-od", "gpu-spot"]),
    stocked_out=st.booleans(),
)
def test_a_move_to_spot_always_leaves_room_for_the_restarts_of_a_round_trip(
    hours_left: float, work_left_h: float, on: str, stocked_out: bool
) -> None:
    """The deadline policy's rule, as the live moves apply it: a job leaves on-demand only
    for spot, and only with three restarts to spare (to spot now, to on-demand again were
    spot to go, and the one in hand), so on-demand can still end it in time."""
    job = deadline_job(on=on, hours_left=hours_left, work_left_h=work_left_h)
    move = policy.move(job, pools(spot_stocked_out=stocked_out), NOW, CONFIG)
    if move is not None:
        assert on == "gpu-od"
        assert move.capacity is CapacityClass.SPOT
        assert hours_left - work_left_h >= 3 * 60 / HOUR - 1e-9


def test_a_move_resumes_from_the_latest_checkpoint_and_counts_no_loss() -> None:
    job = deadline_job(on="gpu-od", hours_left=12, work_left_h=4)
    move = Move("job-1", 1, CapacityClass.ANY, MoveReason.SPOT_RETURNED, slack_s=0)
    decision = policy.moved(job, move, LatestCheckpoint("file:///c/job-1/s90", 90))
    assert isinstance(decision, Resume)
    resumed = decision.resumed
    assert (resumed.attempt, resumed.from_step, resumed.steps_lost) == (2, 90, 10)
    assert (resumed.capacity, resumed.moved) == (CapacityClass.ANY, MoveReason.SPOT_RETURNED)
    later = Move("job-1", 7, CapacityClass.ANY, MoveReason.SPOT_RETURNED, slack_s=0)
    assert isinstance(policy.moved(job, later, None), Skip)


@pytest.fixture
def deps() -> Deps:
    return Deps(
        bus=InMemoryBus(),
        clock=FixedClock(NOW),
        jobs=FakeJobs(deadline_job(on="gpu-od", hours_left=12, work_left_h=4)),
        checkpoints=FakeCheckpoints(),
        ray=FakeRayNodes(set()),
        config=RecoveryConfig(),
        pools=FakePools(pools(spot_room=True)),
        moves=CONFIG,
    )


def published(deps: Deps) -> list[Any]:
    assert isinstance(deps.bus, InMemoryBus)
    return [decode(m.data) for m in deps.bus.messages]


async def test_a_review_asks_for_a_checkpoint_and_the_stopped_attempt_resumes_where_it_moves(
    deps: Deps,
) -> None:
    await review_moves(deps)
    assert isinstance(deps.checkpoints, FakeCheckpoints)
    [(uri, request)] = deps.checkpoints.requests
    assert (uri, request.attempt, request.moving) == ("file:///c/job-1", 1, True)
    assert published(deps) == [], "nothing moves before the attempt has checkpointed"
    await review_moves(deps)
    assert len(deps.checkpoints.requests) == 1, "asked once"
    deps.checkpoints.latest_by_uri["file:///c/job-1"] = LatestCheckpoint("file:///c/s100", 100)
    # The attempt stopped as asked; the submitter says so.
    stopped = JobInterrupted(
        job_id="job-1", attempt=1, node="gpu-od-1", cause=InterruptionCause.MOVED
    )
    await on_job_interrupted(new_event(stopped, source="submitter", time=NOW), deps)
    [event] = published(deps)
    assert event.id == "job-resumed-job-1-2"
    assert isinstance(event.data, JobResumed)
    assert (event.data.capacity, event.data.moved) == (CapacityClass.SPOT, MoveReason.SPOT_RETURNED)
    assert event.data.from_step == 100


async def test_without_room_on_spot_the_review_asks_for_it_and_the_attempt_runs_on(
    deps: Deps,
) -> None:
    assert isinstance(deps.pools, FakePools)
    deps.pools.latest = pools()
    await review_moves(deps)
    await review_moves(deps)
    assert isinstance(deps.checkpoints, FakeCheckpoints)
    assert deps.checkpoints.requests == [], "make before break: nothing stops yet"
    [event] = {e.id: e for e in published(deps)}.values()
    assert isinstance(event.data, JobMoveRequested)
    assert (event.data.attempt, event.data.capacity) == (1, CapacityClass.SPOT)
    assert event.data.bundles == (Bundle(gpus=2),)
    deps.pools.latest = pools(spot_room=True)
    await review_moves(deps)
    [(_, request)] = deps.checkpoints.requests
    assert request.moving


async def test_an_attempt_that_does_not_stop_is_moved_once_the_wait_is_over(deps: Deps) -> None:
    await review_moves(deps)
    assert isinstance(deps.clock, FixedClock)
    deps.clock.advance(timedelta(seconds=29))
    await review_moves(deps)
    assert published(deps) == []
    deps.clock.advance(timedelta(seconds=1))
    await review_moves(deps)
    [event] = published(deps)
    assert isinstance(event.data, JobResumed)
    assert event.data.moved is MoveReason.SPOT_RETURNED
    assert event.data.from_checkpoint is None, "no checkpoint: from the start"


async def test_before_the_scalers_first_pass_nothing_moves(deps: Deps) -> None:
    assert isinstance(deps.pools, FakePools)
    deps.pools.latest = None
    await review_moves(deps)
    assert isinstance(deps.checkpoints, FakeCheckpoints)
    assert deps.checkpoints.requests == []
    assert published(deps) == []


def test_the_submitter_ends_a_moved_attempt_as_moved_and_spends_no_restart() -> None:
    job = deadline_job(on="gpu-od", hours_left=12, work_left_h=4)
    resumed = JobResumed(
        job_id="job-1",
        attempt=2,
        from_step=100,
        capacity=CapacityClass.SPOT,
        moved=MoveReason.SPOT_RETURNED,
    )
    at: datetime = NOW + timedelta(seconds=3)
    transition = submitter_policy.resume(job, resumed, at)
    moved_attempt, following = transition.record.attempts
    assert moved_attempt.state is AttemptState.LOST
    assert moved_attempt.cause is InterruptionCause.MOVED
    assert "spot-returned" in (moved_attempt.message or "")
    assert following.capacity is CapacityClass.SPOT
    assert transition.record.interruptions == 0
    [interrupted] = [f.data for f in transition.facts if isinstance(f.data, JobInterrupted)]
    assert interrupted.cause is InterruptionCause.MOVED


@pytest.mark.parametrize(
    ("asked", "moving", "cause"),
    [
        (True, True, InterruptionCause.MOVED),
        (True, False, InterruptionCause.PREEMPTED),
        (False, False, InterruptionCause.NODE_LOST),
    ],
)
def test_an_attempt_that_stopped_when_asked_to_move_ended_as_moved(
    asked: bool, moving: bool, cause: InterruptionCause
) -> None:
    job = deadline_job(on="gpu-od", hours_left=12, work_left_h=4)
    failed = RayJobStatus(
        state=RayJobState.FAILED, exit_code=143, error_type="JOB_SUPERVISOR_ACTOR_DIED"
    )
    transition = submitter_policy.on_ray_status(
        job, failed, NOW, checkpoint_requested=asked, moving=moving
    )
    [ended] = transition.record.attempts
    assert (ended.state, ended.cause) == (AttemptState.LOST, cause)
    assert transition.record.interruptions == (0 if cause is InterruptionCause.MOVED else 1)


@pytest.mark.parametrize(
    ("request_json", "asked"),
    [
        (None, StopAsk.NONE),
        (b"", StopAsk.STOP),
        (
            b'{"job_id": "job-1", "attempt": 1, "requested_at": "2026-12-01T00:00:00Z"}',
            StopAsk.STOP,
        ),
        (
            b'{"job_id": "job-1", "attempt": 1, "requested_at": "2026-12-01T00:00:00Z",'
            b' "moving": true}',
            StopAsk.MOVE,
        ),
        (
            b'{"job_id": "job-1", "attempt": 2, "requested_at": "2026-12-01T00:00:00Z"}',
            StopAsk.NONE,
        ),
    ],
)
def test_a_checkpoint_request_says_whether_it_is_a_move(
    request_json: bytes | None, asked: StopAsk
) -> None:
    assert stop_ask(request_json, attempt=1) is asked
