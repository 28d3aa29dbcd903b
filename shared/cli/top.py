"""`spotrain top`: pools, jobs and cost on one screen, refreshed every few seconds.

`render` draws one frame from a `TopSnapshot` and does nothing else; `SnapshotReader`
reads snapshots from the bus; the command loops the two until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, TypeVar

import nats.errors
import nats.js.errors
import typer
from rich import box
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shared.cli.console import CliError, out, table_width
from shared.cli.tables import Column, column_width, fitting
from shared.cli.tables import render as render_lines
from shared.client import PlatformError, SpotrainClient
from shared.clock import Clock, SystemClock
from shared.jobs import JobRecord, JobState, span_text
from shared.messaging import BusSettings
from shared.policy.cost import CostRow, GroupBy, cost_rows, format_usd, job_costs, total
from shared.pools import PoolsStatus

T = TypeVar("T")

_READ_ERRORS = (nats.errors.Error, TimeoutError, PlatformError)
"""A read that failed but may succeed again (the client's timeouts are `PlatformError`)."""

MIN_INTERVAL_S = 0.5
"""Every refresh reads the jobs bucket and the cost events: not faster than this."""
STALE_AFTER = timedelta(seconds=30)
"""The scaler reports every few seconds; a report older than this is flagged."""
REFRESH_TIMEOUT_S = 15.0
"""A live refresh that takes longer (NATS gone, reconnecting) is given up and retried."""
MAIN_METRICS = ("loss", "train_loss", "val_loss", "eval_loss")
"""The metric a job's row shows, the first one it reports; else its first by name."""
NO_SCALER = "the scaler has not reported yet; is it running? (spotrain status)"

_STATE_COLOURS = {
    JobState.RUNNING: "cyan",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.REJECTED: "red",
    JobState.CANCELLED: "dim",
}


@dataclass(frozen=True)
class TopSnapshot:
    """What one frame shows, read at `taken_at`."""

    taken_at: datetime
    pools: PoolsStatus | None
    """The scaler's latest report; None before its first."""
    jobs: Sequence[JobRecord] = ()
    job_costs: Mapping[str, CostRow] = field(default_factory=dict)
    """Each job's cost so far, by job id."""
    experiments: Sequence[CostRow] = ()
    """The cost rows by experiment (`cost_rows(ledger, GroupBy.EXPERIMENT)`)."""


def render(
    snapshot: TopSnapshot, *, limit: int = 20, width: int | None = None, boxed: bool = True
) -> RenderableType:
    """One frame: a header line, the pools, at most `limit` jobs (active ones first, then the
    most recently finished), and the cost by experiment; in `width` columns, each table's
    least useful columns left out (all of them if None). Not `boxed` (not a terminal):
    plain columns, as `ls` prints them.

    Pure: no I/O, no clock; the time shown is the snapshot's."""
    parts: list[RenderableType] = [_header(snapshot)]
    if snapshot.pools is None:
        parts.append(Text(NO_SCALER, style="yellow"))
    else:
        parts.append(_pools_table(snapshot.pools, snapshot.taken_at, width, boxed=boxed))
    parts.append(_jobs_table(snapshot, limit, width, boxed=boxed))
    parts.append(_experiments_table(snapshot.experiments, limit, width, boxed=boxed))
    return Group(*parts)


def shown_jobs(jobs: Iterable[JobRecord], limit: int) -> tuple[list[JobRecord], int]:
    """The jobs a frame lists, and how many it leaves out: active jobs newest first, then
    finished ones, the most recently ended first."""
    active = sorted((j for j in jobs if j.is_active), key=lambda j: j.accepted_at, reverse=True)
    ended = sorted((j for j in jobs if not j.is_active), key=lambda j: j.updated_at, reverse=True)
    ordered = active + ended
    return ordered[:limit], max(0, len(ordered) - limit)


def main_metric(metrics: Mapping[str, float]) -> str:
    """The one metric a job's row has room for, as `name value`; empty when none."""
    if not metrics:
        return ""
    name = next((m for m in MAIN_METRICS if m in metrics), None) or min(metrics)
    return f"{name} {metrics[name]:.4g}"


def _header(snapshot: TopSnapshot) -> Text:
    line = Text()
    line.append("spotrain top", style="bold")
    line.append(f"  {snapshot.taken_at:%H:%M:%S}")
    status = snapshot.pools
    if status is not None:
        over = status.cost_per_hour_usd > status.budget_per_hour_usd
        line.append("   cost ")
        line.append(f"${status.cost_per_hour_usd:.2f}/h", style="bold red" if over else "bold")
        line.append(f" of ${status.budget_per_hour_usd:.2f}/h budget")
        busy = sum(p.gpus_total - p.gpus_free for p in status.pools)
        gpus = sum(p.gpus_total for p in status.pools)
        share = f"{busy / gpus:.0%}" if gpus else "-"
        # Two lines: one would not fit 80 columns, and a terminal would break it anywhere.
        line.append(f"\nGPUs allocated {busy}/{gpus} ({share})   ")
    else:
        line.append("\n")
    queued = [j for j in snapshot.jobs if j.state is JobState.QUEUED]
    line.append(f"queue {len(queued)} jobs / {sum(j.gpus for j in queued)} GPUs")
    if status is not None:
        line.append("   blocked ")
        line.append(str(status.blocked_jobs), style="bold red" if status.blocked_jobs else "")
        away = head_away_line(status, snapshot.jobs, snapshot.taken_at)
        if away is not None:
            line.append("\n")
            line.append(away, style="bold red")
    return line


def head_away_line(status: PoolsStatus, jobs: Iterable[JobRecord], now: datetime) -> str | None:
    """What waits on Ray's head while the scaler cannot reach it; None while it answers."""
    since = status.ray_head_away_since
    if since is None:
        return None
    active = [j for j in jobs if j.is_active]
    queued = sum(1 for j in active if j.state is JobState.QUEUED)
    running = len(active) - queued
    away_s = max(0.0, (now - since).total_seconds())
    return (
        f"Ray's head is away since {since:%H:%M:%S} ({span_text(away_s)}): {queued} queued "
        f"and {running} running jobs wait on it; nothing is placed, grown or released until "
        "it is back"
    )


_POOL_COLUMNS = (
    # As `spotrain pools` orders them: how full each pool is and what waits for it first.
    Column("pool"),
    Column("capacity", priority=2),
    Column("ready/nodes", priority=1),
    Column("busy/gpus", priority=1),
    Column("pending_jobs", priority=1),
    Column("pending_gpus", priority=3),
    Column("target", priority=3),
    Column("usd_per_hour", priority=2),
)


def _pools_table(
    status: PoolsStatus, now: datetime, width: int | None, *, boxed: bool
) -> RenderableType:
    age = now - status.updated_at
    seen_at = status.updated_at.astimezone(now.tzinfo)
    title = Text(f"pools, as the scaler saw them at {seen_at:%H:%M:%S}")
    if age > STALE_AFTER:
        title.append(f" ({int(age.total_seconds())}s ago: is the scaler running?)", style="yellow")
    rows = [
        {
            "pool": row.pool,
            "capacity": row.capacity.value,
            "ready/nodes": f"{row.ready}/{row.nodes}",
            "busy/gpus": f"{row.gpus_total - row.gpus_free}/{row.gpus_total}",
            "pending_jobs": str(row.pending_jobs),
            "pending_gpus": str(row.pending_gpus),
            "target": str(row.target),
            "usd_per_hour": f"{row.price_per_hour_usd:.2f}",
        }
        for row in status.pools
    ]
    return _fitted_table(_POOL_COLUMNS, rows, width, title=title, empty="no pools", boxed=boxed)


def _fitted_table(
    columns: Sequence[Column],
    rows: Sequence[Mapping[str, str | Text]],
    width: int | None,
    *,
    title: str | Text,
    empty: str,
    caption: str | None = None,
    footer: Mapping[str, str] | None = None,
    boxed: bool = True,
) -> RenderableType:
    """A table of the columns that fit in `width` (`tables.fitting`, the footer's cells
    counted), the ones that must stay (priority 0: an id, a name) never wrapped or cut;
    `empty` in its first column when there are no rows. Boxed, or (not at a terminal) the
    plain lines `ls` prints, which rich never squeezes into its default 80 columns."""
    plain = [{key: str(cell) for key, cell in row.items()} for row in rows]
    measured = [*plain, footer] if footer is not None else plain
    if not boxed:
        heading = title if isinstance(title, Text) else Text(title)
        if not rows:
            return Group(heading, Text(empty))
        lines = [heading, *render_lines(columns, measured, width)]
        return Group(*lines, *([Text(caption)] if caption else []))
    shown = fitting(columns, measured, width, gap=3, edges=4)
    table = Table(
        box=box.HEAVY_HEAD,
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        show_footer=footer is not None,
    )
    for column in shown:
        keep = column.priority == 0
        table.add_column(
            column.key,
            footer=footer[column.key] if footer is not None else "",
            no_wrap=keep,
            min_width=column_width(column, measured) if keep else None,
        )
    for row in rows:
        table.add_row(*(row[column.key] for column in shown))
    if not rows:
        table.add_row(f"[dim]{empty}[/]", *[""] * (len(shown) - 1))
    return table


_JOB_COLUMNS = (
    # What a person watches, kept on a narrow terminal: which job, how it is doing, what
    # it costs; who and what for give way first.
    Column("job"),
    Column("owner", priority=3),
    Column("experiment", priority=4),
    Column("state"),
    Column("attempt", priority=3),
    Column("step", priority=1),
    Column("metric", priority=2),
    Column("interruptions", priority=4),
    Column("cost", priority=1),
)


def _jobs_table(
    snapshot: TopSnapshot, limit: int, width: int | None, *, boxed: bool
) -> RenderableType:
    records, left_out = shown_jobs(snapshot.jobs, limit)
    rows = []
    for record in records:
        attempt = record.current
        spent = snapshot.job_costs.get(record.job_id)
        rows.append(
            {
                "job": record.job_id,
                "owner": record.request.owner,
                "experiment": record.request.experiment or "",
                "state": record.state.value,
                "attempt": str(attempt.number) if attempt else "-",
                "step": _step(attempt.step, attempt.total_steps) if attempt else "-",
                "metric": main_metric(attempt.metrics) if attempt else "",
                "interruptions": str(record.interruptions),
                "cost": format_usd(spent.cost_usd) if spent else "-",
            }
        )
    styled: list[dict[str, str | Text]] = [
        {**cells, "state": Text(cells["state"], style=_STATE_COLOURS.get(record.state, "yellow"))}
        for record, cells in zip(records, rows, strict=True)
    ]
    return _fitted_table(
        _JOB_COLUMNS,
        styled,
        width,
        title="jobs, active first",
        empty="no jobs",
        caption=f"{left_out} more not shown (--limit)" if left_out else None,
        boxed=boxed,
    )


def _step(step: int | None, total_steps: int | None) -> str:
    if step is None:
        return "-"
    return f"{step}/{total_steps}" if total_steps is not None else str(step)


_EXPERIMENT_COLUMNS = (
    Column("experiment"),
    Column("cost"),
    Column("waste", priority=1),
    Column("saving_vs_on_demand", priority=2),
)


def _experiments_table(
    rows: Sequence[CostRow], limit: int, width: int | None, *, boxed: bool
) -> RenderableType:
    cells: list[dict[str, str | Text]] = []
    for row in rows[:limit]:
        if row.idle_pool is not None:
            name = Text(f"(idle {row.idle_pool})", style="dim")
        else:
            name = Text(row.key) if row.key else Text("(none)", style="dim")
        cells.append({"experiment": name, **_figures(row)})
    totals = {"experiment": "total", **_figures(total(rows))}
    return _fitted_table(
        _EXPERIMENT_COLUMNS,
        cells,
        width,
        footer=totals if rows else None,
        title="cost by experiment, all on record",
        empty="nothing billed yet",
        caption=f"{len(rows) - limit} more not shown" if len(rows) > limit else None,
        boxed=boxed,
    )


def _figures(row: CostRow) -> dict[str, str]:
    return {
        "cost": format_usd(row.cost_usd),
        "waste": format_usd(row.waste_usd),
        "saving_vs_on_demand": format_usd(row.saving_vs_on_demand_usd),
    }


# --- reading snapshots -----------------------------------------------------------------


class SnapshotReader:
    """Reads snapshots from the bus: the pools report, the job records, the cost events."""

    def __init__(self, client: SpotrainClient, clock: Clock) -> None:
        self._client = client
        self._clock = clock

    async def read(self) -> TopSnapshot:
        pools, jobs, ledger = await asyncio.gather(
            self._client.pools(), self._client.jobs(), self._client.costs()
        )
        return TopSnapshot(
            taken_at=self._clock.now().astimezone(),
            pools=pools,
            jobs=jobs,
            job_costs=job_costs(ledger),
            experiments=cost_rows(ledger, GroupBy.EXPERIMENT),
        )


@contextlib.asynccontextmanager
async def connected_reader(settings: BusSettings | None = None) -> AsyncIterator[SnapshotReader]:
    """A reader over a client of its own, closed on exit; no NATS is the error `ls` gives."""
    client = await SpotrainClient.connect(settings)
    try:
        yield SnapshotReader(client, SystemClock())
    finally:
        # A bus that went away under a live view may fail to close: nothing is left to lose.
        with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
            await client.close()


# --- the command -----------------------------------------------------------------------


def register(app: typer.Typer) -> None:
    app.command()(top)


def top(
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 2.0,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame and exit (for scripts).")
    ] = False,
    limit: Annotated[
        int, typer.Option(min=1, help="At most this many jobs, and experiments, shown.")
    ] = 20,
) -> None:
    """Pools, jobs and cost on one live screen, refreshed every --interval seconds."""
    if not interval >= MIN_INTERVAL_S:  # `not >=` also refuses NaN
        msg = f"--interval takes seconds, at least {MIN_INTERVAL_S:g}, not {interval:g}"
        raise CliError(msg, 2)
    if once:
        frame = render(
            asyncio.run(_once()), limit=limit, width=table_width(), boxed=out.is_terminal
        )
        # Piped: a line as long as its columns, never wrapped at rich's default 80.
        out.print(frame, soft_wrap=not out.is_terminal)
        return
    asyncio.run(_live(interval, limit))


