"""A job's live progress as one value, folded from its events: pure, no I/O, no clock reads.

`advance(view, event)` is what `watch` calls for every event of the job; `render_text` and
`render_html` turn a view into the one line a notebook or a terminal shows.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from shared.events import Event, EventData
from shared.events.data import (
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
)

MAX_METRICS_SHOWN = 6
BAR_WIDTH = 20


class Phase(StrEnum):
    """Where a job is, as its events tell; the record's states plus `requested`."""

    REQUESTED = "requested"
    """Published, not yet accepted by the submitter."""
    QUEUED = "queued"
    """Accepted (or resumed), waiting for capacity or for Ray to start it."""
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    """Its capacity went away; the platform decides whether and where it resumes."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


ENDED = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED, Phase.REJECTED})


@dataclass(frozen=True)
class JobView:
    """What a watcher knows of one job after the events it has seen so far."""

    job_id: str
    phase: Phase = Phase.REQUESTED
    since: datetime | None = None
    """When the current phase began (the time of the event that started it)."""
    attempt: int | None = None
    """The current attempt's number; attempts are numbered from 1."""
    interruptions: int = 0
    """Attempts whose capacity went away under them (preempted, node lost)."""
    pool: str | None = None
    step: int | None = None
    total_steps: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    eta_s: float | None = None
    """Seconds to the last step: the training code's own estimate, else the recent pace."""
    checkpoint_step: int | None = None
    cost_usd: float | None = None
    """What the job has cost so far; None while unknown (see `watch.CostSource`)."""
    detail: str | None = None
    """Why it is where it is: a failure's last line, a rejection's reason, a resume."""
    pace_origin: tuple[datetime, int] | None = None
    """The first progress report of the current attempt: (time, step), for the pace."""

    @property
    def ended(self) -> bool:
        return self.phase in ENDED


def advance(view: JobView, event: Event[EventData]) -> JobView:  # noqa: PLR0912  # a case per event type
    """The view after one more event of its job; events of other jobs leave it unchanged.

    Pure: no I/O, no clock; time comes from the event itself.
    """
    data = event.data
    if getattr(data, "job_id", None) != view.job_id:
        return view
    match data:
        case JobRequested():
            return view if view.since else replace(view, since=event.time)
        case JobAccepted():
            return _enter(view, Phase.QUEUED, event.time)
        case JobQueued(attempt=attempt):
            return replace(_enter(view, Phase.QUEUED, event.time), attempt=attempt)
        case JobStarted(attempt=attempt, pool=pool):
            return replace(_enter(view, Phase.RUNNING, event.time), attempt=attempt, pool=pool)
        case JobProgress():
            return _progressed(view, data, event.time)
        case JobCheckpointed(step=step):
            return replace(view, checkpoint_step=step)
        case JobInterrupted(cause=cause, node=node):
            entered = _enter(view, Phase.INTERRUPTED, event.time)
            return replace(
                entered, interruptions=view.interruptions + 1, detail=f"{cause.value} ({node})"
            )
        case JobResumed():
            lost = f", {data.steps_lost} steps lost" if data.steps_lost else ""
            return replace(
                _enter(view, Phase.QUEUED, event.time),
                attempt=data.attempt,
                detail=f"resumed from step {data.from_step}{lost}",
                pace_origin=None,
                eta_s=None,
            )
        case JobSucceeded(attempt=attempt):
            return replace(
                _enter(view, Phase.SUCCEEDED, event.time), attempt=attempt, eta_s=None, detail=None
            )
        case JobFailed(attempt=attempt, message=message):
            lines = [line for line in message.strip().splitlines() if line.strip()]
            return replace(
                _enter(view, Phase.FAILED, event.time),
                attempt=attempt,
                eta_s=None,
                detail=lines[-1].strip() if lines else None,
            )
        case JobCancelRequested(requested_by=who):
            return replace(view, detail=f"cancel requested by {who}")
        case JobCancelled():
            return replace(_enter(view, Phase.CANCELLED, event.time), eta_s=None)
        case JobRejected(reason=reason, detail=detail):
            return replace(
                _enter(view, Phase.REJECTED, event.time), detail=f"{reason.value}: {detail}"
            )
    return view


