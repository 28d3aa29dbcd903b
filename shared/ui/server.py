"""The web page's server (aiohttp): pages rendered from the board (Jinja2), fragments the
page fetches again when the server says something changed (htmx over server-sent events),
and chart options as JSON (ECharts draws them). The board is fed from the stream here.

Every page is rendered for one viewer, and offers only what they may do: cancel appears on
their own jobs only, as `spotrain cancel` allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import jinja2
from aiohttp import web

from shared.clock import Clock
from shared.cost import GroupBy, Ledger
from shared.cost.report import format_usd
from shared.events import Event, EventData
from shared.jobs import JobRecord, JobState
from shared.logs import deferred_logger
from shared.pools import NodeSightings, PoolsStatus, billed_up_to
from shared.teams import TeamsStatus, team_uses
from shared.ui import views
from shared.ui.board import Board, spend_points

log = deferred_logger()

HERE = Path(__file__).parent

HEARTBEAT_S = 15.0
"""A comment on each open event stream this often: a client gone is found and let go."""

LIST_COALESCE_S = 0.2
"""Changes to the list within this are sent as one: a burst of 1,000 events is one fetch."""


class Platform(Protocol):
    """What the page reads and does, beside the events it follows: the client's calls."""

    async def jobs(self) -> list[JobRecord]: ...
    async def job(self, job_id: str) -> JobRecord | None: ...
    async def pools(self) -> PoolsStatus | None: ...
    async def teams(self) -> TeamsStatus | None: ...
    async def sightings(self) -> NodeSightings | None: ...
    async def cancel(self, job_id: str, requested_by: str) -> None: ...


class AttemptLogs(Protocol):
    async def __call__(self, submission_id: str) -> str | None:
        """What the attempt printed, as Ray keeps it; None when Ray cannot be asked."""
        ...


@dataclass
class Changes:
    """Who hears what changed: each open event stream has a queue of job ids."""

    queues: set[asyncio.Queue[str]]

    def tell(self, job_id: str) -> None:
        for queue in self.queues:
            queue.put_nowait(job_id)


class Page:
    """The server's state: the board, what it reads from and how it renders."""

    def __init__(
        self,
        board: Board,
        platform: Platform,
        clock: Clock,
        viewer: str,
        logs: AttemptLogs,
    ) -> None:
        self.board = board
        self.platform = platform
        self.clock = clock
        self.viewer = viewer
        self.logs = logs
        self.changes = Changes(queues=set())
        self.pools: PoolsStatus | None = None
        self.teams: TeamsStatus | None = None
        self.sightings: NodeSightings | None = None
        self.ready = asyncio.Event()
        """Whether the board holds what the stream held at start: the page serves then."""
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["clock"] = _clock
        self.templates.filters["eta"] = _eta
        self.templates.globals["usd"] = format_usd

    # --- feeding the board ----------------------------------------------------------------

    async def load(self) -> None:
        """Every record, and the scaler's and submitter's latest views, as they are now."""
        for record in await self.platform.jobs():
            self.board.put_record(record)
        await self.refresh_views()

    async def refresh_views(self) -> None:
        pools, teams, sightings = await asyncio.gather(
            self.platform.pools(), self.platform.teams(), self.platform.sightings()
        )
        if sightings != self.sightings:
            self.board.touch()  # the open nodes are billed up to their new sightings
        self.pools, self.teams, self.sightings = pools, teams, sightings

    async def take(self, event: Event[EventData]) -> None:
        """One event from the stream: on the board, the job's record read again, and the
        page's open streams told."""
        job_id = self.board.add(event)
        if job_id is None:
            return
        record = await self.platform.job(job_id)
        if record is not None:
            self.board.put_record(record)
        self.changes.tell(job_id)

    def ledger(self) -> Ledger:
        return self.board.ledger(self.clock.now(), billed_up_to(self.sightings))

    def render(self, template: str, http_status: int = 200, **values: Any) -> web.Response:
        body = self.templates.get_template(template).render(viewer=self.viewer, **values)
        return web.Response(text=body, status=http_status, content_type="text/html")

    def problem(self, message: str, status: int) -> web.Response:
        return self.render("problem.html", http_status=status, message=message)

    def readable(self, job_id: str) -> JobRecord | None:
        return self.board.records.get(job_id)

    def may_cancel(self, record: JobRecord) -> bool:
        return (
            record.is_active and not record.cancel_requested and record.request.owner == self.viewer
        )


def _clock(moment: datetime | None) -> str:
    return f"{moment.astimezone():%Y-%m-%d %H:%M:%S}" if moment is not None else ""


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{timedelta(seconds=round(seconds))}"


