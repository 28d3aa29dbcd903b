"""`spotrain events`: the operator's view of the record. Tail it, export a window of it as
JSON lines, import such a file (into a local stack, to reproduce an incident), re-deliver a
window to one service, and ask what the recorded demand would have cost on other pools.

The window is when the stream stored the events (`--since`, `--until`), read from the
stream's time index: nothing before it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, TypeVar

import nats.errors
import nats.js.errors
import typer

from shared.cli.console import CliError, err, table_width
from shared.cli.tables import Output, event_line, too_narrow
from shared.events import CATALOG, EventData, InvalidEventError, decode, subjects_for
from shared.events.catalog import replay_subjects_for
from shared.events.data import NodeLaunched, NodeLost, NodeReleased
from shared.messaging import BusSettings
from shared.messaging.jetstream import BusUnavailableError, JetStreamBus
from shared.messaging.ports import StreamRecord
from shared.policy.cost import COST_EVENTS
from shared.replay import (
    event_types,
    import_lines,
    moment,
    parse_lines,
    plan_replay,
    publish_copies,
    type_name,
    window,
)
from shared.replay.jsonl import one_per_line

T = TypeVar("T")

events_app = typer.Typer(
    name="events",
    help="The event stream: tail, export, import, replay to one service, what-if on other pools.",
    no_args_is_help=True,
)

_SINCE_HELP = "From then on: a duration back (90s, 10m, 2h, 1d) or an ISO time."
_UNTIL_HELP = "Up to then (excluded): a duration back or an ISO time. Default: now."
_TYPE_HELP = "Only this type (job.started, a whole aggregate such as job); repeatable."

Since = Annotated[str, typer.Option(help=_SINCE_HELP)]
Until = Annotated[str | None, typer.Option(help=_UNTIL_HELP)]
Types = Annotated[list[str] | None, typer.Option("--type", help=_TYPE_HELP)]

_NODE_LIFE: tuple[type[EventData], ...] = (NodeLaunched, NodeReleased, NodeLost)
_SERVICE = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A durable consumer's name, as a subject token."""


def register(app: typer.Typer) -> None:
    app.add_typer(events_app)


@events_app.command()
def tail(
    types: Types = None,
    job: Annotated[str | None, typer.Option(help="Only this job's events.")] = None,
    since: Annotated[
        str | None, typer.Option(help=f"{_SINCE_HELP} Default: only new events.")
    ] = None,
    output: Annotated[
        Output,
        typer.Option(
            "--output",
            "-o",
            help="table (one line each, fitting the terminal), wide (every field) or json "
            "(each event as stored, one JSON per line).",
        ),
    ] = Output.TABLE,
    as_json: Annotated[bool, typer.Option("--json", help="Same as -o json.")] = False,
) -> None:
    """Follow events as they are stored, until Ctrl-C."""
    if as_json:
        output = Output.JSON
    width = None if output is not Output.TABLE else table_width()
    refusal = too_narrow(width)
    if refusal is not None:
        raise CliError(refusal, 2)
    models = _models(types)
    if job is not None:
        models = tuple(m for m in models if m.aggregate == "job")
        if not models:
            raise CliError("--job follows job events; --type names none", 2)
    start = _moment(since, "--since") if since is not None else None

    async def go(bus: JetStreamBus, stop: asyncio.Event) -> None:
        subjects = subjects_for(models, bus.prefix)
        async with contextlib.aclosing(bus.follow(subjects, stop, since=start)) as records:
            async for record in records:
                line = _tail_line(record, job, output=output, width=width)
                if line is not None:
                    print(line, flush=True)

    _run(go, until_stopped=True)


@events_app.command()
def export(
    since: Since,
    until: Until = None,
    types: Types = None,
) -> None:
    """Write the events stored in the window to stdout, one CloudEvents JSON per line."""
    start, end = _window(since, until)
    models = _models(types)

    async def go(bus: JetStreamBus, stop: asyncio.Event) -> tuple[int, int]:
        written = skipped = 0
        subjects = subjects_for(models, bus.prefix)
        output = sys.stdout.buffer
        async with contextlib.aclosing(bus.read_window(subjects, since=start, until=end)) as rs:
            async for record in rs:
                line = one_per_line(record.data)
                if line is None:
                    skipped += 1
                    continue
                output.write(line + b"\n")
                written += 1
        output.flush()
        return written, skipped

    written, skipped = _run(go)
    _note(f"exported {written} events stored from {_when(start)} to {_when(end)}")
    if skipped:
        _note(f"[yellow]{skipped} stored messages span several lines: left out[/]")


