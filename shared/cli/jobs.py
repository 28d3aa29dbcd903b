"""The job commands: submit, ls, show, logs, watch, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

from shared.cli.console import CliError, err, out
from shared.client import PlatformError, SpotrainClient, current_user, new_job_id
from shared.cost import CostRow, format_usd, job_costs
from shared.elastic import WorkerRange, is_ray_train_script, most_workers, parse_workers
from shared.events import Event, EventData
from shared.events.data import JobFailed, JobProgress, JobRejected, JobRequested, JobResized
from shared.events.types import Bundle, CapacityClass
from shared.jobs import JobRecord, deadline_outlook, deadline_refusal, span_text
from shared.pools import PoolsStatus, PoolStatus
from shared.teams import team_uses
from shared.workspace import WorkspaceError

T = TypeVar("T")
_DURATION = re.compile(r"^(\d+)([smh]?)$")


def register_job_commands(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": True})(submit)
    app.command(name="ls")(list_jobs)
    app.command()(show)
    app.command()(logs)
    app.command()(watch)
    app.command()(cancel)
    app.command()(pools)
    app.command()(teams)


def submit(  # noqa: PLR0917  # a typer command: its options are its parameters
    context: typer.Context,
    script: Annotated[
        str, typer.Argument(help="A .py file in the working directory, or a command.")
    ],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the script, after --.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs per worker.")] = 0,
    workers: Annotated[
        str,
        typer.Option(
            help="Workers (nodes) for a multi-node job: N, or MIN..MAX for a Ray Train script "
            "that goes on with fewer when a node goes and grows back when capacity returns."
        ),
    ] = "1",
    cpus: Annotated[float, typer.Option(help="CPUs per worker.")] = 1.0,
    memory_gb: Annotated[float, typer.Option(help="Memory per worker, GB.")] = 0.0,
    gpu_type: Annotated[str | None, typer.Option(help="e.g. nvidia-l4.")] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot capacity only.")] = False,
    on_demand: Annotated[
        bool, typer.Option("--on-demand", help="On-demand capacity only.")
    ] = False,
    any_capacity: Annotated[
        bool, typer.Option("--any", help="Spot first, on-demand as fallback (default).")
    ] = False,
    priority: Annotated[int, typer.Option(min=0, max=9)] = 5,
    max_restarts: Annotated[int, typer.Option(min=0)] = 3,
    checkpoint_every: Annotated[str | None, typer.Option(help="e.g. 10m, 1h.")] = None,
    experiment: Annotated[str | None, typer.Option()] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
    env: Annotated[list[str] | None, typer.Option(help="NAME=VALUE, repeatable.")] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            help="ENVVAR=SECRET, repeatable: the attempt gets the platform's secret SECRET "
            "as ENVVAR (a file of ~/.spotrain/secrets locally, a key of the chart's "
            "Secret on GKE); its value never enters the bus, a record or a log."
        ),
    ] = None,
    pip: Annotated[list[str] | None, typer.Option(help="A pip requirement, repeatable.")] = None,
    workdir: Annotated[Path, typer.Option(help="Folder packed and shipped with the job.")] = Path(),
    job_id: Annotated[
        str | None, typer.Option(help="Defaults to the script name + a suffix.")
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Follow the job to its end; exit 1 if it fails.")
    ] = False,
    deadline: Annotated[
        str | None,
        typer.Option(
            help="When the result is needed, an ISO time (local time if it names no zone), "
            "e.g. 2026-12-02T09:00: spot or on-demand is chosen so that it ends before."
        ),
    ] = None,
    within: Annotated[
        str | None, typer.Option(help="The deadline as a duration from now: 12h, 90m.")
    ] = None,
    estimate: Annotated[
        str | None,
        typer.Option(help="Expected run time, uninterrupted (6h), until the job says its pace."),
    ] = None,
    max_hours: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Stop the job after this many hours of running; a team with a budget "
            "admits it at GPUs x price x these hours.",
        ),
    ] = None,
) -> None:
    """Submit a training job; prints its id on the last line."""
    if not workdir.is_dir():
        raise CliError(f"working directory {workdir} does not exist", 2)
    entrypoint = script_entrypoint(script, args or [], workdir)
    # The options by name, as click parsed them: the notebook magics build from the same.
    fields = request_fields(context.params, entrypoint)
    if fields["max_workers"] is not None:
        require_ray_train(script, script_source(script, workdir), fields)
    # Validate before anything is uploaded: a bad value costs nothing.
    request = build_request(fields)
    if request.deadline is not None:
        # The submitter refuses it too (any tool may publish); here it costs no upload.
        refusal = deadline_refusal(
            now=datetime.now(UTC), deadline=request.deadline, estimate_s=request.estimate_s
        )
        if refusal is not None:
            raise CliError(f"refused: {refusal}", 2)

    asked = request

    async def go() -> int:
        async with await SpotrainClient.connect() as client:
            if asked.num_workers > 1:
                _refuse_a_gang_no_pool_holds(asked, await client.pools())
            try:
                fields["working_dir"] = await client.upload_workspace(workdir)
            except WorkspaceError as error:
                raise CliError(str(error), 2) from None
            request = build_request(fields)
            answer = await client.submit(request)
            if answer is None:
                err.print("[yellow]the submitter has not answered yet; the request is queued[/]")
            elif isinstance(answer.data, JobRejected):
                raise CliError(f"rejected: {answer.data.detail}")
            if wait:
                return await _follow(client, request.job_id)
            return 0

    code = _run(go)
    out.print(fields["job_id"])
    if code:
        raise typer.Exit(code)


def list_jobs(
    everyone: Annotated[
        bool, typer.Option("--all", help="Everyone's jobs, not only mine.")
    ] = False,
) -> None:
    """My jobs: state, attempt, capacity, GPUs, age."""

    async def go(client: SpotrainClient) -> tuple[list[JobRecord], dict[str, CostRow]]:
        return await client.jobs(), job_costs(await client.costs())

    records, costs = _run(lambda: _with_client(go))
    me = current_user()
    now = datetime.now(UTC)
    shown = [record for record in records if everyone or record.request.owner == me]
    with_deadlines = any(record.request.deadline is not None for record in shown)
    rows = [
        (
            record.job_id,
            _state(record),
            str(record.current.number if record.current else "-"),
            record.request.capacity.value,
            str(record.gpus),
            _age(now - record.accepted_at),
            format_usd(costs[record.job_id].cost_usd) if record.job_id in costs else "-",
            *([_deadline_cell(record, now)] if with_deadlines else []),
            record.request.experiment or "",
            record.request.owner,
        )
        for record in shown
    ]
    table = Table()
    columns: tuple[str, ...] = ("job", "state", "attempt", "capacity", "GPUs", "age", "cost")
    columns += ("deadline",) if with_deadlines else ()
    # Job, state and cost are what users read and copy: never cut them on a narrow terminal;
    # the other columns give way first.
    for index, name in enumerate((*columns, "experiment", "owner")):
        keep = name in ("job", "state", "cost")
        widest = max((len(row[index]) for row in rows), default=0)
        table.add_column(name, no_wrap=keep, min_width=max(widest, len(name)) if keep else None)
    for row in rows:
        table.add_row(*row)
    out.print(table)


def show(job_id: str) -> None:
    """The whole record of a job and its event history."""

    async def go(client: SpotrainClient) -> tuple[JobRecord | None, list[Any], CostRow | None]:
        record, history = await client.job(job_id), await client.history(job_id)
        return record, history, job_costs(await client.costs()).get(job_id)

    record, history, spent = _run(lambda: _with_client(go))
    if record is None and not history:
        raise CliError(f"no job {job_id}")
    if record is not None:
        out.print_json(record.model_dump_json(exclude={"request": {"env"}}))
    out.print(_cost_line(spent))
    if record is not None and (
        record.request.num_workers > 1 or record.request.max_workers is not None
    ):
        current = record.current
        out.print(_workers_line(record.request, current.workers if current else None))
    if record is not None and record.is_active and record.waiting_for is not None:
        out.print(f"waiting for quota: {record.waiting_for}")
    if record is not None and record.request.deadline is not None:
        out.print(_deadline_line(record, datetime.now(UTC)))
    table = Table("time", "event", "source", "details")
    for event in history:
        data = event.data.model_dump(mode="json", exclude={"job_id", "entrypoint", "env"})
        table.add_row(
            event.time.strftime("%H:%M:%S"), event.type, event.source, json.dumps(data)[:120]
        )
    out.print(table)


def logs(
    job_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until it ends.")
    ] = False,
    attempt: Annotated[int | None, typer.Option(help="One attempt; all by default.")] = None,
) -> None:
    """The job's logs from Ray, across its attempts."""
    record = _run(lambda: _with_client(lambda c: c.job(job_id)))
    if record is None:
        raise CliError(f"no job {job_id}")
    dashboard = os.environ.get("SPOTRAIN_RAY_ADDRESS", "http://127.0.0.1:8265").rstrip("/")
    attempts = [a for a in record.attempts if attempt is None or a.number == attempt]
    if not attempts:
        raise CliError(f"{job_id} has no attempt {attempt}")
    for item in attempts[:-1] if follow else attempts:
        _print_logs(dashboard, item.submission_id, item.number, len(record.attempts) > 1)
    if follow:
        _follow_logs(dashboard, job_id, attempts[-1].submission_id)


