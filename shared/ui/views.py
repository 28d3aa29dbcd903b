"""What the web page shows, from what the platform records: pure functions from job records,
their events, the cost ledger and the scaler's status to rows and chart options. No I/O.

The figures come from the functions the CLI prints with (`job_costs`, `cost_rows`,
`format_usd`, `steps_lost`, `PoolsStatus.place_of`), so the page and `spotrain show` or
`spotrain cost` never disagree. Charts are ECharts options built here, as data: the page's
script only hands them to the library.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from shared.desk import HIDDEN_OWNER
from shared.events import Event, EventData
from shared.events.data import (
    JobCheckpointed,
    JobInterrupted,
    JobProgress,
    JobResumed,
    NodePreempting,
)
from shared.jobs import Attempt, AttemptState, JobRecord, JobState, steps_lost
from shared.policy.cost import CostRow, Ledger, format_usd
from shared.policy.cost.attribution import Charge, NodeLife
from shared.policy.cost.ledger import JobInfo
from shared.pools import PoolsStatus

PAGE_SIZE = 50
"""Jobs a page of the list shows: the list is paged on the server, whatever the store holds."""

MOST_CHART_POINTS = 2_000
"""Points a metric's line keeps per attempt: a long run's reports are thinned evenly (its
first and last kept), so a chart of a week-long job loads as fast as a short one's."""

Filter = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[\w.@:+-]+$")]


class JobFilter(BaseModel):
    """The jobs list's filters, from the page's address (`?owner=alice&state=running`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    owner: Filter | None = None
    team: Filter | None = None
    experiment: Filter | None = None
    state: JobState | None = None
    page: Annotated[int, Field(ge=1, le=100_000)] = 1

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> JobFilter | str:
        """The filter, or one line saying what is wrong with the address (never raises)."""
        given = {key: value for key, value in query.items() if value != ""}
        try:
            return cls.model_validate(given)
        except ValidationError as error:
            return filter_problem(error)

    def admits(self, record: JobRecord) -> bool:
        request = record.request
        return (
            (self.owner is None or request.owner == self.owner)
            and (self.team is None or record.team == self.team)
            and (self.experiment is None or request.experiment == self.experiment)
            and (self.state is None or record.state is self.state)
        )

    def query(self, **changes: object) -> str:
        """The address's query for this filter with `changes` (`page=2`): for links."""
        fields = self.model_dump(mode="json") | changes
        if fields.get("page") == 1:
            fields.pop("page")
        return "&".join(f"{key}={value}" for key, value in fields.items() if value is not None)


