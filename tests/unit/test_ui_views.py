"""What the web page shows (`shared.ui.views`): the list's filters and pages, why a job
waits, a preempted job's chart marks, and figures from the same functions as the CLI's."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.events import Event, EventData, new_event
from shared.events.data import (
    InterruptionCause,
    JobCheckpointed,
    JobInterrupted,
    JobProgress,
    JobRequested,
    JobResumed,
    NodePreempting,
    NoticeSource,
)
from shared.events.types import Bundle, CapacityClass
from shared.jobs import Attempt, AttemptState, JobRecord, JobState
from shared.policy.cost import CostRow, Ledger, format_usd
from shared.policy.cost.attribution import Attribution, Charge, Hold, NodeLife
from shared.policy.cost.ledger import CostInputs
from shared.pools import PoolsStatus, QueuedAttempt
from shared.ui import views
from shared.ui.board import Board, spend_points
from shared.ui.views import JobFilter

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def record(
    job_id: str = "job-1",
    *,
    owner: str = "alice",
    team: str | None = None,
    experiment: str | None = None,
    state: JobState = JobState.RUNNING,
    attempts: tuple[Attempt, ...] = (),
    accepted_s_ago: float = 60,
    waiting_for: str | None = None,
) -> JobRecord:
    return JobRecord(
        request=JobRequested(
            job_id=job_id,
            owner=owner,
            experiment=experiment,
            entrypoint=("python", "train.py"),
            worker=Bundle(gpus=1),
            capacity=CapacityClass.SPOT,
        ),
        request_event_id=f"r-{job_id}",
        state=state,
        accepted_at=NOW - timedelta(seconds=accepted_s_ago),
        updated_at=NOW,
        attempts=attempts,
        team=team,
        waiting_for=waiting_for,
    )


def attempt(number: int, state: AttemptState, **fields: Any) -> Attempt:
    return Attempt(
        number=number,
        submission_id=f"job-1-{number}",
        submitted_at=NOW - timedelta(seconds=300 - 100 * number),
        state=state,
        **fields,
    )


def preempted_job() -> JobRecord:
    """Lost at step 170 on gpu-spot-1, resumed from its checkpoint at 160 on gpu-spot-2."""
    first = attempt(
        1,
        AttemptState.LOST,
        started_at=NOW - timedelta(seconds=190),
        ended_at=NOW - timedelta(seconds=120),
        step=170,
        nodes=("gpu-spot-1",),
        pool="gpu-spot",
        cause=InterruptionCause.NODE_LOST,
    )
    second = attempt(
        2,
        AttemptState.RUNNING,
        started_at=NOW - timedelta(seconds=60),
        step=250,
        from_step=160,
        nodes=("gpu-spot-2",),
        pool="gpu-spot",
    )
    return record(attempts=(first, second))


def event(data: EventData, seconds_ago: float) -> Event[EventData]:
    return new_event(
        data, source="test", time=NOW - timedelta(seconds=seconds_ago), subject="job-1"
    )


def progress(attempt_number: int, step: int, loss: float, seconds_ago: float) -> Event[EventData]:
    return event(
        JobProgress(job_id="job-1", attempt=attempt_number, step=step, metrics={"loss": loss}),
        seconds_ago,
    )


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ({"state": "bogus"}, "state must be one of rejected, queued, running"),
        ({"colour": "red"}, "unknown filter 'colour'"),
        ({"page": "0"}, "page: input should be greater than or equal to 1"),
        ({"page": "two"}, "page: input should be a valid integer"),
        ({"owner": "<script>"}, "owner: string should match pattern"),
        ({"experiment": "x" * 129}, "experiment: string should have at most 128 characters"),
    ],
)
def test_a_malformed_filter_is_one_line_saying_what_is_wrong(
    query: dict[str, str], problem: str
) -> None:
    found = JobFilter.from_query(query)

    assert isinstance(found, str)
    assert found.startswith(problem), found
    assert "\n" not in found


def test_an_empty_field_of_the_filters_form_means_any() -> None:
    found = JobFilter.from_query({"owner": "", "state": "running", "team": ""})

    assert found == JobFilter(state=JobState.RUNNING)
    assert found.query() == "state=running"
    assert found.query(page=2) == "state=running&page=2"


def test_the_list_is_paged_newest_first_and_a_page_past_the_end_is_the_last() -> None:
    records = [record(f"job-{n:03}", accepted_s_ago=n) for n in range(120)]

    first = views.jobs_page(records, {}, None, JobFilter())
    past = views.jobs_page(records, {}, None, JobFilter(page=9))

    assert (first.matching, first.pages, len(first.rows)) == (120, 3, views.PAGE_SIZE)
    assert [row.job_id for row in first.rows[:2]] == ["job-000", "job-001"]
    assert (past.page, [row.job_id for row in past.rows][-1]) == (3, "job-119")


def test_the_filters_admit_by_owner_team_experiment_and_state() -> None:
    records = [
        record("a", owner="alice", team="vision", experiment="sweep"),
        record("b", owner="bob", team="vision", state=JobState.SUCCEEDED),
        record("c", owner="carol", team="speech", experiment="sweep"),
    ]

    def shown(**wanted: Any) -> list[str]:
        rows = views.jobs_page(records, {}, None, JobFilter(**wanted)).rows
        return sorted(r.job_id for r in rows)

    assert shown(team="vision") == ["a", "b"]
    assert shown(experiment="sweep", team="speech") == ["c"]
    assert shown(state=JobState.SUCCEEDED) == ["b"]
    assert shown(owner="dave") == []


def test_a_queued_job_says_its_place_and_why_as_show_does() -> None:
    queued = record(attempts=(attempt(1, AttemptState.QUEUED),), state=JobState.QUEUED)
    status = PoolsStatus(
        updated_at=NOW,
        budget_per_hour_usd=10,
        cost_per_hour_usd=1,
        pools=(),
        blocked_jobs=1,
        queue=(
            QueuedAttempt(job_id="other", attempt=1, position=1, why="next"),
            QueuedAttempt(job_id="job-1", attempt=1, position=2, why="no spot room: stocked out"),
        ),
    )

    assert views.waits_text(queued, status) == "#2 of 2: no spot room: stocked out"
    assert views.waits_text(queued, None) == "not placed by the scaler yet"
    quota = record(waiting_for="team vision's spot quota is taken", state=JobState.QUEUED)
    assert views.waits_text(quota, status) == "team vision's spot quota is taken"
    assert views.waits_text(record(state=JobState.SUCCEEDED), status) == ""


def test_a_preempted_attempt_is_marked_where_it_was_lost_and_where_the_next_resumed() -> None:
    job = preempted_job()
    history = [
        progress(1, 100, 0.5, 150),
        progress(1, 170, 0.4, 121),
        progress(2, 200, 0.35, 40),
        progress(2, 250, 0.3, 10),
    ]

    chart = views.metric_chart(job, history, "loss")

    first, second = chart["series"]
    assert first["data"] == [[100, 0.5], [170, 0.4]]
    assert second["data"] == [[200, 0.35], [250, 0.3]]
    lines = first["markLine"]["data"]
    assert [line["xAxis"] for line in lines] == [170, 160]
    assert lines[0]["name"] == "node-lost: attempt 1 at step 170"
    assert lines[1]["name"] == "resumed: attempt 2 from step 160"
    [[start, end]] = first["markArea"]["data"]
    assert (start["xAxis"], end["xAxis"], start["name"]) == (160, 170, "10 steps lost")
    assert "markLine" not in second


def test_an_attempt_lost_before_it_reported_a_step_is_not_marked() -> None:
    job = preempted_job()
    silent = job.attempts[0].model_copy(update={"step": None})
    job = job.model_copy(update={"attempts": (silent, job.attempts[1])})

    chart = views.metric_chart(job, [], "loss")

    assert "markLine" not in chart["series"][0]


def test_the_metrics_offered_put_loss_first() -> None:
    history = [
        event(JobProgress(job_id="job-1", attempt=1, step=1, metrics={"acc": 0.5, "loss": 1.0}), 9),
        event(JobProgress(job_id="job-1", attempt=1, step=2, metrics={"lr": 0.1}), 8),
    ]

    assert views.metric_names(history) == ["loss", "acc", "lr"]


@given(st.integers(min_value=0, max_value=5_000), st.integers(min_value=2, max_value=300))
def test_a_long_run_is_thinned_evenly_keeping_its_first_and_last_report(
    count: int, most: int
) -> None:
    points = [views.MetricPoint(attempt=1, step=n, value=float(n)) for n in range(count)]

    kept = views.thinned(points, most)

    assert len(kept) == min(count, most)
    if count:
        assert (kept[0], kept[-1]) == (points[0], points[-1])
    assert [p.step for p in kept] == sorted({p.step for p in kept})


def charge(attempt_number: int, usd: str, job_id: str = "job-1") -> Charge:
    return Charge(
        node="gpu-spot-1",
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        job_id=job_id,
        attempt=attempt_number,
        node_seconds=Fraction(60),
        gpu_seconds=Fraction(60),
        cost_usd=Fraction(usd),
        on_demand_usd=Fraction(usd) * 3,
    )


def test_each_attempt_shows_its_nodes_steps_lost_and_cost_as_show_does() -> None:
    job = preempted_job()
    charges = [charge(1, "0.0004"), charge(1, "0.0005"), charge(2, "0.0012"), charge(1, "9", "x")]

    first, second = views.attempt_views(job, charges)

    assert (first.nodes, first.ended_by, first.steps_lost) == ("gpu-spot-1", "node-lost", 10)
    assert first.cost == format_usd(Fraction("0.0009"))
    assert (second.from_step, second.steps_lost, second.cost) == (160, None, "$0.0012")


def test_the_cost_of_a_job_reads_as_show_says_it() -> None:
    row = CostRow(
        key="job-1",
        cost_usd=Fraction("0.0021"),
        gpu_seconds=Fraction(36),
        waste_usd=Fraction("0.0001"),
        on_demand_usd=Fraction("0.0053"),
    )

    assert views.job_cost(row) == views.JobCost(
        cost="$0.0021", gpu_hours="0.01", waste="$0.0001", saving="$0.0032"
    )
    assert views.job_cost(None).cost == "$0"


def test_the_timeline_has_a_row_per_attempt_and_its_moments() -> None:
    job = preempted_job()
    history = [
        event(JobCheckpointed(job_id="job-1", attempt=1, step=160, uri="file:///c/160"), 125),
        event(
            JobInterrupted(
                job_id="job-1", attempt=1, node="gpu-spot-1", cause=InterruptionCause.NODE_LOST
            ),
            120,
        ),
        event(
            JobResumed(
                job_id="job-1", attempt=2, from_step=160, steps_lost=10, capacity=CapacityClass.SPOT
            ),
            119,
        ),
    ]

    chart = views.timeline_chart(job, history, NOW)

    assert chart["yAxis"]["data"] == ["#1 gpu-spot-1", "#2 gpu-spot-2"]
    names = [s["name"] for s in chart["series"]]
    assert "#1 gpu-spot-1 lost (gpu-spot, spot)" in names
    assert "#2 gpu-spot-2 running (gpu-spot, spot)" in names
    [moments] = [s for s in chart["series"] if s["name"] == "moments"]
    assert [(m["name"], m["value"][1]) for m in moments["data"]] == [
        ("checkpoint 160", "#1 gpu-spot-1"),
        ("lost: node-lost", "#1 gpu-spot-1"),
        ("resumed from 160", "#2 gpu-spot-2"),
    ]


def test_spend_per_team_adds_its_jobs_charges() -> None:
    records = [record("a", team="vision"), record("b", team="vision"), record("c")]
    ledger = Ledger(
        inputs=CostInputs(nodes=(), holds=(), jobs={}),
        attribution=Attribution(
            bills=(),
            charges=(charge(1, "1", "a"), charge(1, "2", "b"), charge(1, "4", "c")),
        ),
        start=NOW,
        end=NOW,
    )

    rows = views.team_rows(ledger, records)

    assert [(r.key, int(r.cost_usd)) for r in rows] == [("(none)", 4), ("vision", 3)]


def test_nodes_by_pool_step_with_their_lives_and_mark_take_backs_and_stock_outs() -> None:
    lives = [
        NodeLife(
            node=f"gpu-spot-{n}",
            pool="gpu-spot",
            capacity=CapacityClass.SPOT,
            gpus=1,
            cpus=8,
            price_per_hour_usd=0.3,
            on_demand_price_per_hour_usd=1.0,
            start=NOW - timedelta(seconds=start),
            end=NOW - timedelta(seconds=end) if end is not None else None,
        )
        for n, (start, end) in enumerate([(300, 100), (200, None)])
    ]

    chart = views.nodes_over_time(
        lives,
        NOW,
        take_backs=[("gpu-spot", NOW - timedelta(seconds=100))],
        stock_outs=[("gpu-spot", NOW - timedelta(seconds=50))],
    )

    pool, taken, refused = chart["series"]
    assert [count for _, count in pool["data"]] == [1, 2, 1, 1]
    assert [point["name"] for point in taken["data"]] == ["taken back: gpu-spot"]
    assert [point["name"] for point in refused["data"]] == ["stock-out: gpu-spot"]


def test_the_board_takes_each_event_once_and_never_an_older_record() -> None:
    board = Board()
    job = preempted_job()
    notice = event(
        NodePreempting(
            node="gpu-spot-1",
            pool="gpu-spot",
            deadline=NOW,
            source=NoticeSource.LOCAL,
        ),
        130,
    )
    reported = progress(1, 100, 0.5, 150)

    assert board.add(reported) == "job-1"
    assert board.add(reported) is None
    board.add(notice)
    assert board.put_record(job)
    older = job.model_copy(update={"updated_at": NOW - timedelta(seconds=5), "attempts": ()})
    assert not board.put_record(older)

    assert board.records["job-1"] == job
    assert [e.id for e in board.history("job-1")] == [reported.id, notice.id]


def test_spend_over_time_accrues_each_charge_over_its_attempts_time_to_the_ledgers_total() -> None:
    start = NOW - timedelta(seconds=100)
    holds = (
        Hold(job_id="a", attempt=1, node="n1", gpus=1, cpus=1, start=start, end=NOW),
        Hold(
            job_id="b",
            attempt=1,
            node="n2",
            gpus=1,
            cpus=1,
            start=start,
            end=start + timedelta(seconds=50),
        ),
    )
    ledger = Ledger(
        inputs=CostInputs(nodes=(), holds=holds, jobs={}),
        attribution=Attribution(bills=(), charges=(charge(1, "4", "a"), charge(1, "2", "b"))),
        start=start,
        end=NOW,
    )
    ledger = replace(
        ledger,
        attribution=Attribution(
            bills=(),
            charges=tuple(
                replace(c, node="n1" if c.job_id == "a" else "n2")
                for c in ledger.attribution.charges
            ),
        ),
    )

    points = spend_points(ledger, {"a": "sweep", "b": "other"}, points=3)

    assert [moment for moment, _ in points] == [start, start + timedelta(seconds=50), NOW]
    assert points[0][1] == {}
    assert points[1][1] == pytest.approx({"sweep": 2.0, "other": 2.0})
    assert points[2][1] == pytest.approx({"sweep": 4.0, "other": 2.0})
