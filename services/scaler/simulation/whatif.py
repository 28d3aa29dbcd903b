"""What if the pools had been different: the demand recorded over a window (each job's
queued bundles, when it was queued, how long its attempts ran) replayed through the trace
simulator (`simulate.simulate`, our policy) on another pools file, against what really
happened: the nodes billed in the window (`shared.policy.cost`) and the queued → started waits.

    python -m services.scaler.simulation.whatif --events window.jsonl --pools FILE \\
        --since ISO --until ISO [--json]

`spotrain events what-if` reads the window from the bus and runs this; it also reads an
export (`spotrain events export`) directly.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.simulation.replay import Result, load_pools, simulate, split_bundles
from services.scaler.simulation.traces import TraceJob
from shared.events import Event
from shared.events.data import (
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobQueued,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
)
from shared.events.types import CapacityClass
from shared.policy.cost import ledger
from shared.replay import parse_lines

AttemptKey = tuple[str, int]


@dataclass(frozen=True)
class RecordedJob:
    """One job as the record tells it: what it asked, how long it waited and ran."""

    job_id: str
    queued_at: datetime
    """When its first attempt in the window was queued: its arrival."""
    gpus_per_bundle: tuple[int, ...]
    capacity: CapacityClass
    ran_s: float
    """The attempts' run times added up (a lost attempt's included), cut at the window's end."""
    waited_s: float | None
    """The attempts' queued → started times added up; None if one never started."""
    started: bool
    """Whether any attempt started in the window; if none did, its wait is not known yet."""

    @property
    def gpus(self) -> int:
        return sum(self.gpus_per_bundle)


@dataclass(frozen=True)
class Figures:
    cost_usd: float
    wait_p50_s: float
    wait_p95_s: float
    wait_max_s: float
    nodes_launched: int


@dataclass(frozen=True)
class Comparison:
    since: datetime
    until: datetime
    jobs: int
    """Jobs compared: those that ran on GPUs in the window."""
    recorded: Figures
    what_if: Figures
    notes: tuple[str, ...]

    def difference(self) -> dict[str, float]:
        real, other = asdict(self.recorded), asdict(self.what_if)
        return {key: round(other[key] - real[key], 4) for key in real}

    def as_json(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "jobs": self.jobs,
            "recorded": asdict(self.recorded),
            "what_if": asdict(self.what_if),
            "difference": self.difference(),
            "notes": list(self.notes),
        }


class _Timeline:
    """When each attempt was queued, started and ended, from events in stream order."""

    def __init__(self) -> None:
        self.queued: dict[AttemptKey, tuple[datetime, JobQueued]] = {}
        self.started: dict[AttemptKey, datetime] = {}
        self.ended: dict[AttemptKey, datetime] = {}
        self.cancelled: dict[str, datetime] = {}

    def add(self, event: Event[Any]) -> None:
        data, at = event.data, event.time
        if isinstance(data, JobQueued):
            self.queued.setdefault((data.job_id, data.attempt), (at, data))
        elif isinstance(data, JobStarted):
            self.started.setdefault((data.job_id, data.attempt), at)
        elif isinstance(data, JobSucceeded | JobFailed | JobInterrupted):
            self._end((data.job_id, data.attempt), at)
        elif isinstance(data, JobCancelled):
            if data.attempt is None:
                self.cancelled[data.job_id] = min(self.cancelled.get(data.job_id, at), at)
            else:
                self._end((data.job_id, data.attempt), at)

    def _end(self, key: AttemptKey, at: datetime) -> None:
        self.ended[key] = min(self.ended.get(key, at), at)

    def job(self, job_id: str, numbers: Sequence[int], until: datetime) -> RecordedJob | None:
        first = next(
            (self.queued[(job_id, n)] for n in numbers if (job_id, n) in self.queued), None
        )
        if first is None:
            return None  # queued before the window: not the window's demand
        ran_s = 0.0
        waited_s: float | None = 0.0
        for n, after in zip(numbers, [*numbers[1:], None], strict=True):
            key = (job_id, n)
            start = self.started.get(key)
            if start is None:
                waited_s = None
                continue
            # An attempt runs until it ends, the job is cancelled, the next attempt starts,
            # or the window closes, whichever comes first.
            next_start = self.started.get((job_id, after)) if after is not None else None
            ends = [self.ended.get(key), self.cancelled.get(job_id), next_start, until]
            ran_s += (min(e for e in ends if e is not None and e >= start) - start).total_seconds()
            if waited_s is not None and key in self.queued:
                waited_s += max(0.0, (start - self.queued[key][0]).total_seconds())
        at, data = first
        return RecordedJob(
            job_id=job_id,
            queued_at=at,
            gpus_per_bundle=tuple(b.gpus for b in data.bundles),
            capacity=data.capacity,
            ran_s=ran_s,
            waited_s=waited_s,
            started=any((job_id, n) in self.started for n in numbers),
        )