@events_app.command(name="import")
def import_events(
    file: Annotated[Path, typer.Argument(help="JSON lines of events (spotrain events export).")],
) -> None:
    """Publish each event of a JSON-lines file with its own id: importing twice stores once."""
    try:
        with file.open("rb") as f:
            parsed, rejected = parse_lines(f)
    except OSError as error:
        raise CliError(f"cannot read {file}: {error.strerror or error}", 2) from None
    for line in rejected:
        _note(f"{file}: {line}", markup=False)

    async def go(bus: JetStreamBus, stop: asyncio.Event) -> tuple[int, int]:
        report = await import_lines(bus, parsed)
        return report.stored, report.duplicates

    stored, duplicates = _run(go) if parsed else (0, 0)
    print(
        f"imported {len(parsed)} events: {stored} stored, {duplicates} already on the stream; "
        f"{len(rejected)} lines rejected"
    )
    if rejected:
        raise typer.Exit(1)


@events_app.command()
def replay(
    since: Since,
    to: Annotated[
        str, typer.Option("--to", help="The one service to re-deliver to (its consumer's name).")
    ],
    until: Until = None,
    types: Types = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be re-delivered; publish nothing.")
    ] = False,
) -> None:
    """Re-deliver the events stored in the window to one service's consumer, and no other.

    Safe by construction: handlers are idempotent, so a replayed request starts nothing
    twice. Only the types the service consumes are re-delivered."""
    start, end = _window(since, until)
    wanted = _models(types) if types else None
    if _SERVICE.fullmatch(to) is None:
        raise CliError(f"--to takes a service's name, not {to!r}", 2)
    run = secrets.token_hex(4)

    async def go(bus: JetStreamBus, stop: asyncio.Event) -> None:
        consumed = await _consumed_by(bus, to)
        models = consumed
        if wanted is not None:
            others = [type_name(m) for m in wanted if m not in consumed]
            if others and len(others) == len(wanted):
                taken = ", ".join(sorted({type_name(m) for m in consumed}))
                msg = f"{to} consumes none of {', '.join(others)} (it consumes {taken})"
                raise CliError(msg, 2)
            models = tuple(m for m in wanted if m in consumed)
            if others:
                _note(f"[yellow]{to} does not consume {', '.join(others)}: left out[/]")
        subjects = subjects_for(models, bus.prefix)
        async with contextlib.aclosing(bus.read_window(subjects, since=start, until=end)) as rs:
            plan = plan_replay([r async for r in rs], service=to, run=run, prefix=bus.prefix)
        span = f"stored from {_when(start)} to {_when(end)}"
        if dry_run:
            total = len(plan.copies)
            print(f"would re-deliver {total} events {span} to {to} (dry run, nothing sent):")
            for event_type, count in plan.counts().items():
                print(f"  {count:>6}  {event_type}")
            for copy in plan.copies:
                print(f"  {copy.event_type}  {copy.event_id}")
        else:
            stored = await publish_copies(bus, plan)
            counts = ", ".join(f"{n} {t}" for t, n in plan.counts().items()) or "nothing"
            print(f"re-delivered {stored} events {span} to {to} (replay {run}): {counts}")
        if plan.invalid:
            _note(f"[yellow]{plan.invalid} stored messages are no valid event: left out[/]")

    _run(go)


@events_app.command(name="what-if")
def what_if(
    since: Since,
    pools: Annotated[
        Path, typer.Option(help="Pools to try: [[pool]] tables and an optional [scaler] one.")
    ],
    until: Until = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The figures as one JSON object.")
    ] = False,
) -> None:
    """Replay the window's recorded demand through the scaler's policy on other pools, and
    print the cost and queue-wait difference against what really happened."""
    start, end = _window(since, until)
    if not pools.is_file():
        raise CliError(f"no pools file {pools}", 2)
    job_models = tuple(m for m in COST_EVENTS if m not in _NODE_LIFE)

    async def go(bus: JetStreamBus, stop: asyncio.Event) -> list[StreamRecord]:
        # The nodes' lives from the start (a node launched before the window is billed in
        # it); the jobs' events in the window only.
        nodes = subjects_for(_NODE_LIFE, bus.prefix)
        jobs = subjects_for(job_models, bus.prefix)
        records: list[StreamRecord] = []
        for subjects, first in ((nodes, None), (jobs, start)):
            read = bus.read_window(subjects, since=first, until=end)
            async with contextlib.aclosing(read) as rs:
                records += [r async for r in rs]
        return sorted(records, key=lambda r: r.seq)

    records = _run(go)
    with tempfile.TemporaryDirectory(prefix="spotrain-what-if-") as folder:
        recorded = Path(folder) / "recorded.jsonl"
        recorded.write_bytes(b"".join(r.data + b"\n" for r in records if one_per_line(r.data)))
        # The scaler's own tool: the simulator belongs to the scaler, and the CLI may not
        # import a service.
        command = [
            sys.executable,
            "-m",
            "services.scaler.simulation.whatif",
            "--events",
            str(recorded),
            "--pools",
            str(pools),
            "--since",
            start.isoformat(),
            "--until",
            end.isoformat(),
            *(["--json"] if as_json else []),
        ]
        result = subprocess.run(command, check=False)
    if result.returncode:
        raise typer.Exit(result.returncode)


