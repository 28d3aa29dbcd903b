"""What the job commands do (`shared.cli.jobs` declares them): submit, ls, show, logs,
watch, cancel, pools, teams. Imported when one of them runs: it brings the client, the
bus and the event models, which a command's help does without."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from shared import sweep
from shared.cli.console import CliError, duration_s, err, out, print_table, table_width
from shared.cli.tables import Column, Output, ShowOutput, event_line
from shared.client import (
    PlatformError,
    SpotrainClient,
    current_user,
    current_user_is_a_person,
    new_job_id,
)
from shared.events import Event, EventData
from shared.events.data import JobFailed, JobProgress, JobRejected, JobRequested, JobResized
from shared.events.types import Bundle, CapacityClass
from shared.jobs import (
    Attempt,
    AttemptState,
    JobRecord,
    JobState,
    deadline_outlook,
    deadline_refusal,
    span_text,
    steps_lost,
)
from shared.policy.cost import CostRow, Ledger, format_usd, job_costs
from shared.policy.cost.attribution import Charge, NodeLife
from shared.policy.elastic import WorkerRange, is_ray_train_script, most_workers, parse_workers
from shared.policy.teams import team_uses
from shared.pools import PoolsStatus, PoolStatus
from shared.workspace import WorkspaceError

T = TypeVar("T")


def submit(params: Mapping[str, Any]) -> None:
    """What `spotrain submit` does, from its options by name as click parsed them."""
    script, args, wait = params["script"], params["args"], params["wait"]
    workdir = Path(params["workdir"])
    if not workdir.is_dir():
        raise CliError(f"working directory {workdir} does not exist", 2)
    entrypoint = script_entrypoint(script, args or [], workdir)
    if params.get("sweep"):
        submit_sweep(params, script, list(args or []), workdir)
        return
    # The options by name, as click parsed them: the notebook magics build from the same.
    fields = request_fields(params, entrypoint)
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


def sweep_requests(
    params: Mapping[str, Any],
    script: str,
    args: list[str],
    source: str,
    entrypoint_of: Callable[[list[str]], list[str]],
) -> list[JobRequested]:
    """The requests of a sweep, one per point, validated before anything is uploaded: the
    job ids `<base>-<n>`, the experiment (`--experiment`, else the base id), each point's
    values as labels. `source`: the script's text; `entrypoint_of`: the command of a
    point's arguments. A bad sweep is a one-line `CliError`."""
    if params.get("job_id") is not None or params.get("wait"):
        raise CliError("--sweep names its jobs and is followed with watch --experiment", 2)
    try:
        grid = sweep.points(sweep.parse_axes(list(params["sweep"])), args, source)
    except sweep.SweepError as error:
        raise CliError(str(error), 2) from None
    base = new_job_id(entrypoint_of(args))
    experiment = params["experiment"] or base
    requests = []
    for point in grid:
        fields = request_fields(
            {**params, **point.options, "experiment": experiment}, entrypoint_of(list(point.args))
        )
        fields["job_id"] = sweep.point_job_id(base, point.index, len(grid))
        fields["labels"] = {
            **fields["labels"],
            **{f"sweep.{k}": v for k, v in point.values.items()},
        }
        if fields["max_workers"] is not None:
            require_ray_train(script, source, fields)
        requests.append(build_request(fields))
    return requests


def submit_sweep(params: Mapping[str, Any], script: str, args: list[str], workdir: Path) -> None:
    """`spotrain submit --sweep`: every point submitted at once, each answered; prints
    each job id, then a summary, the experiment last."""
    requests = sweep_requests(
        params,
        script,
        args,
        script_source(script, workdir),
        lambda point_args: script_entrypoint(script, point_args, workdir),
    )

    async def go() -> dict[str, Any]:
        async with await SpotrainClient.connect() as client:
            try:
                workspace = await client.upload_workspace(workdir)
            except WorkspaceError as error:
                raise CliError(str(error), 2) from None
            shipped = [r.model_copy(update={"working_dir": workspace}) for r in requests]
            return await client.submit_many(shipped)

    answers = _run(go)
    rejected = {
        job_id: answer.data.detail
        for job_id, answer in answers.items()
        if answer is not None and isinstance(answer.data, JobRejected)
    }
    silent = sum(1 for answer in answers.values() if answer is None)
    for request in requests:
        out.print(request.job_id)
    for job_id, detail in sorted(rejected.items())[:5]:
        err.print(f"rejected {job_id}: {detail}")
    experiment = requests[0].experiment
    err.print(
        f"sweep of {len(requests)}: {len(requests) - len(rejected) - silent} accepted, "
        f"{len(rejected)} rejected, {silent} not answered yet; follow it: spotrain watch "
        f"--experiment {experiment}"
    )
    out.print(experiment)
    if rejected:
        raise typer.Exit(1)


