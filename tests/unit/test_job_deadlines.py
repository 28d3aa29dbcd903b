"""Whether a job with a deadline is on track: from its pace, else its estimate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.events.data import JobRequested
from shared.jobs import (
    Attempt,
    AttemptState,
    DeadlineBasis,
    JobRecord,
    JobState,
    deadline_outlook,
    span_text,
    work_left_s,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def record(
    *,
    deadline_h: float | None = 4,
    estimate_h: float | None = None,
    state: JobState = JobState.RUNNING,
    attempts: tuple[Attempt, ...] = (),
    updated_at: datetime = NOW,
) -> JobRecord:
    request = JobRequested(
        job_id="job-1",
        owner="ann",
        entrypoint=("python", "train.py"),
        deadline=NOW + timedelta(hours=deadline_h) if deadline_h is not None else None,
        estimate_s=round(estimate_h * 3600) if estimate_h is not None else None,
    )
    return JobRecord(
        request=request,
        request_event_id="e-1",
        state=state,
        accepted_at=NOW - timedelta(hours=2),
        updated_at=updated_at,
        attempts=attempts,
    )


def attempt(
    number: int, *, started_h: float, ended_h: float | None = None, **fields: object
) -> Attempt:
    return Attempt.model_validate(
        {
            "number": number,
            "submission_id": f"job-1-{number}",
            "submitted_at": NOW + timedelta(hours=started_h),
            "started_at": NOW + timedelta(hours=started_h),
            "ended_at": NOW + timedelta(hours=ended_h) if ended_h is not None else None,
            **fields,
        }
    )


RUNNING = AttemptState.RUNNING


@pytest.mark.parametrize(
    ("job", "needed_h", "basis", "on_track"),
    [
        pytest.param(
            record(attempts=(attempt(1, started_h=-1, state=RUNNING, eta_s=3 * 3600),)),
            3, DeadlineBasis.PACE, True, id="pace-fits",
        ),
        pytest.param(
            record(attempts=(attempt(1, started_h=-1, state=RUNNING, eta_s=5 * 3600),)),
            5, DeadlineBasis.PACE, False, id="pace-late",
        ),
        pytest.param(
            record(estimate_h=6, attempts=(
                attempt(1, started_h=-2, ended_h=-1.5, state=AttemptState.LOST),
                attempt(2, started_h=-1, state=RUNNING),
            )),
            4.5, DeadlineBasis.ESTIMATE, False, id="estimate-less-the-time-run",
        ),
        pytest.param(
            record(estimate_h=3), 3, DeadlineBasis.ESTIMATE, True, id="queued-on-its-estimate"
        ),
        pytest.param(record(), None, DeadlineBasis.UNKNOWN, None, id="nothing-says"),
        pytest.param(record(deadline_h=-1), None, DeadlineBasis.UNKNOWN, False, id="past-unknown"),
    ],
)  # fmt: skip
def test_the_outlook_of_an_active_job(
    job: JobRecord, needed_h: float | None, basis: DeadlineBasis, on_track: bool | None
) -> None:
    outlook = deadline_outlook(job, NOW)
    assert outlook is not None
    assert outlook.basis is basis
    assert outlook.on_track is on_track
    assert outlook.needed_s == (needed_h * 3600 if needed_h is not None else None)
    assert outlook.left_s == (job.request.deadline - NOW).total_seconds()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("ended_h", "state", "met"),
    [
        pytest.param(-0.5, JobState.SUCCEEDED, True, id="done-before"),
        pytest.param(5, JobState.SUCCEEDED, False, id="done-after"),
        pytest.param(-0.5, JobState.FAILED, False, id="failed-is-missed"),
    ],
)
def test_a_finished_job_met_its_deadline_or_did_not(
    ended_h: float, state: JobState, met: bool
) -> None:
    job = record(
        state=state,
        attempts=(attempt(1, started_h=-2, ended_h=ended_h, state=AttemptState.SUCCEEDED),),
    )
    outlook = deadline_outlook(job, NOW + timedelta(hours=6))
    assert outlook is not None
    assert outlook.on_track is met


def test_no_deadline_no_outlook() -> None:
    assert deadline_outlook(record(deadline_h=None), NOW) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(42, "42s"), (312, "5m12s"), (3 * 3600 + 420, "3h07m"), (2 * 86400 + 4 * 3600, "2d04h")],
)
def test_span_text(seconds: float, text: str) -> None:
    assert span_text(seconds) == text


def test_work_left_comes_from_the_last_pace_then_the_estimate() -> None:
    """A resumed attempt from step 400 of 1000, at the lost attempt's 2 s a step."""
    lost = attempt(1, started_h=-1, ended_h=-0.5, state=AttemptState.LOST,
                   step=500, total_steps=1000, eta_s=1000.0)  # fmt: skip
    resumed = Attempt(number=2, submission_id="job-1-2", submitted_at=NOW, from_step=400)
    assert work_left_s(record(attempts=(lost, resumed)), NOW) == 1200.0
    assert work_left_s(record(attempts=(lost,)), NOW) == 1000.0
    unpaced = attempt(1, started_h=-1, state=RUNNING)
    assert work_left_s(record(estimate_h=3, attempts=(unpaced,)), NOW) == 2 * 3600
    assert work_left_s(record(attempts=(unpaced,)), NOW) is None