async def _once() -> TopSnapshot:
    async with connected_reader() as reader:
        try:
            return await reader.read()
        except _READ_ERRORS as error:
            raise CliError(f"reading the bus failed: {_one_line(error)}") from None


async def _live(interval_s: float, limit: int) -> None:
    """Frames until Ctrl-C or SIGTERM, which end it quietly. On a terminal each frame
    replaces the last; elsewhere (a pipe, a file) they follow one another."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with connected_reader() as reader:
            try:
                first = await _unless(stop, reader.read())
            except _READ_ERRORS as error:
                raise CliError(f"reading the bus failed: {_one_line(error)}") from None
            if first is None:
                return
            frames = _frames(reader, stop, first, interval_s=interval_s, limit=limit)
            if not out.is_terminal:
                async for frame in frames:
                    out.print(frame)
                return
            with Live(console=out, auto_refresh=False) as live:
                async for frame in frames:
                    live.update(frame, refresh=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _frames(
    reader: SnapshotReader,
    stop: asyncio.Event,
    first: TopSnapshot,
    *,
    interval_s: float,
    limit: int,
) -> AsyncIterator[RenderableType]:
    """The first snapshot's frame, then one every `interval_s` until `stop` is set. A failed
    read keeps the last snapshot, says why under it, and is tried again at the next refresh."""
    last = first
    yield render(first, limit=limit, width=table_width(), boxed=out.is_terminal)
    while not await _stopped_within(stop, interval_s):
        try:
            snapshot = await _unless(stop, _within(REFRESH_TIMEOUT_S, reader.read()))
        except _READ_ERRORS as error:
            problem = Text(f"refresh failed, retrying: {_one_line(error)}", style="red")
            yield Group(
                render(last, limit=limit, width=table_width(), boxed=out.is_terminal), problem
            )
            continue
        if snapshot is None:
            return
        last = snapshot
        yield render(snapshot, limit=limit, width=table_width(), boxed=out.is_terminal)


async def _within(seconds: float, work: Awaitable[T]) -> T:
    try:
        return await asyncio.wait_for(work, timeout=seconds)
    except TimeoutError:
        raise PlatformError(f"NATS did not answer within {seconds:g}s") from None


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()


async def _unless(stop: asyncio.Event, work: Awaitable[T]) -> T | None:
    """The work's result, or None once `stop` is set first (the work is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