def list_jobs(everyone: bool, output: Output) -> None:
    """What `spotrain ls` does."""

    async def go(
        client: SpotrainClient,
    ) -> tuple[list[JobRecord], dict[str, CostRow], PoolsStatus | None]:
        records, ledger, pools = await asyncio.gather(client.jobs(), client.costs(), client.pools())
        return records, job_costs(ledger), pools

    records, costs, pools = _run(lambda: _with_client(go))
    me = current_user()
    now = datetime.now(UTC)
    shown = [record for record in records if everyone or record.request.owner == me]
    with_deadlines = any(record.request.deadline is not None for record in shown)
    places = {record.job_id: _queue_place(record, pools) for record in shown}
    rows = [
        _job_row(record, costs.get(record.job_id), now) | {"queue": places[record.job_id] or ""}
        for record in shown
    ]
    columns = [
        # Read and copied: the id and the state, whatever the width.
        Column("job"),
        Column("state", style=_state_style),
        # Where a queued job stands (`show` says why it waits).
        *([Column("queue", priority=1)] if any(places.values()) else []),
        Column("cost", priority=1),
        *([Column("deadline", priority=1, style=_late_style)] if with_deadlines else []),
        Column("gpus", priority=2),
        Column("age", priority=2),
        Column("attempt", priority=3),
        Column("capacity", priority=3),
        Column("experiment", priority=4),
        # Mine, unless --all: then whose it is matters as much as its size.
        Column("owner", priority=2 if everyone else 5),
    ]
    as_json = [
        {
            "job": record.job_id,
            "state": record.state.value,
            "attempt": record.current.number if record.current else None,
            "capacity": record.request.capacity.value,
            "gpus": record.gpus,
            "accepted_at": record.accepted_at.isoformat(),
            "cost_usd": float(costs[record.job_id].cost_usd) if record.job_id in costs else None,
            "deadline": record.request.deadline.isoformat() if record.request.deadline else None,
            "experiment": record.request.experiment,
            "owner": record.request.owner,
            "queue": places[record.job_id],
        }
        for record in shown
    ]
    mine = "" if everyone else " of yours (--all for everyone's)"
    print_table(
        columns, rows, output, as_json, empty=f"no jobs{mine}; submit one: spotrain submit train.py"
    )


def _job_row(record: JobRecord, spent: CostRow | None, now: datetime) -> dict[str, str]:
    return {
        "job": record.job_id,
        "state": record.state.value,
        "attempt": str(record.current.number if record.current else "-"),
        "capacity": record.request.capacity.value,
        "gpus": str(record.gpus),
        "age": _age(now - record.accepted_at),
        "cost": format_usd(spent.cost_usd) if spent is not None else "-",
        "deadline": _deadline_cell(record, now),
        "experiment": record.request.experiment or "",
        "owner": record.request.owner,
    }


def show(job_id: str, all_events: bool, output: ShowOutput) -> None:
    """What `spotrain show` does."""

    async def go(
        client: SpotrainClient,
    ) -> tuple[JobRecord | None, list[Any], Ledger, PoolsStatus | None]:
        return await asyncio.gather(
            client.job(job_id), client.history(job_id), client.costs(), client.pools()
        )

    record, history, ledger, pools = _run(lambda: _with_client(go))
    if record is None and not history:
        raise CliError(f"no job {job_id}")
    if output is ShowOutput.JSON:
        if record is None:
            raise CliError(f"{job_id} has events but no record (yet)")
        print(record.model_dump_json(indent=2, exclude={"request": {"env"}}))
        return
    charges = [c for c in ledger.attribution.charges if c.job_id == job_id]
    if record is not None:
        for line in describe(record, charges, datetime.now(UTC), queue=pools):
            out.print(line, soft_wrap=True, highlight=False)
    else:
        out.print(f"job: {job_id} (no record: only events)")
    out.print(_cost_line(job_costs(ledger).get(job_id)), highlight=False)
    shown = history if all_events else history[-10:]
    more = "" if len(shown) == len(history) else f" (last {len(shown)}; --events for all)"
    out.print(f"events: {len(history)}{more}", highlight=False)
    width = table_width()
    for event in shown:
        line = _event_line(event, None if width is None else width - 2)
        out.print(f"  {line}", soft_wrap=True, highlight=False, markup=False)