def filter_problem(error: ValidationError) -> str:
    """`state: must be one of queued, running, ...` for the first field the address got wrong."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "filter"
    if first["type"] == "extra_forbidden":
        return f"unknown filter {field!r}: use owner, team, experiment, state or page"
    if field == "state":
        return f"state must be one of {', '.join(s.value for s in JobState)}"
    return f"{field}: {first['msg'].lower()}"


@dataclass(frozen=True)
class JobRow:
    """One job in the list, as `spotrain ls` shows it, with why it waits."""

    job_id: str
    state: str
    waits: str
    attempt: str
    gpus: int
    capacity: str
    cost: str
    owner: str
    team: str
    experiment: str
    accepted_at: datetime
    deadline: datetime | None
    eta_s: float | None


@dataclass(frozen=True)
class JobsPage:
    rows: tuple[JobRow, ...]
    matching: int
    page: int
    pages: int


def job_row(record: JobRecord, spent: CostRow | None, pools: PoolsStatus | None) -> JobRow:
    current = record.current
    running = current is not None and current.state is AttemptState.RUNNING
    return JobRow(
        job_id=record.job_id,
        state=record.state.value,
        waits=waits_text(record, pools),
        attempt=str(current.number) if current else "-",
        gpus=record.gpus,
        capacity=(record.capacity_of(current) if current else record.request.capacity).value,
        cost=format_usd(spent.cost_usd) if spent is not None else "-",
        owner=record.request.owner,
        team=record.team or "",
        experiment=record.request.experiment or "",
        accepted_at=record.accepted_at,
        deadline=record.request.deadline,
        eta_s=current.eta_s if running and current is not None else None,
    )


def waits_text(record: JobRecord, pools: PoolsStatus | None) -> str:
    """`#3 of 40: no spot room` for an attempt in the platform's queue; its team's quota
    for a job not admitted yet; empty for a job that does not wait."""
    if not record.is_active:
        return ""
    if record.waiting_for is not None:
        return record.waiting_for
    attempt = record.current
    if attempt is None or attempt.state is not AttemptState.QUEUED:
        return ""
    place = pools.place_of(record.job_id, attempt.number) if pools is not None else None
    if place is None:
        return "not placed by the scaler yet"
    return f"#{place.position} of {len(pools.queue) if pools else 0}: {place.why}"


def jobs_page(
    records: Iterable[JobRecord],
    costs: Mapping[str, CostRow],
    pools: PoolsStatus | None,
    wanted: JobFilter,
) -> JobsPage:
    """The jobs the filter admits, newest first, one page of them as rows."""
    matching = sorted(
        (record for record in records if wanted.admits(record)),
        key=lambda record: (record.accepted_at, record.job_id),
        reverse=True,
    )
    pages = max(1, -(-len(matching) // PAGE_SIZE))
    page = min(wanted.page, pages)
    shown = matching[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    return JobsPage(
        rows=tuple(job_row(r, costs.get(r.job_id), pools) for r in shown),
        matching=len(matching),
        page=page,
        pages=pages,
    )


def seen_by(ledger: Ledger, visible: Collection[str]) -> Ledger:
    """The ledger as one person sees it: the jobs they may not read are one alias
    (`others`, no owner or experiment of theirs), as the records desk bills them, so the
    totals still add up and nothing of another team is named."""
    charges = tuple(
        charge
        if charge.job_id is None or charge.job_id in visible
        else replace(charge, job_id=HIDDEN_OWNER, attempt=None)
        for charge in ledger.attribution.charges
    )
    jobs = {job_id: info for job_id, info in ledger.inputs.jobs.items() if job_id in visible}
    jobs[HIDDEN_OWNER] = JobInfo(HIDDEN_OWNER, owner=HIDDEN_OWNER, experiment=HIDDEN_OWNER)
    holds = tuple(hold for hold in ledger.inputs.holds if hold.job_id in visible)
    return replace(
        ledger,
        inputs=replace(ledger.inputs, jobs=jobs, holds=holds),
        attribution=replace(ledger.attribution, charges=charges),
    )


# --- one job ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptView:
    """One attempt on the job page's timeline, as `spotrain show` lists it."""

    number: int
    state: str
    nodes: str
    pool: str
    capacity: str
    started_at: datetime | None
    ended_at: datetime | None
    ended_by: str
    from_step: int
    last_step: int | None
    steps_lost: int | None
    cost: str


@dataclass(frozen=True)
class JobCost:
    cost: str
    gpu_hours: str
    waste: str
    saving: str


def attempt_views(record: JobRecord, charges: Sequence[Charge]) -> list[AttemptView]:
    by_attempt: dict[int, Fraction] = defaultdict(Fraction)
    for charge in charges:
        if charge.job_id == record.job_id and charge.attempt is not None:
            by_attempt[charge.attempt] += charge.cost_usd
    views = []
    for index, attempt in enumerate(record.attempts):
        after = record.attempts[index + 1] if index + 1 < len(record.attempts) else None
        why = attempt.cause or (attempt.give_way if attempt.ended_at is not None else None)
        views.append(
            AttemptView(
                number=attempt.number,
                state=attempt.state.value,
                nodes=nodes_text(attempt.worker_nodes or attempt.nodes or attempt.placed_on),
                pool=attempt.pool or "",
                capacity=record.capacity_of(attempt).value,
                started_at=attempt.started_at,
                ended_at=attempt.ended_at,
                ended_by=why.value if why is not None else "",
                from_step=attempt.from_step,
                last_step=attempt.step,
                steps_lost=steps_lost(attempt, after) if after is not None else None,
                cost=format_usd(by_attempt[attempt.number])
                if attempt.number in by_attempt
                else "-",
            )
        )
    return views


