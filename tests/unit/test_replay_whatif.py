"""The what-if: a recorded window turned into the simulator's input, and compared with the
simulated figures of other pools. A small story whose figures are worked out by hand."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.simulation.replay import load_pools
from services.scaler.simulation.traces import TraceJob
from services.scaler.simulation.whatif import (
    as_trace,
    compare,
    event_window,
    main,
    recorded_jobs,
)
from shared.events import Event, encode, new_event
from shared.events.data import (
    EventData,
    InterruptionCause,
    JobCancelled,
    JobInterrupted,
    JobQueued,
    JobResumed,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
    NodeReleased,
    ReleaseReason,
)
from shared.events.types import Bundle, CapacityClass

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)

BIG_POOL = """
[scaler]
idle_timeout_s = 0

[[pool]]
name = "big"
capacity = "spot"
gpus = 4
cpus = 4
price_per_hour_usd = 1.5
boot_time_s = 60
max_nodes = 2
"""


class Story:
    """Two 2-GPU spot nodes at $1/h and two jobs, from `t0`:

    - n1 from 0 s to 4000 s; job-a (2 GPUs) queued at 0, started at 100, done at 3700.
    - n2 from 200 s to 2000 s; job-b (1 GPU) queued at 200, started at 300, done at 1800.

    Billed: 4000 + 1800 node-seconds at $1/h = $1.61. Waits: 100 s and 100 s.
    On one 4-GPU pool at $1.5/h booting in 60 s, with no idle timeout: one node from 0 to
    3660 s (job-a waits the boot, starts at 60 and runs 3600 s; job-b fits beside it at
    once) = $1.525; waits 60 s and 0 s.
    """

    def __init__(self, t0: datetime = T0) -> None:
        self.t0 = t0

    def t(self, s: float) -> datetime:
        return self.t0 + timedelta(seconds=s)

    def _event(self, data: EventData, at_s: float, key: str) -> Event[Any]:
        return new_event(data, source="tests", time=self.t(at_s), event_id=f"{key}-{self.t0:%s}")

    def _launched(self, node: str, at_s: float) -> Event[Any]:
        data = NodeLaunched(
            node=node,
            pool="gpu-spot",
            capacity=CapacityClass.SPOT,
            gpus=2,
            cpus=2,
            price_per_hour_usd=1.0,
            launched_at=self.t(at_s),
        )
        return self._event(data, at_s, f"launched-{node}")

    def _released(self, node: str, at_s: float) -> Event[Any]:
        data = NodeReleased(
            node=node, pool="gpu-spot", reason=ReleaseReason.SCALED_DOWN, released_at=self.t(at_s)
        )
        return self._event(data, at_s, f"released-{node}")

    def _queued(self, job: str, gpus: int, at_s: float) -> Event[Any]:
        data = JobQueued(
            job_id=job,
            attempt=1,
            bundles=(Bundle(gpus=gpus),),
            capacity=CapacityClass.ANY,
            priority=5,
        )
        return self._event(data, at_s, f"queued-{job}")

    def _started(self, job: str, node: str, at_s: float) -> Event[Any]:
        data = JobStarted(job_id=job, attempt=1, submission_id=f"{job}-1", nodes=(node,))
        return self._event(data, at_s, f"started-{job}")

    def _succeeded(self, job: str, at_s: float) -> Event[Any]:
        return self._event(JobSucceeded(job_id=job, attempt=1), at_s, f"succeeded-{job}")

    def events(self) -> list[Event[Any]]:
        return [
            self._launched("n1", 0),
            self._queued("job-a", 2, 0),
            self._started("job-a", "n1", 100),
            self._launched("n2", 200),
            self._queued("job-b", 1, 200),
            self._started("job-b", "n2", 300),
            self._succeeded("job-b", 1800),
            self._released("n2", 2000),
            self._succeeded("job-a", 3700),
            self._released("n1", 4000),
        ]


def _big_pool(folder: Path) -> tuple[list[PoolSpec], ScalerConfig]:
    path = folder / "pools.toml"
    path.write_text(BIG_POOL)
    return load_pools(path)


def test_the_recorded_jobs_are_their_arrivals_runs_and_waits() -> None:
    jobs = recorded_jobs(Story().events(), until=T0 + timedelta(hours=2))
    assert [(j.job_id, j.queued_at, j.gpus, j.ran_s, j.waited_s) for j in jobs] == [
        ("job-a", T0, 2, 3600.0, 100.0),
        ("job-b", T0 + timedelta(seconds=200), 1, 1500.0, 100.0),
    ]
    assert as_trace(jobs, T0) == [
        TraceJob("job-a", 0.0, 2, 3600.0),
        TraceJob("job-b", 200.0, 1, 1500.0),
    ]


def test_a_preempted_jobs_attempts_add_up_and_a_running_one_is_cut_at_the_window() -> None:
    story = Story()
    e = story._event

    def queued(job: str, attempt: int, bundles: int, capacity: CapacityClass) -> JobQueued:
        shape = (Bundle(gpus=1 if bundles > 1 else 2),) * bundles
        return JobQueued(job_id=job, attempt=attempt, bundles=shape, capacity=capacity, priority=5)

    lost = InterruptionCause.NODE_LOST
    events = [
        e(queued("job-p", 1, 1, CapacityClass.SPOT), 0, "q1"),
        e(JobStarted(job_id="job-p", attempt=1, submission_id="job-p-1"), 50, "s1"),
        e(JobInterrupted(job_id="job-p", attempt=1, node="n1", cause=lost), 650, "i1"),
        e(JobResumed(job_id="job-p", attempt=2, capacity=CapacityClass.SPOT), 660, "r2"),
        e(queued("job-p", 2, 1, CapacityClass.SPOT), 700, "q2"),
        e(JobStarted(job_id="job-p", attempt=2, submission_id="job-p-2"), 1000, "s2"),
        e(queued("job-c", 1, 2, CapacityClass.ANY), 0, "qc"),
        e(JobStarted(job_id="job-c", attempt=1, submission_id="job-c-1"), 10, "sc"),
        e(JobCancelled(job_id="job-c"), 110, "cc"),
        e(queued("job-w", 1, 1, CapacityClass.ANY), 0, "qw"),
    ]
    jobs = {j.job_id: j for j in recorded_jobs(events, until=story.t(1500))}
    assert (jobs["job-p"].ran_s, jobs["job-p"].waited_s) == (600.0 + 500.0, 50.0 + 300.0)
    assert (jobs["job-c"].ran_s, jobs["job-c"].gpus_per_bundle) == (100.0, (1, 1))
    assert (jobs["job-w"].ran_s, jobs["job-w"].started) == (0.0, False)
    assert [t.job_id for t in as_trace(list(jobs.values()), T0)] == ["job-c", "job-p"]


def test_the_comparison_against_other_pools_matches_the_hand_computation(tmp_path: Path) -> None:
    pools, config = _big_pool(tmp_path)
    comparison = compare(
        Story().events(), pools, config, since=T0, until=T0 + timedelta(seconds=4000)
    )
    figures = comparison.as_json()
    assert figures["jobs"] == 2
    assert figures["recorded"] == {
        "cost_usd": 1.61,
        "wait_p50_s": 100.0,
        "wait_p95_s": 100.0,
        "wait_max_s": 100.0,
        "nodes_launched": 2,
    }
    assert figures["what_if"]["cost_usd"] == pytest.approx(1.525, abs=0.01)
    assert figures["what_if"]["wait_max_s"] == 60.0
    assert figures["what_if"]["nodes_launched"] == 1
    assert figures["difference"]["nodes_launched"] == -1
    assert figures["difference"]["wait_max_s"] == -40.0
    assert figures["notes"] == []


def test_events_stored_long_after_they_happened_are_compared_over_their_own_times() -> None:
    """An import: the stream stored them today, they happened last week."""
    events = Story().events()
    read_at = T0 + timedelta(days=7)
    since, until, own = event_window(events, read_at, read_at + timedelta(minutes=5))
    assert (since, until, own) == (T0, T0 + timedelta(seconds=4000), True)
    assert event_window(events, T0, T0 + timedelta(hours=2)) == (
        T0,
        T0 + timedelta(hours=2),
        False,
    )


def test_the_tool_prints_json_and_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = tmp_path / "window.jsonl"
    recorded.write_bytes(b"".join(encode(e) + b"\n" for e in Story().events()))
    pools = tmp_path / "pools.toml"
    pools.write_text(BIG_POOL)
    assert main(["--events", str(recorded), "--pools", str(pools), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["recorded"]["cost_usd"] == 1.61
    assert figures["notes"] == []
    assert main(["--events", str(recorded), "--pools", str(pools)]) == 0
    table = capsys.readouterr().out
    assert "cost $" in table
    assert "wait p95 s" in table


@pytest.mark.parametrize(
    ("events", "pools", "message"),
    [
        pytest.param(b"{oops\n", BIG_POOL, "line 1: not-json", id="bad-event-line"),
        pytest.param(None, "[[pool]]\nname = 3\n", "validation error", id="bad-pool"),
        pytest.param(None, "[[pool", "Expected", id="not-toml"),
        pytest.param(
            None,
            '[[pool]]\nname = "cpu"\ncapacity = "spot"\ngpus = 0\ncpus = 2\n'
            "price_per_hour_usd = 1\n",
            "no pool with GPUs",
            id="no-gpu-pool",
        ),
    ],
)
def test_a_bad_file_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    events: bytes | None,
    pools: str,
    message: str,
) -> None:
    recorded = tmp_path / "window.jsonl"
    recorded.write_bytes(
        events if events is not None else b"".join(encode(e) + b"\n" for e in Story().events())
    )
    pools_file = tmp_path / "pools.toml"
    pools_file.write_text(pools)
    assert main(["--events", str(recorded), "--pools", str(pools_file)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("spotrain events what-if: error: ")
    assert message in error
    assert len(error.strip().splitlines()) == 1