def describe(
    record: JobRecord,
    charges: Sequence[Charge],
    now: datetime,
    *,
    queue: PoolsStatus | None = None,
) -> list[str]:
    """A job as `show` describes it, before its cost and events: one fact a line, then a
    line per attempt (kubectl describe's way). `queue`: the scaler's last status, for where
    a queued attempt stands and why it waits."""
    request = record.request
    lines = [
        f"job: {record.job_id}",
        f"state: {record.state.value}"
        + (f" ({record.waiting_for})" if record.is_active and record.waiting_for else ""),
        *_queue_line(record, queue),
        f"owner: {request.owner}"
        + (f", experiment {request.experiment}" if request.experiment else ""),
        f"asks: {_asks(request)}",
        f"accepted: {record.accepted_at:%Y-%m-%d %H:%M:%S} ({_age(now - record.accepted_at)} ago)",
    ]
    current = record.current
    if request.num_workers > 1 or request.max_workers is not None:
        running = current if current and current.state is AttemptState.RUNNING else None
        lines.append(_workers_line(request, running.workers if running else None))
    if current is not None and current.step is not None:
        lines.append(f"progress: {_progress(current)}")
    if request.deadline is not None:
        lines.append(_deadline_line(record, now))
    if record.state is JobState.FAILED:
        message = record.detail or (current.message if current is not None else None)
        lines.append(f"failed: {failure_line(message or '') or 'no reason given'}")
    lines.append(f"attempts: {len(record.attempts)}")
    by_attempt: dict[int, Fraction] = defaultdict(Fraction)
    for charge in charges:
        if charge.attempt is not None:
            by_attempt[charge.attempt] += charge.cost_usd
    for index, attempt in enumerate(record.attempts):
        after = record.attempts[index + 1] if index + 1 < len(record.attempts) else None
        lines.append("  " + _attempt_line(attempt, after, by_attempt.get(attempt.number)))
    return lines


_ERROR_LINE = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception|Exit|Interrupt)\b.*$|^\s*\w+Error:.*$")


def failure_line(message: str) -> str:
    """The line of a failure's message that says why: the last one naming an exception
    (`ValueError: bad batch size`) in the logs Ray appends, else its last line. Pure."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    return (errors or lines or [""])[-1][:200]


def _queue_place(record: JobRecord, status: PoolsStatus | None) -> str | None:
    """`#3 of 40` for an attempt in the platform's queue, as the scaler last placed it."""
    attempt = record.current
    if status is None or attempt is None or attempt.state is not AttemptState.QUEUED:
        return None
    place = status.place_of(record.job_id, attempt.number)
    return f"#{place.position} of {len(status.queue)}" if place is not None else None


def _queue_line(record: JobRecord, status: PoolsStatus | None) -> list[str]:
    """`queue: #3 of 40: over-budget: ...` for an attempt waiting in the platform's queue."""
    attempt = record.current
    if (
        not record.is_active
        or record.waiting_for is not None
        or attempt is None
        or attempt.state not in (AttemptState.QUEUED, AttemptState.SUBMITTED)
    ):
        return []
    place = status.place_of(record.job_id, attempt.number) if status is not None else None
    if place is None:
        if attempt.state is AttemptState.SUBMITTED:
            return [f"queue: placed on {', '.join(attempt.placed_on)}: Ray is starting it"]
        return ["queue: not seen by the scaler yet (it decides every few seconds)"]
    return [f"queue: #{place.position} of {len(status.queue) if status else 0}: {place.why}"]


def _asks(request: JobRequested) -> str:
    """`2 GPU(s) nvidia-l4 x 2..4 worker(s), spot, priority 5, up to 3 restart(s)`"""
    worker = request.worker
    each = f"{worker.gpus} GPU(s)" if worker.gpus else f"{worker.cpus:g} CPU(s)"
    if worker.gpu_type:
        each += f" {worker.gpu_type}"
    workers = WorkerRange(min=request.num_workers, max=request.max_workers or request.num_workers)
    return (
        f"{each} x {workers} worker(s), {request.capacity.value}, priority {request.priority}, "
        f"up to {request.max_restarts} restart(s)"
    )