def job_cost(spent: CostRow | None) -> JobCost:
    """The job's cost as `spotrain show` says it (`cost so far`, `lost to preemptions`, `saved`)."""
    if spent is None:
        return JobCost(cost="$0", gpu_hours="0.00", waste="$0", saving="$0")
    return JobCost(
        cost=format_usd(spent.cost_usd),
        gpu_hours=f"{float(spent.gpu_hours):.2f}",
        waste=format_usd(spent.waste_usd),
        saving=format_usd(spent.saving_vs_on_demand_usd),
    )


def nodes_text(nodes: Sequence[str]) -> str:
    """`gpu-spot-1, gpu-spot-2 x2`: each node once, in order, with its count of workers."""
    counts = Counter(nodes)
    return ", ".join(f"{n} x{counts[n]}" if counts[n] > 1 else n for n in dict.fromkeys(nodes))


@dataclass(frozen=True)
class StoryLine:
    """One moment of a job's story: `10:02:11 resumed: attempt 2 from step 120`."""

    at: datetime
    kind: str
    text: str


STORY_KINDS = {
    "requested",
    "accepted",
    "rejected",
    "queued",
    "started",
    "checkpointed",
    "interrupted",
    "resumed",
    "moved",
    "resized",
    "succeeded",
    "failed",
    "cancel_requested",
    "cancelled",
}
"""The events a job's story tells; its progress reports are the chart, not lines."""


def story(history: Iterable[Event[EventData]]) -> list[StoryLine]:
    lines = []
    for event in history:
        kind = event.type.removeprefix("spotrain.").rsplit(".", 1)[0].split(".", 1)[-1]
        if kind not in STORY_KINDS:
            continue
        data = event.data.model_dump(
            mode="json",
            exclude_defaults=True,
            exclude={"job_id", "entrypoint", "env", "working_dir", "bundles", "request"},
        )
        text = ", ".join(f"{key} {_short(value)}" for key, value in data.items())
        lines.append(StoryLine(at=event.time, kind=kind, text=text))
    return lines


def _short(value: object, most: int = 80) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= most else text[: most - 1] + "…"


@dataclass(frozen=True)
class MetricPoint:
    attempt: int
    step: int
    value: float


def metric_names(history: Iterable[Event[EventData]]) -> list[str]:
    """The metrics the job's training reported, `loss` first when there is one."""
    names = {
        name
        for event in history
        if isinstance(event.data, JobProgress)
        for name in event.data.metrics
    }
    return sorted(names, key=lambda name: (name != "loss", name))


def metric_points(history: Iterable[Event[EventData]], metric: str) -> list[MetricPoint]:
    return [
        MetricPoint(attempt=e.data.attempt, step=e.data.step, value=e.data.metrics[metric])
        for e in history
        if isinstance(e.data, JobProgress) and metric in e.data.metrics
    ]


def thinned(points: Sequence[MetricPoint], most: int = MOST_CHART_POINTS) -> list[MetricPoint]:
    """At most `most` of the points, evenly, the first and the last kept."""
    if len(points) <= most:
        return list(points)
    stride = (len(points) - 1) / (most - 1)
    return [points[round(i * stride)] for i in range(most)]


LOST_COLOUR = "rgba(220, 53, 69, 0.15)"
PREEMPTED_COLOUR = "#dc3545"
RESUMED_COLOUR = "#198754"


def metric_chart(
    record: JobRecord, history: Sequence[Event[EventData]], metric: str
) -> dict[str, Any]:
    """The training metric against steps, one line per attempt; a lost attempt's end marked
    where its node went, the next attempt's start where it resumed, and the steps run again
    in between shaded (the waste of the preemption)."""
    by_attempt: dict[int, list[MetricPoint]] = defaultdict(list)
    for point in metric_points(history, metric):
        by_attempt[point.attempt].append(point)
    checkpoints: dict[int, list[int]] = defaultdict(list)
    for event in history:
        if isinstance(event.data, JobCheckpointed):
            checkpoints[event.data.attempt].append(event.data.step)
    series = []
    for index, attempt in enumerate(record.attempts):
        after = record.attempts[index + 1] if index + 1 < len(record.attempts) else None
        points = thinned(sorted(by_attempt.get(attempt.number, []), key=lambda p: p.step))
        series.append(
            {
                "name": f"attempt {attempt.number}",
                "type": "line",
                "showSymbol": False,
                "data": [[p.step, p.value] for p in points],
                **_marks(attempt, after),
            }
        )
    reported = any(s["data"] for s in series)
    return {
        "animation": False,
        "title": {
            "show": not reported,
            "text": "no metric reported yet",
            "left": "center",
            "top": "middle",
            "textStyle": {"color": "#6c757d", "fontSize": 14, "fontWeight": "normal"},
        },
        "tooltip": {"trigger": "axis"},
        "legend": {"top": 0},
        "grid": {"left": 60, "right": 30, "top": 40, "bottom": 40},
        "xAxis": {"type": "value", "name": "step", "nameLocation": "middle", "nameGap": 25},
        "yAxis": {"type": "value", "name": metric, "scale": True},
        "series": series,
    }