def _enter(view: JobView, phase: Phase, at: datetime) -> JobView:
    if view.phase is phase:
        return view
    return replace(view, phase=phase, since=at)


def _progressed(view: JobView, progress: JobProgress, at: datetime) -> JobView:
    if view.ended or (view.attempt is not None and progress.attempt < view.attempt):
        return view  # a late report of an attempt that is over
    origin = view.pace_origin
    if origin is None or progress.attempt != view.attempt or progress.step < origin[1]:
        origin = (at, progress.step)
    eta_s = progress.eta_s
    if eta_s is None and progress.total_steps is not None:
        eta_s = _pace_eta_s(origin, at, progress.step, progress.total_steps)
    phase = Phase.RUNNING if view.phase in (Phase.REQUESTED, Phase.QUEUED) else view.phase
    moved = _enter(view, phase, at)
    return replace(
        moved,
        attempt=progress.attempt,
        step=progress.step,
        total_steps=progress.total_steps,
        metrics=dict(progress.metrics),
        eta_s=eta_s,
        pace_origin=origin,
        detail=None if phase is Phase.RUNNING else view.detail,
    )


def _pace_eta_s(origin: tuple[datetime, int], at: datetime, step: int, total: int) -> float | None:
    elapsed_s = (at - origin[0]).total_seconds()
    done = step - origin[1]
    if elapsed_s <= 0 or done <= 0:
        return None
    return max(0.0, (total - step) * elapsed_s / done)


# --- rendering -----------------------------------------------------------------------------


def render_text(view: JobView, now: datetime, *, bar: bool = True) -> str:
    """One line: job, phase and for how long, attempt, step and bar, metrics, ETA, cost."""
    parts = [view.job_id, _phase_text(view, now)]
    if view.attempt is not None:
        interrupted = (
            f" ({view.interruptions} interruption{'s' if view.interruptions != 1 else ''})"
            if view.interruptions
            else ""
        )
        parts.append(f"attempt {view.attempt}{interrupted}")
    if view.step is not None:
        parts.append(_step_text(view, bar=bar))
    if view.metrics:
        shown = sorted(view.metrics.items())[:MAX_METRICS_SHOWN]
        parts.append(" ".join(f"{name}={value:.4g}" for name, value in shown))
    if view.eta_s is not None and not view.ended:
        parts.append(f"ETA {format_duration(view.eta_s)}")
    if view.cost_usd is not None:
        parts.append(f"cost ${view.cost_usd:.2f}")
    line = " · ".join(parts)
    return f"{line} — {view.detail}" if view.detail else line


def render_html(view: JobView, now: datetime) -> str:
    """The same line for a notebook, with a progress bar when the total is known."""
    progress = ""
    if view.step is not None and view.total_steps:
        value = min(view.step, view.total_steps)
        progress = (
            f'<progress value="{value}" max="{view.total_steps}" style="width:12em"></progress> '
        )
    colour = {
        Phase.SUCCEEDED: "#2e7d32",
        Phase.FAILED: "#c62828",
        Phase.REJECTED: "#c62828",
        Phase.INTERRUPTED: "#ef6c00",
    }.get(view.phase, "inherit")
    text = html.escape(render_text(view, now, bar=not progress))
    return f'<div style="font-family:monospace;color:{colour}">{progress}{text}</div>'


def _phase_text(view: JobView, now: datetime) -> str:
    if view.ended or view.since is None:
        return view.phase.value
    return f"{view.phase.value} {format_duration((now - view.since).total_seconds())}"


def _step_text(view: JobView, *, bar: bool) -> str:
    if view.total_steps is None:
        return f"step {view.step}"
    step = view.step or 0
    fraction = min(1.0, step / view.total_steps) if view.total_steps else 1.0
    filled = round(fraction * BAR_WIDTH)
    glyphs = ("█" * filled + "░" * (BAR_WIDTH - filled) + " ") if bar else ""
    return f"step {step}/{view.total_steps} {glyphs}{fraction:.0%}"


def format_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`: short, and never negative."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