def _progress(attempt: Attempt) -> str:
    total = f"/{attempt.total_steps}" if attempt.total_steps else ""
    metrics = "".join(f", {k} {v:.4g}" for k, v in sorted(attempt.metrics.items()))
    running = attempt.state is AttemptState.RUNNING and attempt.eta_s is not None
    eta = f", {eta_text(attempt.eta_s)}" if running else ""
    return f"step {attempt.step}{total}{metrics}{eta}"


def _attempt_line(attempt: Attempt, after: Attempt | None, cost: Fraction | None) -> str:
    """`#2 running on gpu-spot-3 (gpu-spot, spot) 10:02:11-, from step 120, $0.0123`; a
    multi-node attempt's nodes once each, `gpu-spot-4 x2` where two of its workers are."""
    where = _nodes_text(attempt.worker_nodes or attempt.nodes) or "no node yet"
    pool = (
        f" ({attempt.pool}, {attempt.capacity.value})" if attempt.pool and attempt.capacity else ""
    )
    start = attempt.started_at or attempt.submitted_at
    span = f"{start:%H:%M:%S}-{f'{attempt.ended_at:%H:%M:%S}' if attempt.ended_at else ''}"
    parts = [f"#{attempt.number} {attempt.state.value} on {where}{pool} {span}"]
    if attempt.from_step:
        parts.append(f"from step {attempt.from_step}")
    why = attempt.cause or (attempt.give_way if attempt.ended_at is not None else None)
    if why is not None:
        parts.append(f"ended by {why.value}")
    if attempt.give_way_for is not None:
        parts.append(f"gave way to {attempt.give_way_for}")
    lost = steps_lost(attempt, after) if after is not None else None
    if lost is not None:
        parts.append(f"{lost} steps lost")
    if cost is not None:
        parts.append(format_usd(cost))
    return ", ".join(parts)


def _nodes_text(nodes: Sequence[str]) -> str:
    """`gpu-spot-1, gpu-spot-2 x2`: each node once, in order, with its count of workers."""
    counts = Counter(nodes)
    return ", ".join(f"{n} x{counts[n]}" if counts[n] > 1 else n for n in dict.fromkeys(nodes))


def _event_line(event: Event[EventData], width: int | None) -> str:
    """`10:02:11  job.started  submitter  attempt=2 node="gpu-spot-3"`: one line an event,
    its fields cut to `width`."""
    data = event.data.model_dump(
        mode="json", exclude_defaults=True, exclude={"job_id", "entrypoint", "env"}
    )
    kind = event.type.removeprefix("spotrain.").rsplit(".", 1)[0]
    return event_line(f"{event.time:%H:%M:%S}  {kind}  {event.source}", data, width)


def logs(job_id: str, follow: bool, attempt: int | None) -> None:
    """What `spotrain logs` does."""
    record = _run(lambda: _with_client(lambda c: c.job(job_id)))
    if record is None:
        raise CliError(f"no job {job_id}")
    attempts = [a for a in record.attempts if attempt is None or a.number == attempt]
    if not attempts:
        raise CliError(f"{job_id} has no attempt {attempt}")
    unread = []
    for item in attempts[:-1] if follow else attempts:
        # Each attempt on its own: one whose logs Ray cannot give does not hide the others.
        try:
            _print_logs(record, item, len(record.attempts) > 1)
        except CliError as error:
            err.print(f"attempt {item.number}: {error}")
            unread.append(item.number)
    if follow:
        ended = _follow_logs(record, attempts[-1])
        if ended is not JobState.SUCCEEDED:
            # As the job ended: a script waiting on `logs -f` learns its outcome.
            raise typer.Exit(1)
    if unread:
        raise typer.Exit(1)


def ray_dashboard() -> str:
    """Ray's dashboard: SPOTRAIN_RAY_ADDRESS, else the local stack's (its port setting)."""
    address = os.environ.get("SPOTRAIN_RAY_ADDRESS", "").strip()
    if not address:
        from shared.localstack.settings import LocalStackSettings  # noqa: PLC0415  # only here

        address = LocalStackSettings().dashboard_url
    return address.rstrip("/")