def _marks(attempt: Attempt, after: Attempt | None) -> dict[str, Any]:
    """markLine and markArea of a series: where this attempt was lost, where the next resumed."""
    if after is None or attempt.state is not AttemptState.LOST or attempt.step is None:
        return {}
    lost = steps_lost(attempt, after) or 0
    cause = attempt.cause.value if attempt.cause is not None else "lost"
    lines = [
        {
            "xAxis": attempt.step,
            "name": f"{cause}: attempt {attempt.number} at step {attempt.step}",
            "lineStyle": {"color": PREEMPTED_COLOUR},
            "label": {
                "formatter": f"{cause} #{attempt.number}",
                "color": PREEMPTED_COLOUR,
                "position": "insideEndTop",
            },
        },
        {
            "xAxis": after.from_step,
            "name": f"resumed: attempt {after.number} from step {after.from_step}",
            "lineStyle": {"color": RESUMED_COLOUR, "type": "dashed"},
            "label": {
                "formatter": f"resumed #{after.number}",
                "color": RESUMED_COLOUR,
                "position": "insideStartTop",
            },
        },
    ]
    marks: dict[str, Any] = {
        "markLine": {"symbol": "none", "silent": False, "data": lines},
    }
    if lost:
        marks["markArea"] = {
            "itemStyle": {"color": LOST_COLOUR},
            "label": {"position": "insideBottom", "color": PREEMPTED_COLOUR},
            "data": [
                [
                    {"xAxis": after.from_step, "name": f"{lost} steps lost"},
                    {"xAxis": attempt.step},
                ]
            ],
        }
    return marks


ATTEMPT_COLOURS = {
    AttemptState.SUCCEEDED.value: "#198754",
    AttemptState.RUNNING.value: "#0d6efd",
    AttemptState.LOST.value: "#dc3545",
    AttemptState.FAILED.value: "#6f42c1",
}
WAITING_COLOUR = "#adb5bd"


def timeline_chart(
    record: JobRecord, history: Sequence[Event[EventData]], now: datetime
) -> dict[str, Any]:
    """Each attempt on a time axis: waiting (grey, from its submission) then running (its
    outcome's colour) on its nodes; notices, losses, checkpoints and resumes as points."""
    rows = [
        f"#{a.number} {nodes_text(a.worker_nodes or a.nodes) or 'no node'}" for a in record.attempts
    ]
    series: list[dict[str, Any]] = []
    for row, attempt in zip(rows, record.attempts, strict=True):
        end = attempt.ended_at or now
        started = attempt.started_at
        where = f"{attempt.pool or '-'}, {record.capacity_of(attempt).value}"
        series.append(
            _bar(f"{row} waiting", row, attempt.submitted_at, started or end, WAITING_COLOUR)
        )
        if started is not None:
            colour = ATTEMPT_COLOURS.get(attempt.state.value, WAITING_COLOUR)
            series.append(_bar(f"{row} {attempt.state.value} ({where})", row, started, end, colour))
    marks = _moments(record, rows, history)
    if marks:
        series.append(
            {
                "name": "moments",
                "type": "scatter",
                "symbolSize": 12,
                "data": marks,
                "label": {"show": True, "position": "top", "formatter": "{b}"},
                "tooltip": {"formatter": "{b}"},
            }
        )
    return {
        "animation": False,
        "tooltip": {"trigger": "item"},
        "grid": {"left": 170, "right": 30, "top": 20, "bottom": 40},
        "xAxis": {"type": "time"},
        "yAxis": {"type": "category", "data": rows, "inverse": True},
        "series": series,
    }