def recorded_jobs(events: Iterable[Event[Any]], *, until: datetime) -> list[RecordedJob]:
    """The jobs queued in the events, in the order they arrived. Pure."""
    timeline = _Timeline()
    for event in events:
        timeline.add(event)
    attempts: dict[str, list[int]] = {}
    for job_id, attempt in sorted({*timeline.queued, *timeline.started}):
        attempts.setdefault(job_id, []).append(attempt)
    jobs = [
        job
        for job_id, numbers in attempts.items()
        if (job := timeline.job(job_id, numbers, until)) is not None
    ]
    return sorted(jobs, key=lambda j: (j.queued_at, j.job_id))


STORED_LATE_S = 60.0
"""Events all stored this long after they happened were imported (`spotrain events
import`): their window is their own times, not when the stream stored them."""


def event_window(
    events: Sequence[Event[Any]], since: datetime | None, until: datetime | None
) -> tuple[datetime, datetime, bool]:
    """The window to compare over, in the events' own time, and whether the events were
    imported: the window as read from the stream, unless the jobs' events all happened well
    before it (an import), or no window was given (a file); then the events' own span, from
    the first job event to the last event of any kind. Pure."""
    job_times = [e.time for e in events if e.data.aggregate == "job"]
    if not job_times:
        if since is None or until is None:
            raise ValueError("no job events in the file, and no window given")
        return since, until, False
    imported = since is not None and max(job_times) < since - timedelta(seconds=STORED_LATE_S)
    if since is not None and until is not None and not imported:
        return since, until, False
    start = min(job_times)
    end = max(e.time for e in events if e.time >= start)
    return start, end, imported


def as_trace(jobs: Sequence[RecordedJob], since: datetime) -> list[TraceJob]:
    """The simulator's input: each job that ran on GPUs, arriving when it was queued (in
    seconds from `since`) and running as long as it really ran."""
    return [
        TraceJob(job.job_id, (job.queued_at - since).total_seconds(), job.gpus, job.ran_s)
        for job in jobs
        if job.gpus > 0 and job.ran_s > 0
    ]