def watch(job_id: str | None, experiment: str | None = None) -> None:
    """What `spotrain watch` does: one job's progress, or an experiment's jobs by state."""
    if (job_id is None) == (experiment is None):
        raise CliError("watch takes a JOB_ID or --experiment NAME", 2)
    if experiment is not None:
        code = _run(lambda: _with_client(lambda c: _watch_experiment(c, experiment)))
        if code:
            raise typer.Exit(code)
        return
    assert job_id is not None
    code = _run(lambda: _with_client(lambda c: _watch(c, job_id)))
    if code:
        raise typer.Exit(code)


def running_node(job_id: str) -> str:
    """The node a job's running attempt is on (a worker's, for a multi-node job): the one
    `spotrain preempt --job` takes away."""
    record = _run(lambda: _with_client(lambda c: c.job(job_id)))
    if record is None:
        raise CliError(f"no job {job_id}", 2)
    current = record.current
    nodes = (current.worker_nodes or current.nodes) if current is not None else ()
    if current is None or current.state is not AttemptState.RUNNING or not nodes:
        raise CliError(f"{job_id} has no running attempt on a node ({record.state.value})", 2)
    return nodes[-1]


def cancel(job_id: str) -> None:
    """What `spotrain cancel` does."""
    _run(lambda: _with_client(lambda c: c.cancel(job_id, current_user())))
    out.print(f"cancel requested for {job_id}")


def _advice(row: PoolStatus) -> str:
    """The cloud's forecast of a spot pool: how likely a VM is to be had, and for how long
    most run (`0.9 · 60m`); empty where it gives none."""
    if row.advice is None:
        return ""
    uptime = "" if row.advice.uptime_h is None else f" · {row.advice.uptime_h * 60:.0f}m"
    return f"{row.advice.obtainability:.1f}{uptime}"


def pools(learnt: bool, output: Output) -> None:
    """What `spotrain pools` does."""
    if learnt:
        knowledge = _run(lambda: _with_client(lambda c: c.knowledge()))
        if knowledge is None:
            raise CliError("the scaler has learnt nothing yet; is it running? (spotrain status)")
        print(knowledge.model_dump_json(indent=2))
        return
    status = _run(lambda: _with_client(lambda c: c.pools()))
    if status is None:
        raise CliError("the scaler has not reported yet; is it running? (spotrain status)")
    rows = [
        {
            "pool": row.pool,
            "capacity": row.capacity.value,
            "nodes": str(row.nodes),
            "ready": str(row.ready),
            "gpus_busy": f"{row.gpus_total - row.gpus_free}/{row.gpus_total}",
            "usd_per_hour": f"{row.price_per_hour_usd:.2f}",
            "pending_jobs": str(row.pending_jobs),
            "pending_gpus": str(row.pending_gpus),
            "target": str(row.target),
            "min_max": f"{row.min_nodes}-{row.max_nodes}",
            "taken_back": str(row.taken_back),
            "stock_outs": _stock_outs(row),
            "spot_window": f"{row.outlook.mean_window_h:.1f}h" if row.outlook is not None else "",
            "spot_advice": _advice(row),
        }
        for row in status.pools
    ]
    columns = [
        Column("pool"),
        Column("nodes", priority=1),
        Column("gpus_busy", priority=1),
        Column("pending_jobs", priority=1),
        Column("usd_per_hour", priority=2),
        Column("capacity", priority=2),
        Column("pending_gpus", priority=3),
        Column("target", priority=3),
        Column("stock_outs", priority=3),
        Column("ready", priority=4),
        Column("taken_back", priority=4),
        Column("min_max", priority=5),
        Column("spot_window", priority=5),
        Column("spot_advice", priority=5),
    ]
    print_table(columns, rows, output, [row.model_dump(mode="json") for row in status.pools])
    if output is Output.JSON:
        return
    out.print(
        f"spending ${status.cost_per_hour_usd:.2f}/h of a ${status.budget_per_hour_usd:.2f}/h "
        f"budget; {status.blocked_jobs} job(s) held; as of {status.updated_at:%H:%M:%S}"
    )
    if status.ray_head_away_since is not None:
        out.print(
            f"[bold red]Ray's head is away since {status.ray_head_away_since:%H:%M:%S}: "
            "nothing is placed, grown or released until it is back[/]"
        )