def _bar(name: str, row: str, start: datetime, end: datetime, colour: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "line",
        "symbol": "none",
        "lineStyle": {"width": 14, "color": colour, "cap": "butt"},
        "itemStyle": {"color": colour},
        "data": [[start.isoformat(), row], [end.isoformat(), row]],
        "tooltip": {"formatter": name},
    }


def _moments(
    record: JobRecord, rows: Sequence[str], history: Sequence[Event[EventData]]
) -> list[dict[str, Any]]:
    row_of = {a.number: row for a, row in zip(record.attempts, rows, strict=True)}
    node_rows: dict[str, str] = {}
    for attempt, row in zip(record.attempts, rows, strict=True):
        for node in attempt.worker_nodes or attempt.nodes:
            node_rows[node] = row
    moments = []
    for event in history:
        data = event.data
        at = event.time.isoformat()
        if isinstance(data, JobCheckpointed) and data.attempt in row_of:
            moments.append(_moment(at, row_of[data.attempt], f"checkpoint {data.step}", "#6c757d"))
        elif isinstance(data, JobInterrupted) and data.attempt in row_of:
            moments.append(
                _moment(at, row_of[data.attempt], f"lost: {data.cause.value}", PREEMPTED_COLOUR)
            )
        elif isinstance(data, JobResumed) and data.attempt in row_of:
            moments.append(
                _moment(at, row_of[data.attempt], f"resumed from {data.from_step}", RESUMED_COLOUR)
            )
        elif isinstance(data, NodePreempting) and data.node in node_rows:
            moments.append(_moment(at, node_rows[data.node], f"notice: {data.node}", "#fd7e14"))
    return moments


def _moment(at: str, row: str, name: str, colour: str) -> dict[str, Any]:
    return {"name": name, "value": [at, row], "itemStyle": {"color": colour}}


# --- experiments, pools and teams ---------------------------------------------------------


def cost_bars(rows: Sequence[CostRow], title: str) -> dict[str, Any]:
    """Spend, waste and saving against on-demand per row (experiment, owner, team), in $."""
    names = [row_name(row) for row in rows]
    return {
        "animation": False,
        "title": {"text": title, "left": 0, "textStyle": {"fontSize": 14}},
        "tooltip": {"trigger": "axis", "axisPointer": {"type": "shadow"}},
        "legend": {"top": 0, "right": 0},
        "grid": {"left": 60, "right": 20, "top": 40, "bottom": 60},
        "xAxis": {"type": "category", "data": names, "axisLabel": {"rotate": 20}},
        "yAxis": {"type": "value", "name": "$"},
        "series": [
            _bar_series("spent", [row.cost_usd - row.waste_usd for row in rows], "#0d6efd", "usd"),
            _bar_series(
                "lost to preemptions", [row.waste_usd for row in rows], PREEMPTED_COLOUR, "usd"
            ),
            _bar_series(
                "saved vs on-demand",
                [row.saving_vs_on_demand_usd for row in rows],
                RESUMED_COLOUR,
                None,
            ),
        ],
    }


def row_name(row: CostRow) -> str:
    """A cost row's label: its key, `idle gpu-spot` for a pool's idle capacity."""
    if row.idle_pool is not None:
        return f"idle {row.idle_pool}"
    return row.key or "(none)"


def team_rows(ledger: Ledger, records: Iterable[JobRecord]) -> list[CostRow]:
    """The charges of the jobs in `records`, per team (`(none)` on a platform without
    teams), the most expensive first; idle capacity is no team's."""
    team_of = {record.job_id: record.team or "(none)" for record in records}
    rows: dict[str, CostRow] = {}
    for charge in ledger.attribution.charges:
        if charge.job_id is None or charge.job_id not in team_of:
            continue
        team = team_of[charge.job_id]
        rows[team] = rows.get(team, CostRow(key=team)).plus(charge)
    return sorted(rows.values(), key=lambda row: (-row.cost_usd, row.key or ""))


def experiment_of(record: JobRecord) -> str:
    return record.request.experiment or "(none)"


def owner_of(record: JobRecord) -> str:
    return record.request.owner


def _bar_series(
    name: str, values: Sequence[Fraction], colour: str, stack: str | None
) -> dict[str, Any]:
    return {
        "name": name,
        "type": "bar",
        **({"stack": stack} if stack else {}),
        "itemStyle": {"color": colour},
        "data": [round(float(value), 4) for value in values],
    }


