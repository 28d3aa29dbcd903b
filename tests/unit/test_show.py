"""`spotrain show`'s description of a job: one fact a line, each within 80 columns, since
`show` never wraps a line (it stays whole for grep)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest

from shared.cli.job_actions import _cost_line, describe, failure_line, node_rows
from shared.events.data import JobRequested
from shared.events.types import Bundle, CapacityClass
from shared.jobs import Attempt, AttemptState, JobRecord, JobState
from shared.policy.cost import CostRow, format_usd
from shared.policy.cost.attribution import NodeLife
from shared.pools import PoolsStatus, QueuedAttempt

NOW = datetime(2026, 12, 4, 15, 34, tzinfo=UTC)


def elastic_job(**running: object) -> JobRecord:
    request = JobRequested(
        job_id="train-ddp-5433cd",
        owner="alice",
        experiment="ddp-try",
        entrypoint=("python", "train_ddp.py"),
        worker=Bundle(gpus=0, cpus=1),
        num_workers=2,
        max_workers=3,
        capacity=CapacityClass.SPOT,
    )
    attempt = Attempt(
        number=1,
        submission_id="train-ddp-5433cd-1",
        submitted_at=NOW - timedelta(seconds=30),
        started_at=NOW - timedelta(seconds=28),
        state=AttemptState.RUNNING,
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        step=40,
        total_steps=600,
        metrics={"loss": 1.485},
        workers=3,
        worker_nodes=("gpu-spot-1", "gpu-spot-2", "gpu-spot-2"),
        **running,  # type: ignore[arg-type]
    )
    return JobRecord(
        request=request,
        request_event_id="r-1",
        state=JobState.RUNNING,
        accepted_at=NOW - timedelta(seconds=33),
        updated_at=NOW,
        attempts=(attempt,),
    )


def test_an_elastic_job_is_described_in_lines_that_fit_80_columns() -> None:
    lines = describe(elastic_job(eta_s=432), [], NOW)

    assert max(len(line) for line in lines) <= 80, lines
    assert "workers: 2..3, 3 now (a gang of 2, 1 more as capacity allows)" in lines
    assert "progress: step 40/600, loss 1.485, eta 0:07:12" in lines
    [attempt] = [line for line in lines if line.startswith("  #1 ")]
    assert attempt.startswith("  #1 running on gpu-spot-1, gpu-spot-2 x2 (gpu-spot, spot) ")


def test_no_eta_is_said_while_the_pace_is_not_known() -> None:
    lines = describe(elastic_job(), [], NOW)

    assert "progress: step 40/600, loss 1.485" in lines


def test_the_cost_fits_80_columns_at_a_large_bill() -> None:
    row = CostRow(
        key="train-ddp-5433cd",
        cost_usd=Fraction("12345.6789"),
        gpu_seconds=Fraction(12345 * 3600),
        waste_usd=Fraction("1234.5678"),
        on_demand_usd=Fraction("35802.4680"),
    )
    lines = _cost_line(row).splitlines()
    assert max(len(line) for line in lines) <= 80, lines
    assert lines[1] == f"saved: {format_usd(Fraction('23456.7891'))} against on-demand"


def test_a_queued_job_says_where_it_stands_and_why_it_waits() -> None:
    record = elastic_job()
    queued = record.model_copy(
        update={
            "state": JobState.QUEUED,
            "attempts": (
                record.attempts[0].model_copy(
                    update={"state": AttemptState.QUEUED, "started_at": None, "step": None}
                ),
            ),
        }
    )
    status = PoolsStatus(
        updated_at=NOW,
        budget_per_hour_usd=0.5,
        cost_per_hour_usd=0.34,
        pools=(),
        blocked_jobs=1,
        queue=(
            QueuedAttempt(job_id="other", attempt=1, position=1, why="placed on gpu-spot-1"),
            QueuedAttempt(
                job_id="train-ddp-5433cd",
                attempt=1,
                position=2,
                why="over-budget: 1 more gpu-spot node(s) would cost $0.68/h in all",
            ),
        ),
    )
    lines = describe(queued, [], NOW, queue=status)
    assert lines[2] == (
        "queue: #2 of 2: over-budget: 1 more gpu-spot node(s) would cost $0.68/h in all"
    )
    unseen = describe(queued, [], NOW, queue=None)
    assert unseen[2] == "queue: not seen by the scaler yet (it decides every few seconds)"
    assert not any(line.startswith("queue:") for line in describe(record, [], NOW, queue=status))


RAY_FAILURE = """Job entrypoint command failed with exit code 1, last available logs \
(truncated to 20,000 chars):
  File "train.py", line 12, in <module>
    main()
  File "train.py", line 9, in main
    raise ValueError("batch size 0 is not a batch")
ValueError: batch size 0 is not a batch
"""


@pytest.mark.parametrize(
    ("message", "line"),
    [
        pytest.param(RAY_FAILURE, "ValueError: batch size 0 is not a batch", id="python-error"),
        pytest.param(
            "x\\ntorch.OutOfMemoryError: CUDA out of memory\\nsome cleanup line",
            "torch.OutOfMemoryError: CUDA out of memory",
            id="dotted-error-before-noise",
        ),
        pytest.param("exit code 3\\nsaving nothing", "saving nothing", id="no-exception"),
        pytest.param("", "", id="nothing"),
    ],
)
def test_why_a_job_failed_is_the_line_that_names_the_error(message: str, line: str) -> None:
    assert failure_line(message.replace("\\n", "\n")) == line


def test_show_says_why_a_failed_job_failed() -> None:
    record = elastic_job().model_copy(
        update={"state": JobState.FAILED, "detail": RAY_FAILURE, "updated_at": NOW}
    )
    assert "failed: ValueError: batch size 0 is not a batch" in describe(record, [], NOW)


def test_pools_nodes_lists_each_node_up_with_the_jobs_on_it() -> None:
    life = NodeLife(
        node="gpu-spot-2",
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        gpus=2,
        cpus=2,
        price_per_hour_usd=0.34,
        on_demand_price_per_hour_usd=0.85,
        start=NOW - timedelta(minutes=3),
    )
    gone = replace(life, node="gpu-spot-1", end=NOW - timedelta(minutes=1))
    rows = node_rows([life, gone], [elastic_job()], NOW)
    assert rows == [
        {
            "node": "gpu-spot-2",
            "pool": "gpu-spot",
            "capacity": "spot",
            "gpus": "2",
            "up": "3m",
            "jobs": "train-ddp-5433cd",
        }
    ]