def nodes(output: Output) -> None:
    """What `spotrain pools --nodes` does: the nodes open on the ledger, with their jobs."""

    async def go(client: SpotrainClient) -> tuple[Ledger, list[JobRecord]]:
        return await asyncio.gather(client.costs(), client.jobs())

    ledger, records = _run(lambda: _with_client(go))
    rows = node_rows(ledger.inputs.nodes, records, datetime.now(UTC))
    columns = [
        Column("node"),
        Column("pool", priority=1),
        Column("jobs", priority=1),
        Column("capacity", priority=2),
        Column("gpus", priority=3),
        Column("up", priority=2),
    ]
    if not rows and output is not Output.JSON:
        out.print("no node is up (the scaler starts them for queued jobs)")
        return
    print_table(columns, rows, output, rows)


def node_rows(
    lives: Sequence[NodeLife], records: Sequence[JobRecord], now: datetime
) -> list[dict[str, str]]:
    """A row per node up now (no end on the ledger), with the active jobs on it. Pure."""
    on: dict[str, list[str]] = defaultdict(list)
    for record in records:
        attempt = record.current
        if record.is_active and attempt is not None and attempt.state is AttemptState.RUNNING:
            for node in dict.fromkeys((*attempt.nodes, *attempt.worker_nodes)):
                on[node].append(record.job_id)
    return [
        {
            "node": life.node,
            "pool": life.pool,
            "capacity": life.capacity.value,
            "gpus": str(life.gpus),
            "up": _age(now - life.start),
            "jobs": ", ".join(on.get(life.node, [])) or "-",
        }
        for life in sorted(lives, key=lambda life: life.node)
        if life.end is None
    ]


def teams(as_json: bool, output: Output) -> None:
    """What `spotrain teams` does."""
    status = _run(lambda: _with_client(lambda c: c.teams()))
    if status is None:
        raise CliError(
            "no teams: the submitter runs without a teams file (SPOTRAIN_TEAMS_FILE), or has "
            "not reported yet"
        )
    rows = team_uses(status)
    if as_json:
        output = Output.JSON
    columns = [
        Column("team"),
        Column("held", priority=1),
        Column("guaranteed", priority=1),
        Column("spent_budget", priority=1),
        Column("waiting_jobs", priority=2),
        Column("may_borrow", priority=2),
        Column("borrowed", priority=3),
        Column("lent", priority=3),
        Column("capacity", priority=4),
        Column("members", priority=4),
    ]
    table_rows = [
        {
            "team": row.team,
            "capacity": row.capacity.value,
            "members": str(row.members),
            "guaranteed": str(row.guaranteed_gpus),
            "may_borrow": str(row.borrow_gpus),
            "held": str(row.held_gpus),
            "borrowed": str(row.borrowed_gpus),
            "lent": str(row.lent_gpus),
            "waiting_jobs": str(row.waiting_jobs) if row.waiting_jobs else "",
            "spent_budget": _money(row.spent_usd, row.monthly_budget_usd),
        }
        for row in rows
    ]
    print_table(
        columns,
        table_rows,
        output,
        [row.model_dump(mode="json") for row in rows],
        empty="the teams file names no team",
    )
    if output is Output.JSON:
        return
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
    running = f", {now} now" if now is not None else ""
    if not workers.elastic:
        return f"workers: {workers}{running} (a gang: all or none)"
    more = workers.max - workers.min
    return f"workers: {workers}{running} (a gang of {workers.min}, {more} more as capacity allows)"


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


async def _watch_experiment(
    client: SpotrainClient, experiment: str, interval_s: float = 2.0
) -> int:
    """A line each time the experiment's jobs change: how many in each state, until all
    ended; exit 1 if any failed."""
    said = ""
    while True:
        records = [r for r in await client.jobs() if r.request.experiment == experiment]
        if not records:
            raise PlatformError(f"no jobs of experiment {experiment}")
        counts = Counter(record.state.value for record in records)
        line = f"{experiment}: {len(records)} jobs: " + ", ".join(
            f"{counts[state]} {state}" for state in sorted(counts)
        )
        if line != said:
            out.print(line)
            said = line
        if all(not record.is_active for record in records):
            return 1 if counts.get("failed") else 0
        await asyncio.sleep(interval_s)


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


def _print_logs(record: JobRecord, attempt: Attempt, headed: bool) -> str:
    text = _logs_of(record, attempt)
    if headed:
        out.print(f"[bold]── attempt {attempt.number} ({attempt.submission_id}) ──[/]")
    _write_raw(text)
    return text