def spend_over_time(
    points: Sequence[tuple[datetime, Mapping[str, float]]], title: str
) -> dict[str, Any]:
    """Cumulative spend per key (experiment, owner, team) at each moment, one line a key."""
    keys = sorted({key for _, spent in points for key in spent})
    return {
        "animation": False,
        "title": {"text": title, "left": 0, "textStyle": {"fontSize": 14}},
        "tooltip": {"trigger": "axis"},
        "legend": {"top": 0, "right": 0, "type": "scroll"},
        "grid": {"left": 60, "right": 20, "top": 40, "bottom": 40},
        "xAxis": {"type": "time"},
        "yAxis": {"type": "value", "name": "$"},
        "series": [
            {
                "name": key,
                "type": "line",
                "showSymbol": False,
                "data": [
                    [at.isoformat(), round(float(spent.get(key, 0)), 4)] for at, spent in points
                ],
            }
            for key in keys
        ],
    }


def sweep_chart(
    records: Sequence[JobRecord], costs: Mapping[str, CostRow], metric: str
) -> dict[str, Any]:
    """A sweep's points side by side: each job's last reported metric and its cost."""
    shown = sorted(records, key=lambda r: r.job_id)
    last = [
        next((a.metrics[metric] for a in reversed(r.attempts) if metric in a.metrics), None)
        for r in shown
    ]
    return {
        "animation": False,
        "tooltip": {"trigger": "axis", "axisPointer": {"type": "shadow"}},
        "legend": {"top": 0, "right": 0},
        "grid": {"left": 60, "right": 60, "top": 40, "bottom": 80},
        "xAxis": {
            "type": "category",
            "data": [r.job_id for r in shown],
            "axisLabel": {"rotate": 30},
        },
        "yAxis": [{"type": "value", "name": metric, "scale": True}, {"type": "value", "name": "$"}],
        "series": [
            {"name": metric, "type": "bar", "data": last},
            {
                "name": "cost",
                "type": "line",
                "yAxisIndex": 1,
                "data": [
                    round(float(costs[r.job_id].cost_usd), 4) if r.job_id in costs else 0
                    for r in shown
                ],
            },
        ],
    }


def nodes_over_time(
    lives: Iterable[NodeLife],
    now: datetime,
    take_backs: Sequence[tuple[str, datetime]] = (),
    stock_outs: Sequence[tuple[str, datetime]] = (),
) -> dict[str, Any]:
    """Nodes held per pool over time (a step line a pool), from the ledger's node lives;
    the nodes the cloud took back and the growths it refused marked where they happened."""
    changes: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for life in lives:
        changes[life.pool].append((life.start, 1))
        if life.end is not None:
            changes[life.pool].append((life.end, -1))
    series: list[dict[str, Any]] = []
    for pool, moves in sorted(changes.items()):
        count = 0
        data = []
        for at, move in sorted(moves, key=lambda m: (m[0], m[1])):
            count += move
            data.append([at.isoformat(), count])
        data.append([now.isoformat(), count])
        series.append(
            {"name": pool, "type": "line", "step": "end", "showSymbol": False, "data": data}
        )
    for name, moments, symbol, colour in (
        ("taken back", take_backs, "triangle", PREEMPTED_COLOUR),
        ("stock-out", stock_outs, "diamond", "#fd7e14"),
    ):
        if moments:
            series.append(
                {
                    "name": name,
                    "type": "scatter",
                    "symbol": symbol,
                    "symbolSize": 12,
                    "itemStyle": {"color": colour},
                    "data": [
                        {"value": [at.isoformat(), 0], "name": f"{name}: {pool}"}
                        for pool, at in moments
                    ],
                }
            )
    return {
        "animation": False,
        "title": {"text": "nodes by pool", "left": 0, "textStyle": {"fontSize": 14}},
        "tooltip": {"trigger": "item"},
        "legend": {"top": 0, "right": 0},
        "grid": {"left": 50, "right": 20, "top": 40, "bottom": 40},
        "xAxis": {"type": "time"},
        "yAxis": {"type": "value", "name": "nodes", "minInterval": 1},
        "series": series,
    }