def compare(
    events: Sequence[Event[Any]],
    pools: Sequence[PoolSpec],
    config: ScalerConfig,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Comparison:
    """The recorded window against the same demand under our policy on `pools`; see
    `event_window` for the window."""
    since, until, imported = event_window(events, since, until)
    events = [e for e in events if e.time < until or e.data.aggregate != "job"]
    jobs = recorded_jobs(events, until=until)
    trace = as_trace(jobs, since)
    compared = {t.job_id for t in trace}
    waits = [j.waited_s for j in jobs if j.job_id in compared and j.waited_s is not None]
    launched = {
        e.data.node
        for e in events
        if isinstance(e.data, NodeLaunched) and since <= e.data.launched_at < until
    }
    spent = ledger(events, now=until, since=since).attribution.cost_usd
    recorded = Figures(
        cost_usd=round(float(spent), 2),
        wait_p50_s=_percentile(waits, 0.50),
        wait_p95_s=_percentile(waits, 0.95),
        wait_max_s=max(waits, default=0.0),
        nodes_launched=len(launched),
    )
    result = simulate(trace, "spotrain", pools, config)
    what_if = Figures(
        cost_usd=result.cost_usd,
        wait_p50_s=result.wait_p50_s,
        wait_p95_s=result.wait_p95_s,
        wait_max_s=result.wait_max_s,
        nodes_launched=result.nodes_launched,
    )
    return Comparison(
        since=since,
        until=until,
        jobs=len(trace),
        recorded=recorded,
        what_if=what_if,
        notes=(
            *(
                ["compared over the events' own times (stored later: an import?)"]
                if imported
                else []
            ),
            *_notes(jobs, trace, pools, result),
        ),
    )


def _notes(
    jobs: Sequence[RecordedJob],
    trace: Sequence[TraceJob],
    pools: Sequence[PoolSpec],
    result: Result,
) -> list[str]:
    """What the comparison leaves out or approximates, counted."""
    compared = {t.job_id for t in trace}
    notes = []
    waiting = [j for j in jobs if not j.started]
    if waiting:
        notes.append(f"{len(waiting)} jobs still queued at the end of the window: not compared")
    cpu_only = [j for j in jobs if j.gpus == 0]
    if cpu_only:
        notes.append(
            f"{len(cpu_only)} CPU-only jobs: not simulated (their nodes are in the recorded cost)"
        )
    if result.jobs_unschedulable:
        notes.append(f"{result.jobs_unschedulable} jobs no pool of the file can ever hold")
    if result.jobs_unfinished:
        notes.append(f"{result.jobs_unfinished} jobs never finished under the file's pools")
    reshaped = [
        j
        for j in jobs
        if j.job_id in compared
        and sorted(j.gpus_per_bundle, reverse=True) != list(split_bundles(j.gpus, pools))
    ]
    if reshaped:
        notes.append(
            f"{len(reshaped)} jobs' bundles reshaped: the simulator splits a job's GPUs by "
            "the largest node"
        )
    pinned = [j for j in jobs if j.job_id in compared and j.capacity is not CapacityClass.ANY]
    if pinned:
        notes.append(
            f"{len(pinned)} jobs asked for {'/'.join(sorted({j.capacity for j in pinned}))} "
            "only: the simulator lets every job use any pool"
        )
    return notes


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank, as the simulator reports its waits."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def print_table(comparison: Comparison, pools_file: Path) -> None:
    from rich.console import Console  # noqa: PLC0415  # only the table needs rich
    from rich.table import Table  # noqa: PLC0415

    c = comparison
    table = Table(
        "",
        "recorded",
        f"what-if ({pools_file.name})",
        "difference",
        title=f"{c.jobs} jobs from {c.since.astimezone():%Y-%m-%d %H:%M:%S} "
        f"to {c.until.astimezone():%Y-%m-%d %H:%M:%S}",
    )
    difference = c.difference()
    rows = [
        ("cost $", "cost_usd", "{:,.2f}"),
        ("wait p50 s", "wait_p50_s", "{:,.0f}"),
        ("wait p95 s", "wait_p95_s", "{:,.0f}"),
        ("wait max s", "wait_max_s", "{:,.0f}"),
        ("nodes launched", "nodes_launched", "{:,}"),
    ]
    for title, key, style in rows:
        real, other, delta = getattr(c.recorded, key), getattr(c.what_if, key), difference[key]
        change = f" ({delta / real:+.1%})" if real else ""
        sign = "+" if delta > 0 else ""
        shown = style.format(int(delta) if key == "nodes_launched" else delta)
        table.add_row(title, style.format(real), style.format(other), f"{sign}{shown}{change}")
    console = Console()
    console.print(table)
    for note in c.notes:
        console.print(f"[dim]note: {note}[/]")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spotrain events what-if", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument("--events", type=Path, required=True, help="JSON lines of recorded events")
    p.add_argument("--pools", type=Path, required=True, help="TOML of [[pool]] and [scaler]")
    p.add_argument("--since", type=_aware, help="ISO time; default: the first job event's")
    p.add_argument("--until", type=_aware, help="ISO time; default: the last event's")
    p.add_argument("--json", action="store_true", help="the figures as one JSON object")
    return p


def _aware(text: str) -> datetime:
    at = datetime.fromisoformat(text)
    return at if at.tzinfo is not None else at.astimezone()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        with args.events.open("rb") as f:
            parsed, rejected = parse_lines(f)
        if rejected:
            raise ValueError(f"{args.events}: {rejected[0]}")
        pools, config = load_pools(args.pools)
        if not any(p.gpus > 0 for p in pools):
            raise ValueError(f"{args.pools}: no pool with GPUs to run the jobs on")
        comparison = compare(
            [line.event for line in parsed], pools, config, since=args.since, until=args.until
        )
    except (OSError, ValueError, tomllib.TOMLDecodeError) as error:
        # A bad file or value is the user's to fix: one line, no traceback.
        message = " ".join(str(error).split())
        print(f"spotrain events what-if: error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(comparison.as_json(), indent=2))
    else:
        print_table(comparison, args.pools)
    return 0


if __name__ == "__main__":
    sys.exit(main())