def _write_raw(text: str) -> None:
    """Logs as they are, straight to stdout: through rich, 10 MB took 12 s to print."""
    out.file.flush()
    sys.stdout.write(text)
    sys.stdout.flush()


def _follow_logs(record: JobRecord, attempt: Attempt) -> JobState | None:
    """Print the running attempt's logs as they come, and the next attempt's; the state
    the job ended in."""
    job_id = record.job_id
    shown = 0
    while True:
        text = _logs_of(record, attempt)
        _write_raw(text[shown:])
        shown = len(text)
        found = _run(lambda: _with_client(lambda c: c.job(job_id)))
        if found is None or not found.is_active or found.current is None:
            return found.state if found is not None else None
        record = found
        if record.current is not None and record.current.submission_id != attempt.submission_id:
            attempt, shown = record.current, 0
        time.sleep(1)


def _logs_of(record: JobRecord, attempt: Attempt) -> str:
    """An attempt's output: a person asks the desk (Ray's job API is the submitter's, and
    answers every job's); a role's credential reads Ray's dashboard, with the stack's Ray
    token where it has one. What Ray no longer has (a head back without its state, a head
    away) is read from what the platform kept beside the job's checkpoints."""
    job_id = record.job_id
    if current_user_is_a_person():
        found = _run(lambda: _with_client(lambda c: c.attempt_logs(job_id, attempt.number)))
        return found or ""
    try:
        text = _ray_logs(ray_dashboard(), attempt.submission_id)
    except CliError:
        kept = _kept_logs(record, attempt)
        if kept is None:
            raise
        return kept
    return text or _kept_logs(record, attempt) or ""


def _kept_logs(record: JobRecord, attempt: Attempt) -> str | None:
    """The end of the attempt's output as its launcher kept it in the job's store."""
    if record.checkpoint_uri is None:
        return None
    from shared.checkpoints import read_attempt_log  # noqa: PLC0415  # only `logs` reads it

    try:
        return read_attempt_log(record.checkpoint_uri, attempt.number)
    except (OSError, ValueError):
        return None


def _ray_logs(dashboard: str, submission_id: str) -> str:
    url = f"{dashboard}/api/jobs/{submission_id}/logs"
    request = urllib.request.Request(url, headers=ray_token_headers())  # noqa: S310  # Ray's
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310  # the Ray dashboard
            return str(json.load(response).get("logs", ""))
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return ""
        if error.code == 401:
            msg = (
                f"Ray's dashboard at {dashboard} wants its token: set RAY_AUTH_TOKEN_PATH "
                "(the secure local stack's is <its home>/ray-auth/token)"
            )
            raise CliError(msg) from None
        raise CliError(f"Ray answered {error.code} for the logs of {submission_id}") from None
    except OSError as error:
        raise CliError(f"cannot reach Ray's dashboard at {dashboard}: {error}") from None


def ray_token_headers() -> dict[str, str]:
    """Ray's token for its dashboard: `RAY_AUTH_TOKEN`, the file `RAY_AUTH_TOKEN_PATH`
    names, else the local stack's own when this user may read it (its owner)."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if not token:
        from shared.localstack.settings import LocalStackSettings  # noqa: PLC0415  # only here

        where = Path(path) if path else LocalStackSettings().ray_token_file
        with contextlib.suppress(OSError):
            token = where.read_text(encoding="utf-8").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def _cost_line(spent: CostRow | None) -> str:
    if spent is None:
        return "cost so far: $0 (no node-seconds attributed to it yet)"
    # Two lines, each within 80 columns: `show` does not wrap a line (it stays whole for grep).
    return (
        f"cost so far: {format_usd(spent.cost_usd)}, {float(spent.gpu_hours):.2f} GPU-hours, "
        f"{format_usd(spent.waste_usd)} of it lost to preemptions\n"
        f"saved: {format_usd(spent.saving_vs_on_demand_usd)} against on-demand"
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
        return "met" if outlook.on_track else "missed"
    left = span_text(max(outlook.left_s, 0))
    if outlook.on_track is None:
        return left
    return left if outlook.on_track else f"{left} late"


def _late_style(cell: str) -> str | None:
    return "red" if cell == "missed" or cell.endswith(" late") else None


_STATE_COLOURS = {"succeeded": "green", "failed": "red", "rejected": "red", "running": "cyan"}


def _state_style(state: str) -> str:
    return _STATE_COLOURS.get(state, "yellow")


def _age(delta: Any) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