# --- routes -------------------------------------------------------------------------------

PAGE = web.AppKey("page", Page)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def app(page: Page) -> web.Application:
    application = web.Application(middlewares=[_no_stack_traces])
    application[PAGE] = page
    routes = [
        web.get("/", _home),
        web.get("/jobs", jobs),
        web.get("/jobs/rows", job_rows),
        web.get("/jobs/{job_id}", job),
        web.get("/jobs/{job_id}/summary", job_summary),
        web.get("/jobs/{job_id}/metric.json", job_metric),
        web.get("/jobs/{job_id}/timeline.json", job_timeline),
        web.get("/jobs/{job_id}/logs", job_logs),
        web.post("/jobs/{job_id}/cancel", cancel),
        web.get("/experiments", experiments),
        web.get("/experiments/{chart}.json", experiments_chart),
        web.get("/pools", pools),
        web.get("/pools/nodes.json", pools_chart),
        web.get("/events", events),
        web.get("/healthz", _ok),
        web.get("/favicon.ico", _no_content),
    ]
    application.add_routes(routes)
    application.router.add_static("/static", HERE / "static", append_version=True)
    return application


async def _home(_: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/jobs")


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _no_content(_: web.Request) -> web.Response:
    return web.Response(status=204)


@web.middleware
async def _no_stack_traces(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Whatever goes wrong, the viewer gets a page saying so in one line, never a trace."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status >= 400 and error.status != 405:
            return _page(request).problem(error.reason or "not found", error.status)
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as error:  # the viewer's page: one line, and the log has the rest
        log.exception("ui.failed", path=request.path)
        return _page(request).problem(f"the page failed: {type(error).__name__}", 500)


def _page(request: web.Request) -> Page:
    return request.app[PAGE]


def _filter(request: web.Request) -> views.JobFilter:
    wanted = views.JobFilter.from_query(request.query)
    if isinstance(wanted, str):
        raise web.HTTPBadRequest(reason=wanted)
    return wanted


async def jobs(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    wanted = _filter(request)
    return page.render("jobs.html", listing=_listing(page, wanted), wanted=wanted, **_choices(page))


async def job_rows(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    wanted = _filter(request)
    return page.render("_job_rows.html", listing=_listing(page, wanted), wanted=wanted)


def _listing(page: Page, wanted: views.JobFilter) -> views.JobsPage:
    costs = page.board.job_costs(page.ledger())
    return views.jobs_page(page.board.records.values(), costs, page.pools, wanted)


def _choices(page: Page) -> dict[str, Any]:
    records = page.board.records.values()
    return {
        "owners": sorted({r.request.owner for r in records}),
        "teams": sorted({r.team for r in records if r.team}),
        "experiments": sorted({r.request.experiment for r in records if r.request.experiment}),
        "states": [s.value for s in JobState],
    }


def _record(request: web.Request) -> JobRecord:
    job_id = request.match_info["job_id"]
    record = _page(request).readable(job_id)
    if record is None:
        raise web.HTTPNotFound(reason=f"no job {job_id[:100]} that you may see")
    return record


async def job(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    record = _record(request)
    history = page.board.history(record.job_id)
    metrics = views.metric_names(history)
    metric = request.query.get("metric") or (metrics[0] if metrics else "")
    if metrics and metric not in metrics:
        raise web.HTTPBadRequest(
            reason=f"no metric {metric[:64]!r}: it reported {', '.join(metrics)}"
        )
    return page.render(
        "job.html", record=record, metrics=metrics, metric=metric, **_summary(page, record)
    )


async def job_summary(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    record = _record(request)
    return page.render("_job_summary.html", record=record, **_summary(page, record))


def _summary(page: Page, record: JobRecord) -> dict[str, Any]:
    ledger = page.ledger()
    charges = [c for c in ledger.attribution.charges if c.job_id == record.job_id]
    return {
        "row": views.job_row(record, page.board.job_costs(ledger).get(record.job_id), page.pools),
        "attempts": views.attempt_views(record, charges),
        "cost": views.job_cost(page.board.job_costs(ledger).get(record.job_id)),
        "story": views.story(page.board.history(record.job_id)),
        "may_cancel": page.may_cancel(record),
    }


async def job_metric(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    record = _record(request)
    history = page.board.history(record.job_id)
    metric = request.query.get("metric") or next(iter(views.metric_names(history)), "")
    return web.json_response(views.metric_chart(record, history, metric))


async def job_timeline(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    record = _record(request)
    history = page.board.history(record.job_id)
    return web.json_response(views.timeline_chart(record, history, page.clock.now()))


async def job_logs(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    record = _record(request)
    attempt = record.current
    text = None
    if attempt is not None:
        with contextlib.suppress(OSError, TimeoutError):
            text = await page.logs(attempt.submission_id)
    if text is None:
        text = "Ray keeps no output for this attempt (not started, or its head is gone)."
    tail = "\n".join(text.splitlines()[-200:])
    return page.render("_logs.html", tail=tail, attempt=attempt)


async def cancel(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    # Only the page's own script asks (htmx sends this header; a form from another site
    # cannot), so no other site can make a viewer's browser cancel their job.
    if request.headers.get("HX-Request") != "true":
        raise web.HTTPForbidden(reason="cancel from the job's page")
    record = _record(request)
    if not page.may_cancel(record):
        raise web.HTTPForbidden(reason=f"{record.job_id} is not yours to cancel")
    await page.platform.cancel(record.job_id, page.viewer)
    return page.render("_cancel_asked.html", record=record)


async def experiments(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    ledger = page.ledger()
    experiment = request.query.get("experiment")
    rows = page.board.rows(ledger, GroupBy.EXPERIMENT)
    sweep = None
    if experiment:
        sweep = [r for r in page.board.records.values() if r.request.experiment == experiment]
        if not sweep:
            raise web.HTTPNotFound(reason=f"no experiment {experiment[:100]} that you may see")
    return page.render(
        "experiments.html",
        rows=rows,
        owners=page.board.rows(ledger, GroupBy.OWNER),
        experiment=experiment,
        sweep=sorted(sweep or [], key=lambda r: r.job_id),
        costs=page.board.job_costs(ledger),
    )


CHARTS = ("experiments", "owners", "teams", "spend-experiments", "spend-owners", "sweep")


async def experiments_chart(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    chart = request.match_info["chart"]
    ledger = page.ledger()
    records = list(page.board.records.values())
    if chart == "experiments":
        return web.json_response(
            views.cost_bars(page.board.rows(ledger, GroupBy.EXPERIMENT), "per experiment")
        )
    if chart == "owners":
        return web.json_response(
            views.cost_bars(page.board.rows(ledger, GroupBy.OWNER), "per owner")
        )
    if chart == "teams":
        return web.json_response(views.cost_bars(views.team_rows(ledger, records), "per team"))
    if chart in {"spend-experiments", "spend-owners"}:
        key = views.experiment_of if chart == "spend-experiments" else views.owner_of
        keys = {r.job_id: key(r) for r in records}
        points = await asyncio.to_thread(spend_points, ledger, keys)
        return web.json_response(views.spend_over_time(points, "spend over time"))
    if chart == "sweep":
        experiment = request.query.get("experiment", "")
        chosen = [r for r in records if r.request.experiment == experiment]
        metric = request.query.get("metric") or "loss"
        return web.json_response(views.sweep_chart(chosen, page.board.job_costs(ledger), metric))
    raise web.HTTPNotFound(reason=f"no chart {chart[:64]}")


async def pools(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    await page.refresh_views()
    return page.render(
        "pools.html",
        status=page.pools,
        uses=team_uses(page.teams) if page.teams is not None else [],
    )


async def pools_chart(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    ledger = page.ledger()
    board = page.board
    return web.json_response(
        views.nodes_over_time(
            ledger.inputs.nodes, page.clock.now(), board.take_backs, board.stock_outs
        )
    )


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `job` when the job this page shows changed (`?job=`), `jobs`
    when any did (coalesced), and a comment now and then to find a client gone."""
    page = _page(request)
    only = request.query.get("job")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    queue: asyncio.Queue[str] = asyncio.Queue()
    page.changes.queues.add(queue)
    try:
        async for name in _changes(queue, only):
            await response.write(name.encode())
    except (ConnectionResetError, ConnectionError):
        pass  # the viewer closed the page: nothing to answer
    finally:
        page.changes.queues.discard(queue)
    return response


async def _changes(queue: asyncio.Queue[str], only: str | None) -> AsyncIterator[str]:
    while True:
        try:
            job_id = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
        except TimeoutError:
            yield ": still here\n\n"
            continue
        if only is not None:
            if job_id == only:
                yield f"event: job\ndata: {json.dumps(job_id)}\n\n"
            continue
        await asyncio.sleep(LIST_COALESCE_S)
        while not queue.empty():
            queue.get_nowait()
        yield f"event: jobs\ndata: {json.dumps(job_id)}\n\n"