def watch(job_id: str) -> None:
    """A live progress bar: step, loss, ETA, attempts."""
    code = _run(lambda: _with_client(lambda c: _watch(c, job_id)))
    if code:
        raise typer.Exit(code)


def cancel(job_id: str) -> None:
    """Stop a job; its running attempt is stopped in Ray."""
    _run(lambda: _with_client(lambda c: c.cancel(job_id, current_user())))
    out.print(f"cancel requested for {job_id}")


def pools(
    learnt: Annotated[
        bool,
        typer.Option(
            "--learnt",
            help="Print what the scaler has learnt of each pool, as JSON: the file "
            "`spotrain simulate deadline --learnt POOL --knowledge FILE` starts from.",
        ),
    ] = False,
) -> None:
    """Each pool: nodes, busy and free GPUs, price, and the pending demand it can serve."""
    if learnt:
        knowledge = _run(lambda: _with_client(lambda c: c.knowledge()))
        if knowledge is None:
            raise CliError("the scaler has learnt nothing yet; is it running? (spotrain status)")
        print(knowledge.model_dump_json(indent=2))
        return
    status = _run(lambda: _with_client(lambda c: c.pools()))
    if status is None:
        raise CliError("the scaler has not reported yet; is it running? (spotrain status)")
    table = Table(
        "pool", "capacity", "nodes", "ready", "GPUs busy/total", "$/h per node",
        "pending jobs", "pending GPUs", "target", "min-max", "taken back", "stock-outs",
        "spot window",
    )  # fmt: skip
    for row in status.pools:
        table.add_row(
            row.pool,
            row.capacity.value,
            str(row.nodes),
            str(row.ready),
            f"{row.gpus_total - row.gpus_free}/{row.gpus_total}",
            f"{row.price_per_hour_usd:.2f}",
            str(row.pending_jobs),
            str(row.pending_gpus),
            str(row.target),
            f"{row.min_nodes}-{row.max_nodes}",
            str(row.taken_back),
            _stock_outs(row),
            f"{row.outlook.mean_window_h:.1f}h" if row.outlook is not None else "",
        )
    out.print(table)
    out.print(
        f"spending ${status.cost_per_hour_usd:.2f}/h of a ${status.budget_per_hour_usd:.2f}/h "
        f"budget; {status.blocked_jobs} job(s) held; as of {status.updated_at:%H:%M:%S}"
    )


