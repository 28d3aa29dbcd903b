"""`spotrain top`: the frame drawn from a snapshot, and the command's answers to bad input and
to a missing bus."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from rich.console import Console

from shared.cli.top import NO_SCALER, TopSnapshot, main_metric, render, shown_jobs
from shared.events.data import JobRequested
from shared.events.types import Bundle, CapacityClass
from shared.jobs import Attempt, AttemptState, JobRecord, JobState
from shared.policy.cost import GroupBy, cost_rows, job_costs, ledger
from shared.pools import PoolsStatus, PoolStatus
from tests.cli import no_bus, spotrain
from tests.unit.test_cost_ledger import NOW_S, Story

STORY = Story()
NOW = STORY.t(NOW_S)
LEDGER = ledger(STORY.events(), now=NOW)


def pool(name: str, **fields: Any) -> PoolStatus:
    values: dict[str, Any] = {
        "pool": name,
        "capacity": CapacityClass.SPOT,
        "price_per_hour_usd": 0.72,
        "nodes": 1,
        "ready": 1,
        "gpus_total": 4,
        "gpus_free": 4,
        "pending_jobs": 0,
        "pending_gpus": 0,
        "target": 1,
        "min_nodes": 0,
        "max_nodes": 4,
    }
    return PoolStatus(**(values | fields))


POOLS = PoolsStatus(
    updated_at=NOW - timedelta(seconds=2),
    budget_per_hour_usd=10.0,
    cost_per_hour_usd=3.2,
    pools=(
        pool("gpu-spot", nodes=2, gpus_free=0, pending_jobs=1, pending_gpus=2, target=3),
        pool("gpu-on-demand", capacity=CapacityClass.ON_DEMAND, price_per_hour_usd=1.8),
    ),
    blocked_jobs=1,
)


def attempt(number: int, **fields: Any) -> Attempt:
    return Attempt(number=number, submission_id=f"sub-{number}", submitted_at=NOW, **fields)


def job(
    job_id: str,
    state: JobState,
    *attempts: Attempt,
    owner: str = "alice",
    experiment: str | None = "exp-1",
    gpus: int = 1,
    age_s: float = 0,
) -> JobRecord:
    request = JobRequested(
        job_id=job_id,
        owner=owner,
        experiment=experiment,
        entrypoint=("python", "train.py"),
        worker=Bundle(gpus=gpus),
    )
    return JobRecord(
        request=request,
        request_event_id=f"r-{job_id}",
        state=state,
        accepted_at=NOW - timedelta(seconds=age_s),
        updated_at=NOW - timedelta(seconds=age_s),
        attempts=attempts,
    )


JOB_A = job(
    "job-a",
    JobState.RUNNING,
    attempt(1, state=AttemptState.LOST, step=60),
    attempt(
        2,
        state=AttemptState.RUNNING,
        step=40,
        total_steps=100,
        metrics={"accuracy": 0.9, "loss": 0.25},
    ),
)
JOB_B = job(
    "job-b",
    JobState.SUCCEEDED,
    attempt(1, state=AttemptState.SUCCEEDED),
    owner="bob",
    experiment="exp-2",
    age_s=600,
)
JOB_Q = job("job-q", JobState.QUEUED, owner="carol", experiment=None, gpus=2, age_s=5)


def snapshot(**fields: Any) -> TopSnapshot:
    values: dict[str, Any] = {
        "taken_at": NOW,
        "pools": POOLS,
        "jobs": (JOB_B, JOB_Q, JOB_A),
        "job_costs": job_costs(LEDGER),
        "experiments": cost_rows(LEDGER, GroupBy.EXPERIMENT),
    }
    return TopSnapshot(**(values | fields))


def text_of(frame: TopSnapshot, *, limit: int = 20) -> str:
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(render(frame, limit=limit))
    return console.export_text()


def row(text: str, first: str) -> list[str]:
    """The cells of the one table row whose first cell is `first`."""
    rows = [
        cells
        for line in text.splitlines()
        if (cells := [cell.strip() for cell in line.split("│")][1:-1]) and cells[0] == first
    ]
    assert len(rows) == 1, text
    return rows[0]


def test_the_header_shows_spend_against_budget_allocation_and_queue() -> None:
    spend, use = text_of(snapshot()).splitlines()[:2]
    assert "12:30:00" in spend
    assert "cost $3.20/h of $10.00/h budget" in spend
    assert "GPUs allocated 4/8 (50%)" in use
    assert "queue 1 jobs / 2 GPUs" in use
    assert "blocked 1" in use
    assert max(len(spend), len(use)) <= 80


def test_the_header_says_since_when_rays_head_is_away_and_what_waits_on_it() -> None:
    assert "head is away" not in text_of(snapshot())
    away = POOLS.model_copy(update={"ray_head_away_since": NOW - timedelta(seconds=75)})
    line = text_of(snapshot(pools=away)).splitlines()[2]
    assert line.startswith(f"Ray's head is away since {NOW - timedelta(seconds=75):%H:%M:%S}")
    assert "1 queued and 1 running jobs wait on it" in line


def test_each_pool_is_a_row_with_its_nodes_gpus_and_demand() -> None:
    text = text_of(snapshot())
    assert row(text, "gpu-spot") == [
        "gpu-spot", "spot", "1/2", "4/4", "1", "2", "3", "0.72",
    ]  # fmt: skip
    assert row(text, "gpu-on-demand") == [
        "gpu-on-demand", "on-demand", "1/1", "0/4", "0", "0", "1", "1.80",
    ]  # fmt: skip


def test_a_running_job_shows_its_step_of_total_its_loss_interruptions_and_cost() -> None:
    assert row(text_of(snapshot()), "job-a") == [
        "job-a",
        "alice",
        "exp-1",
        "running",
        "2",
        "40/100",
        "loss 0.25",
        "1",
        "$0.2100",
    ]


def test_the_step_stands_alone_when_the_total_is_unknown() -> None:
    unknown = JOB_A.model_copy(
        update={
            "attempts": (
                JOB_A.attempts[0],
                JOB_A.attempts[1].model_copy(update={"total_steps": None}),
            )
        }
    )
    assert row(text_of(snapshot(jobs=(unknown,))), "job-a")[5] == "40"


def test_a_job_without_attempts_or_cost_shows_dashes() -> None:
    assert row(text_of(snapshot()), "job-q") == [
        "job-q", "carol", "", "queued", "-", "-", "", "0", "-",
    ]  # fmt: skip


def test_at_80_columns_the_jobs_keep_their_whole_ids_state_step_and_cost() -> None:
    long_id = "train-resnet50-imagenet-sweep-lr-01-7f3a9c"
    frame = snapshot(jobs=(job(long_id, JobState.RUNNING, attempt(1, step=5, total_steps=9)),))
    console = Console(record=True, width=80, file=io.StringIO())
    console.print(render(frame, width=80))
    text = console.export_text()
    [line] = [line for line in text.splitlines() if long_id in line]
    cells = [cell.strip() for cell in line.split("│")][1:-1]
    assert cells[0] == long_id, "the id whole, on one line"
    assert cells[1:] == ["running", "5/9", "", "-"], "state, step, metric, cost; not the rest"
    assert "…" not in text, "no header or cell cut, in any of the three tables"
    assert all(len(line) <= 80 for line in text.splitlines())
    assert row(text, "gpu-spot")[:2] == ["gpu-spot", "spot"], "pools: their name and capacity"
    assert row(text, "(idle gpu-on-demand)")[:2] == ["(idle gpu-on-demand)", "$0.2950"]


def test_at_60_columns_each_table_keeps_what_it_is_about() -> None:
    console = Console(record=True, width=60, file=io.StringIO())
    console.print(render(snapshot(), width=60))
    text = console.export_text()
    assert "…" not in text
    assert all(len(line) <= 60 for line in text.splitlines())
    assert row(text, "gpu-spot")[0] == "gpu-spot"
    assert {"job-a", "running", "$0.2100"} <= set(row(text, "job-a"))
    assert row(text, "total")[:2] == ["total", "$0.5850"]


def test_cost_by_experiment_lists_cost_waste_saving_and_the_total() -> None:
    text = text_of(snapshot())
    assert row(text, "exp-1") == ["exp-1", "$0.2100", "$0.0200", "$0.0900"]
    assert "(idle gpu-spot)" in text
    assert row(text, "total") == ["total", "$0.5850", "$0.0200", "$0.2100"]


def test_before_the_scaler_reports_the_frame_says_so_and_still_lists_jobs() -> None:
    text = text_of(snapshot(pools=None))
    assert NO_SCALER in text
    assert "GPUs allocated" not in text
    assert "queue 1 jobs / 2 GPUs" in text
    assert "job-a" in text


def test_a_stale_scaler_report_is_flagged() -> None:
    stale = POOLS.model_copy(update={"updated_at": NOW - timedelta(minutes=5)})
    assert "300s ago: is the scaler running?" in text_of(snapshot(pools=stale))
    assert "ago: is the scaler running?" not in text_of(snapshot())


def test_spend_over_budget_and_no_gpus_read_plainly() -> None:
    empty = POOLS.model_copy(update={"pools": (), "cost_per_hour_usd": 12.0})
    spend, use = text_of(snapshot(pools=empty)).splitlines()[:2]
    assert "cost $12.00/h of $10.00/h budget" in spend
    assert "GPUs allocated 0/0 (-)" in use


def test_an_empty_platform_draws_an_empty_frame() -> None:
    text = text_of(snapshot(jobs=(), job_costs={}, experiments=()))
    assert "no jobs" in text
    assert "nothing billed yet" in text
    assert "queue 0 jobs / 0 GPUs" in text


def test_active_jobs_come_first_then_the_most_recently_finished() -> None:
    old = job("job-old", JobState.FAILED, age_s=3600)
    rows, left_out = shown_jobs([old, JOB_B, JOB_Q, JOB_A], limit=3)
    assert [r.job_id for r in rows] == ["job-a", "job-q", "job-b"]
    assert left_out == 1


def test_the_limit_caps_the_rows_and_says_how_many_are_left_out() -> None:
    text = text_of(snapshot(), limit=1)
    assert "job-a" in text
    assert "job-q" not in text
    assert "2 more not shown (--limit)" in text
    assert "3 more not shown" in text  # four experiment rows, one shown
    assert row(text, "total")[1] == "$0.5850"  # the total is of them all


@pytest.mark.parametrize(
    ("metrics", "shown"),
    [
        pytest.param({}, "", id="none"),
        pytest.param({"accuracy": 0.91, "loss": 0.123456}, "loss 0.1235", id="loss-first"),
        pytest.param({"val_loss": 1.5, "accuracy": 0.5}, "val_loss 1.5", id="a-known-loss"),
        pytest.param({"zeta": 2.0, "accuracy": 0.5}, "accuracy 0.5", id="else-first-by-name"),
    ],
)
def test_the_main_metric(metrics: dict[str, float], shown: str) -> None:
    assert main_metric(metrics) == shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--interval", "0"], "--interval takes seconds, at least 0.5, not 0", id="0"),
        pytest.param(["--interval", "-1"], "at least 0.5, not -1", id="negative"),
        pytest.param(["--interval", "nan"], "at least 0.5, not nan", id="nan"),
        pytest.param(["--interval", "soon"], "Invalid value for '--interval'", id="not-a-number"),
        pytest.param(["--limit", "0"], "Invalid value for '--limit'", id="no-rows"),
    ],
)
def test_a_bad_argument_gets_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = spotrain("top", *args, env=no_bus())
    assert result.returncode == 2
    assert result.stderr.startswith("spotrain: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--once"], []], ids=["once", "live"])
def test_without_a_bus_it_fails_as_ls_does(args: list[str]) -> None:
    env = no_bus()
    result = spotrain("top", *args, env=env)
    assert result.returncode == 1
    assert result.stderr == spotrain("ls", env=env).stderr
    assert result.stderr.startswith("spotrain: error: the stack is not running (no NATS at ")
    assert result.stdout == ""


def test_not_at_a_terminal_the_tables_are_plain_columns_that_fit() -> None:
    console = Console(record=True, width=80, file=io.StringIO())
    console.print(render(snapshot(), width=80, boxed=False))
    text = console.export_text()
    assert not set("│┃━─┏└") & set(text), "no box drawing"
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines())
    [line] = [line for line in text.splitlines() if line.startswith("job-a ")]
    assert line.split()[:3] == ["job-a", "alice", "exp-1"]


def test_piped_with_no_width_every_column_is_whole_past_80_columns() -> None:
    """Piped, a table keeps all its columns; rich's console is 80 wide there, and must not
    squeeze them into it (it cut `capacity` to `capaci…`)."""
    console = Console(record=True, width=80, file=io.StringIO())
    console.print(render(snapshot(), width=None, boxed=False), soft_wrap=True)
    text = console.export_text()
    assert "…" not in text
    header = next(line for line in text.splitlines() if line.startswith("POOL "))
    assert header.split() == [
        "POOL", "CAPACITY", "READY/NODES", "BUSY/GPUS", "PENDING", "JOBS", "PENDING", "GPUS",
        "TARGET", "USD", "PER", "HOUR",
    ]  # fmt: skip
    [total_row] = [line for line in text.splitlines() if line.startswith("total ")]
    assert "$" in total_row
