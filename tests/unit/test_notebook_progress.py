"""A job's live view, folded from its events, and the one line a notebook shows of it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.events import Event, EventData, new_event
from shared.events.data import (
    InterruptionCause,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobCheckpointed,
    JobFailed,
    JobInterrupted,
    JobProgress,
    JobQueued,
    JobRejected,
    JobRequested,
    JobResumed,
    JobStarted,
    JobSucceeded,
    RejectionReason,
)
from shared.events.types import Bundle, CapacityClass
from shared.notebook.progress import (
    JobView,
    Phase,
    advance,
    format_duration,
    render_html,
    render_text,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
JOB = "train-abc123"


def at(seconds: float, data: EventData) -> Event[EventData]:
    return new_event(data, source="test", time=T0 + timedelta(seconds=seconds))


def fold(*events: Event[EventData]) -> JobView:
    view = JobView(job_id=JOB)
    for event in events:
        view = advance(view, event)
    return view


REQUESTED = at(0, JobRequested(job_id=JOB, owner="alice", entrypoint=("python", "train.py")))
ACCEPTED = at(1, JobAccepted(job_id=JOB, owner="alice"))
QUEUED = at(
    1,
    JobQueued(
        job_id=JOB, attempt=1, bundles=(Bundle(gpus=1),), capacity=CapacityClass.SPOT, priority=5
    ),
)
STARTED = at(8, JobStarted(job_id=JOB, attempt=1, submission_id=f"{JOB}-1", pool="gpu-spot"))


def progress(seconds: float, step: int, attempt: int = 1, **metrics: float) -> Event[EventData]:
    return at(
        seconds,
        JobProgress(job_id=JOB, attempt=attempt, step=step, total_steps=100, metrics=metrics),
    )


INTERRUPTED = at(
    30, JobInterrupted(job_id=JOB, attempt=1, node="spot-1", cause=InterruptionCause.PREEMPTED)
)
RESUMED = at(
    32,
    JobResumed(
        job_id=JOB,
        attempt=2,
        from_checkpoint="file:///ckpt/step-40",
        from_step=40,
        steps_lost=2,
        capacity=CapacityClass.SPOT,
    ),
)


SUCCEEDED = at(20, JobSucceeded(job_id=JOB, attempt=1))
FAILED = at(20, JobFailed(job_id=JOB, attempt=1, message="Traceback\n\nKeyError: 'x'\n"))
REJECTED = at(1, JobRejected(job_id=JOB, reason=RejectionReason.QUOTA_EXCEEDED, detail="8 max"))
CANCEL_REQUESTED = at(9, JobCancelRequested(job_id=JOB, requested_by="bob"))
CANCELLED = at(9, JobCancelled(job_id=JOB, attempt=1))
LOST_AND_RESUMED = "resumed from step 40, 2 steps lost"


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param((REQUESTED,), (Phase.REQUESTED, None, None, 0, None), id="requested"),
        pytest.param((REQUESTED, ACCEPTED, QUEUED), (Phase.QUEUED, 1, None, 0, None), id="queued"),
        pytest.param((QUEUED, STARTED), (Phase.RUNNING, 1, None, 0, None), id="started"),
        pytest.param(
            (QUEUED, STARTED, progress(10, 20, loss=0.5)),
            (Phase.RUNNING, 1, 20, 0, None),
            id="progress",
        ),
        pytest.param(
            (QUEUED, progress(10, 20)),
            (Phase.RUNNING, 1, 20, 0, None),
            id="progress-before-started",
        ),
        pytest.param(
            (STARTED, progress(10, 42), INTERRUPTED),
            (Phase.INTERRUPTED, 1, 42, 1, "preempted (spot-1)"),
            id="interrupted",
        ),
        pytest.param(
            (STARTED, progress(10, 42), INTERRUPTED, RESUMED),
            (Phase.QUEUED, 2, 42, 1, LOST_AND_RESUMED),
            id="resumed",
        ),
        pytest.param(
            (STARTED, INTERRUPTED, RESUMED, progress(40, 30)),
            (Phase.QUEUED, 2, None, 1, LOST_AND_RESUMED),
            id="a-late-report-of-the-lost-attempt-is-ignored",
        ),
        pytest.param(
            (STARTED, INTERRUPTED, RESUMED, progress(41, 45, attempt=2)),
            (Phase.RUNNING, 2, 45, 1, None),
            id="the-next-attempt-reports",
        ),
        pytest.param(
            (STARTED, progress(10, 99), SUCCEEDED),
            (Phase.SUCCEEDED, 1, 99, 0, None),
            id="succeeded",
        ),
        pytest.param(
            (STARTED, FAILED), (Phase.FAILED, 1, None, 0, "KeyError: 'x'"), id="failed-last-line"
        ),
        pytest.param(
            (REQUESTED, REJECTED),
            (Phase.REJECTED, None, None, 0, "quota-exceeded: 8 max"),
            id="rejected",
        ),
        pytest.param(
            (STARTED, CANCEL_REQUESTED),
            (Phase.RUNNING, 1, None, 0, "cancel requested by bob"),
            id="cancel-requested",
        ),
        pytest.param((STARTED, CANCELLED), (Phase.CANCELLED, 1, None, 0, None), id="cancelled"),
    ],
)
def test_the_view_follows_the_jobs_life(
    events: tuple[Event[EventData], ...],
    expected: tuple[Phase, int | None, int | None, int, str | None],
) -> None:
    """Each event moves the view as a user would describe the job.

    Expected: phase, attempt, step, interruptions, detail.
    """
    view = fold(*events)
    assert (view.phase, view.attempt, view.step, view.interruptions, view.detail) == expected


def test_events_of_other_jobs_leave_the_view_alone() -> None:
    """A watcher fed the whole bus shows only its own job."""
    other = at(5, JobSucceeded(job_id="other-job", attempt=1))
    assert fold(STARTED, other) == fold(STARTED)


def test_a_phase_counts_from_the_event_that_began_it() -> None:
    """`since` is when the phase began, so `running 2m` is measured from the start."""
    view = fold(REQUESTED, ACCEPTED, QUEUED, STARTED, progress(20, 10), progress(30, 20))
    assert view.since == STARTED.time


def test_the_eta_comes_from_the_pace_of_the_current_attempt() -> None:
    """20 steps in 10 s leaves 60 steps for 30 s; a checkpoint does not move it."""
    view = fold(STARTED, progress(10, 20), progress(20, 40))
    assert view.eta_s == pytest.approx(30.0)
    checkpointed = at(21, JobCheckpointed(job_id=JOB, attempt=1, step=40, uri="file:///c/40"))
    view = advance(view, checkpointed)
    assert view.checkpoint_step == 40
    assert view.eta_s == pytest.approx(30.0)


def test_the_eta_of_the_training_code_wins_over_the_pace() -> None:
    report = JobProgress(job_id=JOB, attempt=1, step=50, total_steps=100, eta_s=7.0)
    assert fold(STARTED, progress(10, 20), at(20, report)).eta_s == 7.0


NOW = T0 + timedelta(seconds=75)


@pytest.mark.parametrize(
    ("view", "line"),
    [
        pytest.param(
            JobView(job_id=JOB, since=T0), f"{JOB} · requested 1m15s", id="requested-counts"
        ),
        pytest.param(
            JobView(
                job_id=JOB,
                phase=Phase.RUNNING,
                since=T0 + timedelta(seconds=60),
                attempt=2,
                interruptions=1,
                step=25,
                total_steps=100,
                metrics={"loss": 0.123456, "acc": 0.9},
                eta_s=95,
            ),
            f"{JOB} · running 15s · attempt 2 (1 interruption) · "
            "step 25/100 █████░░░░░░░░░░░░░░░ 25% · acc=0.9 loss=0.1235 · ETA 1m35s",
            id="running",
        ),
        pytest.param(
            JobView(job_id=JOB, phase=Phase.QUEUED, since=T0, attempt=3, interruptions=2),
            f"{JOB} · queued 1m15s · attempt 3 (2 interruptions)",
            id="interruptions-plural",
        ),
        pytest.param(
            JobView(
                job_id=JOB,
                phase=Phase.SUCCEEDED,
                since=T0,
                attempt=1,
                step=7,
                eta_s=3,
                cost_usd=0.5,
            ),
            f"{JOB} · succeeded · attempt 1 · step 7 · cost $0.50",
            id="ended-without-clock-or-eta",
        ),
        pytest.param(
            JobView(job_id=JOB, phase=Phase.FAILED, attempt=1, detail="KeyError: 'x'"),
            f"{JOB} · failed · attempt 1 — KeyError: 'x'",
            id="failed-with-reason",
        ),
    ],
)
def test_the_line_says_where_the_job_is(view: JobView, line: str) -> None:
    """One line: job, phase and for how long, attempt, step, metrics, ETA, cost, reason."""
    assert render_text(view, NOW) == line


def test_the_html_line_has_a_progress_bar_and_escapes_text() -> None:
    view = JobView(job_id=JOB, phase=Phase.FAILED, step=3, total_steps=4, detail="<boom> & co")
    html = render_html(view, NOW)
    assert '<progress value="3" max="4"' in html
    assert "&lt;boom&gt; &amp; co" in html
    assert "█" not in html, "the HTML bar replaces the text one"
    assert render_html(replace(view, step=None), NOW).count("<progress") == 0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(-3, "0s", id="never-negative"),
        pytest.param(42.4, "42s", id="seconds"),
        pytest.param(185, "3m05s", id="minutes"),
        pytest.param(7620, "2h07m", id="hours"),
    ],
)
def test_durations_are_short(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