def teams(
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Each team: members, guaranteed and borrowable GPUs, GPUs held, borrowed and lent,
    jobs waiting for quota, budget and spend this month."""
    status = _run(lambda: _with_client(lambda c: c.teams()))
    if status is None:
        raise CliError(
            "no teams: the submitter runs without a teams file (SPOTRAIN_TEAMS_FILE), or has "
            "not reported yet"
        )
    rows = team_uses(status)
    if as_json:
        print(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
        return
    table = Table(
        "team", "capacity", "members", "guaranteed", "may borrow", "held", "borrowed", "lent",
        "waiting jobs", "spent / budget",
    )  # fmt: skip
    for row in rows:
        table.add_row(
            row.team,
            row.capacity.value,
            str(row.members),
            str(row.guaranteed_gpus),
            str(row.borrow_gpus),
            str(row.held_gpus),
            str(row.borrowed_gpus),
            str(row.lent_gpus),
            str(row.waiting_jobs) if row.waiting_jobs else "",
            _money(row.spent_usd, row.monthly_budget_usd),
        )
    out.print(table)
    out.print(f"as of {status.at:%H:%M:%S}")


# --- helpers of the commands above -----------------------------------------------------


def _money(spent: float | None, budget: float | None) -> str:
    if budget is None:
        return "" if spent is None else f"${spent:,.2f}"
    return f"${spent or 0:,.2f} / ${budget:,.2f}"


def _stock_outs(row: PoolStatus) -> str:
    """How many, and whether it is out of capacity now (until when it is left alone)."""
    if row.out_of_capacity_until is None:
        return str(row.stock_outs)
    return f"{row.stock_outs} (out until {row.out_of_capacity_until:%H:%M:%S})"


def request_fields(params: Mapping[str, Any], entrypoint: list[str]) -> dict[str, Any]:
    """A job request's fields from `submit`'s parsed options (click's `params`), shared by
    the CLI and the notebook magics so both speak the same options."""
    spot, on_demand, any_capacity = params["spot"], params["on_demand"], params["any_capacity"]
    if sum((spot, on_demand, any_capacity)) > 1:
        raise CliError("choose one of --spot, --on-demand, --any", 2)
    capacity = (
        CapacityClass.SPOT if spot else CapacityClass.ON_DEMAND if on_demand else CapacityClass.ANY
    )
    every = params["checkpoint_every"]
    estimate = params.get("estimate")
    try:
        workers = parse_workers(str(params["workers"]))
    except ValueError as error:
        raise CliError(str(error), 2) from None
    return {
        "job_id": params["job_id"] or new_job_id(entrypoint),
        "owner": current_user(),
        "experiment": params["experiment"],
        "entrypoint": tuple(entrypoint),
        "worker": {
            "gpus": params["gpus"],
            "cpus": params["cpus"],
            "memory_gb": params["memory_gb"],
            "gpu_type": params["gpu_type"],
        },
        "num_workers": workers.min,
        "max_workers": workers.max if workers.elastic else None,
        "capacity": capacity,
        "priority": params["priority"],
        "max_restarts": params["max_restarts"],
        "checkpoint_interval_s": duration_s(every) if every else None,
        "labels": _pairs(list(params["label"] or []), "--label"),
        "env": _pairs(list(params["env"] or []), "--env"),
        "secrets": _pairs(list(params.get("secret") or []), "--secret"),
        "pip": tuple(params["pip"] or ()),
        "deadline": _deadline(params.get("deadline"), params.get("within"), datetime.now(UTC)),
        "estimate_s": duration_s(estimate) if estimate else None,
        "max_hours": params.get("max_hours"),
    }


def _workers_line(request: JobRequested, now: int | None = None) -> str:
    """The worker count asked for, and `now`, the running attempt's, once it reported."""
    workers = WorkerRange(min=request.num_workers, max=request.max_workers or request.num_workers)
    running = f"; {now} now" if now is not None else ""
    if not workers.elastic:
        return f"workers: {workers} (a gang: all or none{running})"
    return (
        f"workers: {workers} ({workers.min} a gang, up to {workers.max - workers.min} more as "
        f"capacity allows; Ray Train resizes within{running})"
    )


def _refuse_a_gang_no_pool_holds(request: JobRequested, status: PoolsStatus | None) -> None:
    """Before anything is uploaded: MIN workers are a gang, and one that all the pools of
    its capacity could not hold together would wait for ever."""
    if status is None:
        return  # no scaler has reported yet: the submitter and the scaler will say
    most = most_workers(request.worker, request.capacity, status.pools)
    if most is not None and request.num_workers > most:
        kind = "" if request.capacity is CapacityClass.ANY else f"{request.capacity.value} "
        raise CliError(
            f"{request.num_workers} workers of {request.worker.gpus} GPU(s) can never run "
            f"together: the {kind}pools hold at most {most} at their max_nodes",
            2,
        )


def script_source(script: str, workdir: Path) -> str:
    """The text of a `.py` script of the working directory; empty for anything else."""
    path = workdir / script
    return path.read_text(errors="replace") if script.endswith(".py") and path.is_file() else ""


def require_ray_train(script: str, source: str, fields: Mapping[str, Any]) -> None:
    """An elastic range needs a script that Ray Train runs: only it resizes a running job."""
    if not is_ray_train_script(source):
        raise CliError(
            f"--workers {fields['num_workers']}..{fields['max_workers']} needs a Ray Train "
            f"script (a .py file of the working directory that imports ray.train); "
            f"{script} is not one: give it a fixed --workers N",
            2,
        )


def _deadline(at: str | None, within: str | None, now: datetime) -> datetime | None:
    if at is not None and within is not None:
        raise CliError("choose one of --deadline, --within", 2)
    if within is not None:
        return now + timedelta(seconds=duration_s(within))
    if at is None:
        return None
    try:
        return iso_moment(at)
    except ValueError:
        raise CliError(f"--deadline takes an ISO time (2026-12-02T09:00), not {at!r}", 2) from None


def iso_moment(text: str) -> datetime:
    """An ISO time, in local time if it names no zone; a ValueError if it is none."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.astimezone()


def script_entrypoint(script: str, args: list[str], workdir: Path) -> list[str]:
    """`python SCRIPT ARGS` for a Python file (which must be in the working directory),
    else the command as given."""
    if script.endswith(".py"):
        if not (workdir / script).is_file():
            raise CliError(f"{script} not found in {workdir.resolve()}", 2)
        return ["python", script, *args]
    return [script, *args]


def build_request(fields: Mapping[str, Any]) -> JobRequested:
    """The validated request; an invalid field is a one-line `CliError` naming it."""
    try:
        worker = Bundle.model_validate(fields["worker"])
        return JobRequested.model_validate({**fields, "worker": worker}, strict=False)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CliError(f"invalid job: {where}: {first['msg']}", 2) from None


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} takes KEY=VALUE, not {item!r}", 2)
        pairs[key] = value
    return pairs


def duration_s(text: str) -> int:
    match = _DURATION.match(text.strip())
    if match is None:
        raise CliError(f"not a duration: {text!r} (use e.g. 90s, 10m, 2h)", 2)
    value, unit = match.groups()
    return int(value) * {"": 1, "s": 1, "m": 60, "h": 3600}[unit]


def _run(factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await factory()

    return asyncio.run(main())


async def _with_client(action: Callable[[SpotrainClient], Awaitable[T]]) -> T:
    async with await SpotrainClient.connect() as client:
        return await action(client)


async def _follow(client: SpotrainClient, job_id: str) -> int:
    async with contextlib.aclosing(client.follow(job_id)) as events:
        return await _print_until_end(events)


async def _print_until_end(events: AsyncIterator[Event[EventData]]) -> int:
    async for event in events:
        kind = event.type.split(".")[2]
        if isinstance(event.data, JobProgress):
            continue
        err.print(f"[dim]{event.time:%H:%M:%S}[/] {kind}{_resize_text(event.data)}")
        if isinstance(event.data, JobFailed):
            err.print(f"[red]{event.data.message.strip().splitlines()[-1]}[/]")
            return 1
        if isinstance(event.data, JobRejected):
            return 1
    return 0


async def _watch(client: SpotrainClient, job_id: str) -> int:
    if await client.job(job_id) is None:
        raise PlatformError(f"no job {job_id}")
    columns = (
        TextColumn("[bold]{task.fields[job]}[/] attempt {task.fields[attempt]}"),
        BarColumn(),
        TextColumn("step {task.completed:.0f}/{task.total}"),
        TextColumn("{task.fields[metrics]}"),
        # The platform's estimate, from the attempt's own pace: rich's would measure how
        # fast the stored events were read back.
        TextColumn("{task.fields[eta]}"),
        TextColumn("{task.fields[state]}"),
    )
    with Progress(*columns, console=out) as progress:
        task = progress.add_task(
            job_id, total=None, job=job_id, attempt=1, metrics="", eta="", state=""
        )
        async with contextlib.aclosing(client.follow(job_id)) as events:
            return await _show_progress(progress, task, events)


async def _show_progress(
    progress: Progress, task: TaskID, events: AsyncIterator[Event[EventData]]
) -> int:
    async for event in events:
        kind = event.type.split(".")[2]
        fields: dict[str, Any] = {"state": kind}
        if isinstance(event.data, JobProgress):
            metrics = " ".join(f"{k}={v:.4g}" for k, v in sorted(event.data.metrics.items()))
            progress.update(
                task,
                completed=event.data.step,
                total=event.data.total_steps,
                attempt=event.data.attempt,
                metrics=metrics,
                eta=eta_text(event.data.eta_s),
                state="running",
            )
            continue
        if attempt := getattr(event.data, "attempt", None):
            fields["attempt"] = attempt
        if isinstance(event.data, JobResized):
            fields["state"] = f"running{_resize_text(event.data)}"
        progress.update(task, **fields)
        if isinstance(event.data, JobFailed | JobRejected):
            return 1
    return 0


def _resize_text(data: EventData) -> str:
    """`: 4 → 3 workers (shrank)` for a resize; nothing for any other event."""
    if not isinstance(data, JobResized):
        return ""
    if data.previous is None:
        return f": {data.workers} workers"
    lost = f", {data.steps_lost} steps lost" if data.steps_lost else ""
    return f": {data.previous} → {data.workers} workers ({data.reason.value}{lost})"


def eta_text(eta_s: float | None) -> str:
    """`eta 1:02:03` for people; nothing while the pace is not known."""
    if eta_s is None:
        return ""
    minutes, seconds = divmod(round(eta_s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"eta {hours}:{minutes:02d}:{seconds:02d}"


def _print_logs(dashboard: str, submission_id: str, number: int, headed: bool) -> str:
    text = _ray_logs(dashboard, submission_id)
    if headed:
        out.print(f"[bold]── attempt {number} ({submission_id}) ──[/]")
    out.out(text, end="")
    return text


def _follow_logs(dashboard: str, job_id: str, submission_id: str) -> None:
    shown = 0
    while True:
        text = _ray_logs(dashboard, submission_id)
        out.out(text[shown:], end="")
        shown = len(text)
        record = _run(lambda: _with_client(lambda c: c.job(job_id)))
        if record is None or not record.is_active or record.current is None:
            return
        if record.current.submission_id != submission_id:
            submission_id, shown = record.current.submission_id, 0
        time.sleep(1)


def _ray_logs(dashboard: str, submission_id: str) -> str:
    url = f"{dashboard}/api/jobs/{submission_id}/logs"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310  # the Ray dashboard
            return str(json.load(response).get("logs", ""))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return ""
        raise CliError(f"Ray answered {error.code} for the logs of {submission_id}") from None
    except OSError as error:
        raise CliError(f"cannot reach Ray's dashboard at {dashboard}: {error}") from None


def _cost_line(spent: CostRow | None) -> str:
    if spent is None:
        return "cost so far: $0 (no node-seconds attributed to it yet)"
    return (
        f"cost so far: {format_usd(spent.cost_usd)}, {float(spent.gpu_hours):.2f} GPU-hours, "
        f"{format_usd(spent.waste_usd)} of it lost to preemptions, "
        f"{format_usd(spent.saving_vs_on_demand_usd)} saved against on-demand"
    )


def _deadline_line(record: JobRecord, now: datetime) -> str:
    outlook = deadline_outlook(record, now)
    assert outlook is not None  # the caller checked that the job has a deadline
    when = f"deadline: {outlook.deadline.astimezone():%Y-%m-%d %H:%M %Z}"
    if not record.is_active:
        return f"{when}, {'met' if outlook.on_track else 'missed'}"
    left = f"in {span_text(outlook.left_s)}" if outlook.left_s > 0 else "passed"
    if outlook.needed_s is None:
        return f"{when}, {left}; on track: not known yet (no pace reported, no --estimate)"
    needs = f"needs {span_text(outlook.needed_s)} at its {outlook.basis.value}"
    return f"{when}, {left}; {'on track' if outlook.on_track else 'late'}: {needs}"


def _deadline_cell(record: JobRecord, now: datetime) -> str:
    outlook = deadline_outlook(record, now)
    if outlook is None:
        return ""
    if not record.is_active:
        return "met" if outlook.on_track else "[red]missed[/]"
    left = span_text(max(outlook.left_s, 0))
    if outlook.on_track is None:
        return left
    return left if outlook.on_track else f"[red]{left} late[/]"


def _state(record: JobRecord) -> str:
    colours = {"succeeded": "green", "failed": "red", "rejected": "red", "running": "cyan"}
    state = record.state.value
    return f"[{colours.get(state, 'yellow')}]{state}[/]"


def _age(delta: Any) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
