"""What `watch` is made of: views from a job's events, the cost hook, the line on screen, and
coroutines run from a kernel whose own loop is busy."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncGenerator
from datetime import UTC, datetime, timedelta

import pytest

from shared.events import Event, EventData, new_event
from shared.events.data import JobProgress, JobRequested, JobStarted, JobSucceeded
from shared.jobs import JobRecord, JobState
from shared.notebook.loop_thread import LoopThread, run_blocking
from shared.notebook.progress import JobView, Phase
from shared.notebook.submission import SubmittedJob
from shared.notebook.watch import (
    TextScreen,
    _Ended,
    _Failed,
    _Tracker,
    default_screen,
    follow_progress,
    job_id_of,
)
from tests.fakes.clock import FixedClock

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
JOB = "train-abc123"
REQUEST = JobRequested(job_id=JOB, owner="alice", entrypoint=("python", "train.py"))


def at(seconds: float, data: EventData) -> Event[EventData]:
    return new_event(data, source="test", time=T0 + timedelta(seconds=seconds))


class StoredEvents:
    """A client whose `follow` replays a fixed list of events."""

    def __init__(self, *events: Event[EventData]) -> None:
        self.events = events

    async def follow(self, job_id: str) -> AsyncGenerator[Event[EventData], None]:
        for event in self.events:
            yield event


class CountingCost:
    """A cost source that says how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    async def cost_usd(self, job_id: str) -> float | None:
        self.asked += 1
        return 0.25 * self.asked


class RecordingScreen:
    def __init__(self) -> None:
        self.shown: list[JobView] = []
        self.closed: list[tuple[JobView | None, str | None]] = []

    def show(self, view: JobView, now: datetime) -> None:
        self.shown.append(view)

    def close(self, view: JobView | None, now: datetime, note: str | None = None) -> None:
        self.closed.append((view, note))


def record(state: JobState) -> JobRecord:
    return JobRecord(
        request=REQUEST,
        request_event_id="req-1",
        state=state,
        accepted_at=T0,
        updated_at=T0,
    )


EVENTS = (
    at(0, REQUEST),
    at(5, JobStarted(job_id=JOB, attempt=1, submission_id=f"{JOB}-1")),
    at(6, JobProgress(job_id=JOB, attempt=1, step=1, total_steps=3)),
    at(7, JobProgress(job_id=JOB, attempt=1, step=2, total_steps=3)),
    at(8, JobSucceeded(job_id=JOB, attempt=1)),
)


async def test_follow_progress_yields_a_view_per_event_and_ends_with_the_job() -> None:
    views = [view async for view in follow_progress(StoredEvents(*EVENTS), JOB)]
    assert [view.phase for view in views] == [
        Phase.REQUESTED,
        Phase.RUNNING,
        Phase.RUNNING,
        Phase.RUNNING,
        Phase.SUCCEEDED,
    ]
    assert views[-1].step == 2
    assert views[-1].cost_usd is None, "no cost source, no cost"


async def test_the_cost_is_asked_when_the_job_moves_not_at_every_step() -> None:
    """Phase changes and the end refresh the cost; progress within seconds does not."""
    cost = CountingCost()
    views = [view async for view in follow_progress(StoredEvents(*EVENTS), JOB, cost=cost)]
    assert cost.asked == 3, "first event, started, succeeded"
    assert [view.cost_usd for view in views] == [0.25, 0.5, 0.5, 0.5, 0.75]


def test_the_tracker_draws_once_per_batch_and_returns_the_final_record() -> None:
    screen = RecordingScreen()
    tracker = _Tracker(screen, FixedClock(T0))
    first, second = JobView(JOB), JobView(JOB, phase=Phase.RUNNING)
    assert tracker.take([first, second]) is None
    assert screen.shown == [second], "only the latest view of a batch is drawn"
    tracker.tick()
    assert screen.shown == [second, second], "a tick redraws, so the clock moves"
    done = record(JobState.SUCCEEDED)
    assert tracker.take([_Ended(done)]) is done
    assert screen.closed == [(second, None)]


def test_the_tracker_raises_what_the_watcher_met() -> None:
    screen = RecordingScreen()
    tracker = _Tracker(screen, FixedClock(T0))
    with pytest.raises(RuntimeError, match="no job"):
        tracker.take([_Failed(RuntimeError("no job x"))])
    assert screen.closed == [(None, None)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_line_is_redrawn_in_place() -> None:
    stream = Terminal()
    screen = TextScreen(stream)
    screen.show(JobView(JOB, phase=Phase.RUNNING, since=T0), T0 + timedelta(seconds=3))
    screen.show(JobView(JOB, phase=Phase.SUCCEEDED), T0)
    screen.close(JobView(JOB, phase=Phase.SUCCEEDED), T0)
    text = stream.getvalue()
    assert text.startswith(f"\r{JOB} · running 3s")
    assert text.count("\n") == 1, "one line, ended once"
    assert text.rstrip().endswith(f"{JOB} · succeeded")


def test_without_a_terminal_a_line_is_printed_per_change_of_phase() -> None:
    stream = io.StringIO()
    screen = TextScreen(stream)
    running = JobView(JOB, phase=Phase.RUNNING, since=T0)
    screen.show(running, T0)
    screen.show(running, T0 + timedelta(seconds=1))
    succeeded = JobView(JOB, phase=Phase.SUCCEEDED)
    screen.show(succeeded, T0)
    screen.close(succeeded, T0, "done")
    assert stream.getvalue().splitlines() == [
        f"{JOB} · running 0s",
        f"{JOB} · succeeded",
        "done",
    ]


def test_outside_a_kernel_progress_goes_to_stdout_as_text() -> None:
    assert isinstance(default_screen(), TextScreen)


def test_a_job_is_named_by_its_id_or_by_anything_that_has_one() -> None:
    submitted = SubmittedJob(job_id=JOB, request=REQUEST, answered=True)
    assert job_id_of(JOB) == job_id_of(submitted) == job_id_of(record(JobState.QUEUED)) == JOB
    assert "follow it: %spotrain watch train-abc123" in submitted.summary()


async def test_a_coroutine_runs_to_the_end_while_this_threads_loop_is_busy() -> None:
    """What a magic does inside a kernel, whose loop is the one running this test."""

    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    assert run_blocking(answer) == 42


def test_the_coroutines_error_reaches_the_caller() -> None:
    async def fail() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        run_blocking(fail)


def test_a_cancelled_coroutine_stops_and_cleans_up() -> None:
    cleaned = []

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(True)

    runner = LoopThread(forever, name="test-forever")
    runner.start()
    runner.cancel(wait_s=5)
    assert cleaned == [True]
    with pytest.raises(asyncio.CancelledError):
        runner.join(timeout_s=1)
