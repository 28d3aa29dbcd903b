"""The checkpointer's decisions: which attempts a notice or loss concerns, how a job resumes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.checkpointer import policy
from services.checkpointer.model import (
    Attempt,
    AttemptState,
    GiveUp,
    JobRecord,
    JobState,
    LatestCheckpoint,
    RecoveryConfig,
    Resume,
    Skip,
)
from shared.events.data import InterruptionCause, JobRequested
from shared.events.types import CapacityClass
from shared.jobs import PLATFORM_STOPS
from tests.events import NOW

CONFIG = RecoveryConfig(fallback_after_interruptions=2, min_notice_s=2)
CKPT = LatestCheckpoint(uri="file:///c/job-1/step-000000000040", step=40)


def attempt(number: int, state: AttemptState, **fields: object) -> Attempt:
    return Attempt(
        number=number,
        submission_id=f"job-1-{number}",
        state=state,
        submitted_at=NOW,
        **fields,  # type: ignore[arg-type]
    )


def record(
    *attempts: Attempt,
    capacity: CapacityClass = CapacityClass.ANY,
    max_restarts: int = 3,
    state: JobState = JobState.RUNNING,
    **fields: object,
) -> JobRecord:
    request = JobRequested(
        job_id="job-1",
        owner="alice",
        entrypoint=("python", "train.py"),
        capacity=capacity,
        max_restarts=max_restarts,
    )
    return JobRecord(
        request=request,
        request_event_id="e-1",
        state=state,
        accepted_at=NOW,
        updated_at=NOW,
        attempts=attempts,
        checkpoint_uri="file:///c/job-1",
        **fields,  # type: ignore[arg-type]
    )


RUNNING_ON_A = attempt(1, AttemptState.RUNNING, nodes=("a",), step=52)


def test_a_lost_attempt_resumes_from_the_latest_checkpoint_with_the_steps_it_loses() -> None:
    decision = policy.recover(record(RUNNING_ON_A), 1, CKPT, CONFIG)
    assert isinstance(decision, Resume)
    resumed = decision.resumed
    assert (resumed.attempt, resumed.from_checkpoint, resumed.from_step) == (2, CKPT.uri, 40)
    assert resumed.steps_lost == 12
    assert resumed.capacity is CapacityClass.ANY


def test_without_a_checkpoint_the_job_starts_over() -> None:
    decision = policy.recover(record(RUNNING_ON_A), 1, None, CONFIG)
    assert isinstance(decision, Resume)
    assert (decision.resumed.from_checkpoint, decision.resumed.steps_lost) == (None, 52)


def test_an_attempt_is_resumed_once_and_never_after_it_ended_on_its_own() -> None:
    resumed = record(attempt(1, AttemptState.LOST, nodes=("a",)), attempt(2, AttemptState.RUNNING))
    assert isinstance(policy.recover(resumed, 1, CKPT, CONFIG), Skip)
    failed = record(attempt(1, AttemptState.FAILED), state=JobState.FAILED)
    assert isinstance(policy.recover(failed, 1, CKPT, CONFIG), Skip)
    user_error = record(attempt(1, AttemptState.FAILED))
    assert isinstance(policy.recover(user_error, 1, CKPT, CONFIG), Skip)
    cancelling = record(RUNNING_ON_A, cancel_requested=True)
    assert isinstance(policy.recover(cancelling, 1, CKPT, CONFIG), Skip)


def test_the_restart_budget_is_spent_then_the_job_fails_with_the_reason() -> None:
    lost = [attempt(n, AttemptState.LOST) for n in (1, 2)]
    last = record(*lost, attempt(3, AttemptState.RUNNING), max_restarts=2)
    decision = policy.recover(last, 3, CKPT, CONFIG)
    assert isinstance(decision, GiveUp)
    assert decision.failed.attempt == 3
    assert "lost its capacity 3 times; its restart budget is 2" in decision.failed.message


def test_giving_way_to_other_work_spends_no_restart_budget_and_keeps_the_capacity() -> None:
    """Reclaimed and priority stops are the platform's own, like moves: a job that gave way
    many times is still resumed, on the capacity it had, whatever the record says yet."""
    gave_way = [attempt(n, AttemptState.LOST, cause=InterruptionCause.PRIORITY) for n in (1, 2, 3)]
    job = record(*gave_way, attempt(4, AttemptState.RUNNING), max_restarts=0)
    decision = policy.recover(job, 4, CKPT, CONFIG, platform_stop=True)
    assert isinstance(decision, Resume)
    assert decision.resumed.capacity is CapacityClass.ANY, "no fallback to on-demand"
    assert isinstance(policy.recover(job, 4, CKPT, CONFIG), GiveUp), "a real loss counts"


@pytest.mark.parametrize("cause", sorted(PLATFORM_STOPS))
def test_no_platform_stop_spends_the_restart_budget(cause: InterruptionCause) -> None:
    """Each of the platform's own ends (a move, giving way, its Ray head lost) leaves the
    budget whole: a job allowed no restart is still resumed after many of them."""
    ended = [attempt(n, AttemptState.LOST, cause=cause) for n in (1, 2, 3)]
    job = record(*ended, attempt(4, AttemptState.LOST, cause=cause), max_restarts=0)
    assert job.interruptions == 0
    assert isinstance(policy.recover(job, 4, CKPT, CONFIG, platform_stop=True), Resume)


def test_an_any_job_moves_to_on_demand_after_repeated_losses_and_stays() -> None:
    second_loss = record(attempt(1, AttemptState.LOST), attempt(2, AttemptState.RUNNING))
    decision = policy.recover(second_loss, 2, CKPT, CONFIG)
    assert isinstance(decision, Resume)
    assert decision.resumed.capacity is CapacityClass.ON_DEMAND

    spot = record(
        attempt(1, AttemptState.LOST),
        attempt(2, AttemptState.RUNNING),
        capacity=CapacityClass.SPOT,
    )
    decision = policy.recover(spot, 2, CKPT, CONFIG)
    assert isinstance(decision, Resume)
    assert decision.resumed.capacity is CapacityClass.SPOT, "spot was asked for explicitly"


def test_a_notice_asks_the_live_attempts_on_the_node_when_there_is_time() -> None:
    here = record(RUNNING_ON_A)
    elsewhere = record(attempt(1, AttemptState.RUNNING, nodes=("b",))).model_copy(
        update={"request": here.request.model_copy(update={"job_id": "job-2"})}
    )
    asked = policy.checkpoint_now([here, elsewhere], "a", NOW + timedelta(seconds=30), NOW, CONFIG)
    assert [(r.job_id, a.number) for r, a in asked] == [("job-1", 1)]
    too_late = policy.checkpoint_now([here], "a", NOW + timedelta(seconds=1), NOW, CONFIG)
    assert too_late == []


@given(
    states=st.lists(st.sampled_from(list(AttemptState)), min_size=1, max_size=8),
    lost_attempt=st.integers(1, 9),
    max_restarts=st.integers(0, 5),
    capacity=st.sampled_from(list(CapacityClass)),
)
def test_a_resume_always_follows_the_current_attempt_within_the_budget(
    states: list[AttemptState], lost_attempt: int, max_restarts: int, capacity: CapacityClass
) -> None:
    attempts = [attempt(n, state) for n, state in enumerate(states, start=1)]
    job = record(*attempts, capacity=capacity, max_restarts=max_restarts)
    decision = policy.recover(job, lost_attempt, CKPT, CONFIG)
    if isinstance(decision, Resume):
        assert lost_attempt == len(attempts)
        assert decision.resumed.attempt == lost_attempt + 1
        assert job.interruptions + (states[-1] is not AttemptState.LOST) <= max_restarts
        if capacity is not CapacityClass.ANY:
            assert decision.resumed.capacity is capacity
    if states[-1] in (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.STOPPED):
        assert isinstance(decision, Skip)


@given(losses=st.integers(0, 12), max_restarts=st.integers(0, 10))
def test_a_job_losing_its_node_again_and_again_is_resumed_at_most_max_restarts_times(
    losses: int, max_restarts: int
) -> None:
    job = record(attempt(1, AttemptState.RUNNING), max_restarts=max_restarts)
    resumes = 0
    for _ in range(losses):
        current = job.attempts[-1]
        decision = policy.recover(job, current.number, CKPT, CONFIG)
        if not isinstance(decision, Resume):
            assert isinstance(decision, GiveUp)
            break
        resumes += 1
        lost = current.model_copy(update={"state": AttemptState.LOST})
        following = attempt(decision.resumed.attempt, AttemptState.RUNNING)
        job = job.model_copy(update={"attempts": (*job.attempts[:-1], lost, following)})
    assert resumes == min(losses, max_restarts)