async def _consumed_by(bus: JetStreamBus, service: str) -> tuple[type[EventData], ...]:
    """The event types `service`'s consumer takes, from its filter on the server: the CLI
    knows a service only by what the bus says of it."""
    filters = await bus.consumer_filter(service)
    if filters is None:
        known = ", ".join(await bus.durable_consumers()) or "none"
        raise CliError(f"no service consumes as {service!r} (consumers: {known})", 2)
    models = tuple(spec.model for spec in CATALOG.values() if spec.subject(bus.prefix) in filters)
    if not set(replay_subjects_for(service, models, bus.prefix)) <= set(filters):
        msg = f"{service}'s consumer takes no replays yet: restart {service} with this version"
        raise CliError(msg)
    return models


def _tail_line(
    record: StreamRecord, job: str | None, *, output: Output, width: int | None
) -> str | None:
    try:
        event = decode(record.data)
    except InvalidEventError as error:
        if job is not None:
            return None
        return f"{_when(record.stored_at)}  {record.subject}  invalid: {error.reason}"
    if job is not None and getattr(event.data, "job_id", None) != job:
        return None
    if output is Output.JSON:
        line = one_per_line(record.data)
        return None if line is None else line.decode(errors="replace")
    data = event.data.model_dump(mode="json", exclude_defaults=True)
    key = data.pop("job_id", None) or data.pop("node", None) or event.subject or "-"
    return event_line(f"{_when(event.time)}  {type_name(type(event.data))}  {key}", data, width)


def _models(types: Sequence[str] | None) -> tuple[type[EventData], ...]:
    try:
        return event_types(types or ())
    except ValueError as error:
        raise CliError(str(error), 2) from None


def _moment(text: str, flag: str) -> datetime:
    try:
        at = moment(text, now=datetime.now(UTC), flag=flag)
    except ValueError as error:
        raise CliError(str(error), 2) from None
    if at > datetime.now(UTC):
        raise CliError(f"{flag} {text} is in the future", 2)
    return at


def _window(since: str, until: str | None) -> tuple[datetime, datetime]:
    try:
        return window(since, until, now=datetime.now(UTC))
    except ValueError as error:
        raise CliError(str(error), 2) from None


def _note(text: str, *, markup: bool = True) -> None:
    """A line on stderr, never wrapped: scripts read these too."""
    err.print(text, markup=markup, highlight=False, soft_wrap=True)


def _when(at: datetime) -> str:
    return at.astimezone().isoformat(sep=" ", timespec="milliseconds")


def _run(
    action: Callable[[JetStreamBus, asyncio.Event], Awaitable[T]], *, until_stopped: bool = False
) -> T:
    """Connect, act, close; bus errors become one line. An action that runs `until_stopped`
    watches the event that Ctrl-C or SIGTERM sets, and ends cleanly; any other is
    interrupted by Ctrl-C as usual."""

    async def main() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if until_stopped else ()
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        try:
            async with _connected() as bus:
                return await action(bus, stop)
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


@contextlib.asynccontextmanager
async def _connected() -> AsyncIterator[JetStreamBus]:
    settings = BusSettings(connect_timeout_s=3, refused_is_final=True)
    try:
        bus = await JetStreamBus.connect(settings, name="spotrain-events")
    except BusUnavailableError:
        msg = f"the stack is not running (no NATS at {settings.nats_url}); start it: spotrain up"
        raise CliError(msg) from None
    try:
        async with bus.permission_checked("find the event stream"):
            found = await bus.has_stream()
        if not found:
            msg = f"nothing recorded: NATS at {settings.nats_url} has no stream {settings.stream}"
            raise CliError(msg)
        yield bus
    except (nats.errors.Error, TimeoutError, OSError) as error:
        raise CliError(f"reading the bus failed: {_one_line(error)}") from None
    finally:
        with contextlib.suppress(nats.errors.Error, TimeoutError, OSError):
            await bus.close()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
