"""The web page's server (aiohttp): pages rendered from the board (Jinja2), fragments the
page fetches again when the server says something changed (htmx over server-sent events),
and chart options as JSON (ECharts draws them). The board is fed from the stream here.

Every page is rendered for one viewer. On the local stack that is its owner, who reads
everything (as `spotrain ls --all` does). Behind a cluster's sign-in it is the person the
sign-in names in a header it sets (`viewer_header`): they see their own jobs and their
team's, the rest of the bill as `others`, as the records desk answers them
(`shared.access`), and cancel is offered where the submitter would take it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import jinja2
from aiohttp import web

from shared.access import may_read, who_may_not_cancel
from shared.clock import Clock
from shared.desk import teams_status_for
from shared.events import Event, EventData
from shared.jobs import JobRecord, JobState
from shared.logs import deferred_logger
from shared.policy.cost import GroupBy, Ledger
from shared.policy.cost.report import cost_rows, format_usd, job_costs
from shared.policy.teams import Teams, TeamsStatus, team_uses
from shared.pools import NodeSightings, PoolsStatus, billed_up_to
from shared.ui import views
from shared.ui.board import Board, spend_points

log = deferred_logger()

HERE = Path(__file__).parent

HEARTBEAT_S = 15.0
"""A comment on each open event stream this often: a client gone is found and let go."""

LIST_COALESCE_S = 0.2
"""Changes to the list within this are sent as one: a burst of 1,000 events is one fetch."""


class Platform(Protocol):
    """What the page reads and does, beside the events and the record writes it follows:
    the client's calls."""

    async def jobs(self) -> list[JobRecord]: ...
    async def pools(self) -> PoolsStatus | None: ...
    async def teams(self) -> TeamsStatus | None: ...
    async def sightings(self) -> NodeSightings | None: ...
    async def cancel(self, job_id: str, requested_by: str) -> None: ...


class AttemptLogs(Protocol):
    async def __call__(self, submission_id: str) -> str | None:
        """What the attempt printed, as Ray keeps it; None when Ray cannot be asked."""
        ...


PERSON = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


@dataclass(frozen=True)
class Viewing:
    """Who a page is for, and whether they read everything (the local stack's owner) or
    what `shared.access` lets them."""

    name: str
    everything: bool


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
        *,
        viewer_header: str | None = None,
    ) -> None:
        """`viewer_header`: the header a sign-in proxy in front of the page sets to the
        person signed in; None on the local stack, where every page is `viewer`'s."""
        self.board = board
        self.platform = platform
        self.clock = clock
        self.viewer = viewer
        self.viewer_header = viewer_header
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

    def take(self, event: Event[EventData]) -> None:
        """One event from the stream, on the board; the open streams of its job told."""
        job_id = self.board.add(event)
        if job_id is not None:
            self.changes.tell(job_id)

    def written(self, record: JobRecord) -> None:
        """A job's record as its writer just wrote it to the jobs bucket. The submitter
        publishes a transition's events before it writes the record, so the record a page
        shows comes from here, never from reading the bucket on an event."""
        if self.board.put_record(record):
            self.changes.tell(record.job_id)

    def ledger(self, viewing: Viewing) -> Ledger:
        whole = self.board.ledger(self.clock.now(), billed_up_to(self.sightings))
        if viewing.everything:
            return whole
        return views.seen_by(whole, {r.job_id for r in self.visible(viewing)})

    def viewing(self, request: web.Request) -> Viewing:
        """Whom this request's page is for: the sign-in's person, or the stack's owner."""
        if self.viewer_header is None:
            return Viewing(self.viewer, everything=True)
        person = request.headers.get(self.viewer_header, "")
        if not person:
            header = self.viewer_header
            msg = f"nobody signed in: the page takes who you are from the sign-in's {header}"
            raise web.HTTPUnauthorized(reason=msg)
        if not PERSON.match(person):
            raise web.HTTPBadRequest(
                reason=f"{self.viewer_header} names no person this platform knows"
            )
        return Viewing(person, everything=False)

    def render(
        self, template: str, viewing: Viewing | None, http_status: int = 200, **values: Any
    ) -> web.Response:
        body = self.templates.get_template(template).render(
            viewer=viewing.name if viewing is not None else "", **values
        )
        return web.Response(text=body, status=http_status, content_type="text/html")

    def problem(self, message: str, status: int) -> web.Response:
        return self.render("problem.html", None, http_status=status, message=message)

    def _teams(self) -> Teams | None:
        return self.teams.teams if self.teams is not None else None

    def may_read(self, record: JobRecord, viewing: Viewing) -> bool:
        return viewing.everything or may_read(record, viewing.name, self._teams())

    def visible(self, viewing: Viewing) -> list[JobRecord]:
        records = self.board.records.values()
        return [
            r for r in records if viewing.everything or may_read(r, viewing.name, self._teams())
        ]

    def readable(self, job_id: str, viewing: Viewing) -> JobRecord | None:
        record = self.board.records.get(job_id)
        return record if record is not None and self.may_read(record, viewing) else None

    def may_cancel(self, record: JobRecord, viewing: Viewing) -> bool:
        """Offered where the submitter would take it: its owner's, or its team admins'."""
        return (
            record.is_active
            and not record.cancel_requested
            and who_may_not_cancel(record, viewing.name, self._teams()) is None
        )

    def teams_for(self, viewing: Viewing) -> TeamsStatus | None:
        if self.teams is None or viewing.everything:
            return self.teams
        return teams_status_for(self.teams, viewing.name)


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
    page, viewing = _page(request), _viewing(request)
    wanted = _filter(request)
    return page.render(
        "jobs.html",
        viewing,
        listing=_listing(page, viewing, wanted),
        wanted=wanted,
        **_choices(page.visible(viewing)),
    )


async def job_rows(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    wanted = _filter(request)
    listing = _listing(page, viewing, wanted)
    return page.render("_job_rows.html", viewing, listing=listing, wanted=wanted)


def _viewing(request: web.Request) -> Viewing:
    return _page(request).viewing(request)


def _listing(page: Page, viewing: Viewing, wanted: views.JobFilter) -> views.JobsPage:
    costs = job_costs(page.ledger(viewing))
    return views.jobs_page(page.visible(viewing), costs, page.pools, wanted)


def _choices(records: list[JobRecord]) -> dict[str, Any]:
    return {
        "owners": sorted({r.request.owner for r in records}),
        "teams": sorted({r.team for r in records if r.team}),
        "experiments": sorted({r.request.experiment for r in records if r.request.experiment}),
        "states": [s.value for s in JobState],
    }


def _record(request: web.Request, viewing: Viewing) -> JobRecord:
    job_id = request.match_info["job_id"]
    record = _page(request).readable(job_id, viewing)
    if record is None:
        # The same answer whether it does not exist or is another team's: nothing told.
        raise web.HTTPNotFound(reason=f"no job {job_id[:100]} that you may see")
    return record


async def job(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    record = _record(request, viewing)
    history = page.board.history(record.job_id)
    metrics = views.metric_names(history)
    metric = request.query.get("metric") or (metrics[0] if metrics else "")
    if metrics and metric not in metrics:
        raise web.HTTPBadRequest(
            reason=f"no metric {metric[:64]!r}: it reported {', '.join(metrics)}"
        )
    return page.render(
        "job.html",
        viewing,
        record=record,
        metrics=metrics,
        metric=metric,
        **_summary(page, viewing, record),
    )


async def job_summary(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    record = _record(request, viewing)
    return page.render(
        "_job_summary.html", viewing, record=record, **_summary(page, viewing, record)
    )


def _summary(page: Page, viewing: Viewing, record: JobRecord) -> dict[str, Any]:
    ledger = page.ledger(viewing)
    charges = [c for c in ledger.attribution.charges if c.job_id == record.job_id]
    spent = job_costs(ledger).get(record.job_id)
    return {
        "row": views.job_row(record, spent, page.pools),
        "attempts": views.attempt_views(record, charges),
        "cost": views.job_cost(spent),
        "story": views.story(page.board.history(record.job_id)),
        "may_cancel": page.may_cancel(record, viewing),
    }


async def job_metric(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    record = _record(request, _viewing(request))
    history = page.board.history(record.job_id)
    metric = request.query.get("metric") or next(iter(views.metric_names(history)), "")
    return web.json_response(views.metric_chart(record, history, metric))


async def job_timeline(request: web.Request) -> web.StreamResponse:
    page = _page(request)
    record = _record(request, _viewing(request))
    history = page.board.history(record.job_id)
    return web.json_response(views.timeline_chart(record, history, page.clock.now()))


async def job_logs(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    record = _record(request, viewing)
    attempt = record.current
    text = None
    if attempt is not None:
        with contextlib.suppress(OSError, TimeoutError):
            text = await page.logs(attempt.submission_id)
    if text is None:
        text = "Ray keeps no output for this attempt (not started, or its head is gone)."
    tail = "\n".join(text.splitlines()[-200:])
    return page.render("_logs.html", viewing, tail=tail, attempt=attempt)


async def cancel(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    # Only the page's own script asks (htmx sends this header; a form from another site
    # cannot), so no other site can make a viewer's browser cancel their job.
    if request.headers.get("HX-Request") != "true":
        raise web.HTTPForbidden(reason="cancel from the job's page")
    record = _record(request, viewing)
    if not page.may_cancel(record, viewing):
        raise web.HTTPForbidden(reason=f"{record.job_id} is not yours to cancel")
    await page.platform.cancel(record.job_id, viewing.name)
    return page.render("_cancel_asked.html", viewing, record=record)


async def experiments(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    ledger = page.ledger(viewing)
    experiment = request.query.get("experiment")
    sweep = None
    if experiment:
        sweep = [r for r in page.visible(viewing) if r.request.experiment == experiment]
        if not sweep:
            raise web.HTTPNotFound(reason=f"no experiment {experiment[:100]} that you may see")
    return page.render(
        "experiments.html",
        viewing,
        rows=cost_rows(ledger, GroupBy.EXPERIMENT),
        experiment=experiment,
        sweep=sorted(sweep or [], key=lambda r: r.job_id),
        costs=job_costs(ledger),
    )


async def experiments_chart(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    chart = request.match_info["chart"]
    ledger = page.ledger(viewing)
    records = page.visible(viewing)
    if chart == "experiments":
        rows = cost_rows(ledger, GroupBy.EXPERIMENT)
        return web.json_response(views.cost_bars(rows, "per experiment"))
    if chart == "owners":
        rows = cost_rows(ledger, GroupBy.OWNER)
        return web.json_response(views.cost_bars(rows, "per owner"))
    if chart == "teams":
        return web.json_response(views.cost_bars(views.team_rows(ledger, records), "per team"))
    if chart == "spend-experiments":
        keys = {r.job_id: views.experiment_of(r) for r in records}
        points = await asyncio.to_thread(spend_points, ledger, keys)
        return web.json_response(views.spend_over_time(points, "spend over time"))
    if chart == "sweep":
        experiment = request.query.get("experiment", "")
        chosen = [r for r in records if r.request.experiment == experiment]
        metric = request.query.get("metric") or "loss"
        return web.json_response(views.sweep_chart(chosen, job_costs(ledger), metric))
    raise web.HTTPNotFound(reason=f"no chart {chart[:64]}")


async def pools(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    await page.refresh_views()
    teams = page.teams_for(viewing)
    return page.render(
        "pools.html",
        viewing,
        status=page.pools,
        uses=team_uses(teams) if teams is not None else [],
    )


async def pools_chart(request: web.Request) -> web.StreamResponse:
    page, viewing = _page(request), _viewing(request)
    ledger = page.ledger(viewing)
    board = page.board
    return web.json_response(
        views.nodes_over_time(
            ledger.inputs.nodes, page.clock.now(), board.take_backs, board.stock_outs
        )
    )


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `job` when the job this page shows changed (`?job=`), `jobs`
    when any the viewer may see did (coalesced), and a comment now and then to find a
    client gone. Nothing is said of a job the viewer may not read."""
    page, viewing = _page(request), _viewing(request)
    only = request.query.get("job")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    queue: asyncio.Queue[str] = asyncio.Queue()
    page.changes.queues.add(queue)

    def shown(job_id: str) -> bool:
        record = page.board.records.get(job_id)
        return record is not None and page.may_read(record, viewing)

    try:
        async for name in _changes(queue, only, shown):
            await response.write(name.encode())
    except (ConnectionResetError, ConnectionError):
        pass  # the viewer closed the page: nothing to answer
    finally:
        page.changes.queues.discard(queue)
    return response


async def _changes(
    queue: asyncio.Queue[str], only: str | None, shown: Callable[[str], bool]
) -> AsyncIterator[str]:
    while True:
        try:
            job_id = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
        except TimeoutError:
            yield ": still here\n\n"
            continue
        if not shown(job_id) or (only is not None and job_id != only):
            continue
        if only is not None:
            yield f"event: job\ndata: {json.dumps(job_id)}\n\n"
            continue
        await asyncio.sleep(LIST_COALESCE_S)
        while not queue.empty():
            queue.get_nowait()
        yield f"event: jobs\ndata: {json.dumps(job_id)}\n\n"
