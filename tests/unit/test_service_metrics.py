"""What each service exports to Prometheus: state figures from its own view on every pass,
counters of what happened, and cost accrued the way `spotrain cost` attributes it."""

from __future__ import annotations

import asyncio
import io
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from rich.console import Console
from rich.progress import Progress, TextColumn

from services.checkpointer.handlers import Deps as CheckpointerDeps
from services.checkpointer.handlers import on_job_interrupted, on_node_lost
from services.preemption_watcher.handlers import Deps as WatcherDeps
from services.preemption_watcher.handlers import publish_signal
from services.preemption_watcher.model import NodeSignal
from services.scaler import metrics as scaler_metrics
from services.scaler.handlers import follow_costs, measure_costs, reconcile
from services.submitter import metrics as submitter_metrics
from services.submitter.handlers import on_job_requested, on_job_resumed, track_attempts
from services.submitter.model import RayJobState
from services.submitter.policy import eta_s
from shared.checkpoints import ProgressReport
from shared.cli.job_actions import _show_progress, eta_text
from shared.events import Event, new_event
from shared.events.data import (
    InterruptionCause,
    JobInterrupted,
    JobProgress,
    JobSucceeded,
    NodeLost,
    NodeReleased,
    NoticeSource,
    ReleaseReason,
)
from shared.events.types import CapacityClass
from shared.jobs import Attempt
from shared.policy.cost import CostFold, CostInputs, JobInfo, Ledger, attribute, ledger
from shared.runtime.metrics import GaugeSpec, Snapshot
from tests.events import NOW, job_requested
from tests.fakes.clock import FixedClock
from tests.fakes.scaler import FakeCluster, RecordingStatusBoard
from tests.fakes.submitter import place_queued
from tests.unit.test_checkpointer_handlers import deps as checkpointer_deps  # noqa: F401
from tests.unit.test_cost_attribution import scenarios, window
from tests.unit.test_cost_ledger import Story
from tests.unit.test_cost_scaler_events import make_deps, queue_job
from tests.unit.test_submitter_handlers import deps as submitter_deps  # noqa: F401
from tests.unit.test_submitter_handlers import ray, resumed_event


def value(name: str, **labels: str) -> float:
    """The sample's value now, 0 when the series does not exist (yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- the snapshot collector --------------------------------------------------------------

STEP = GaugeSpec("test_job_step", "A step.", ("job_id",))


def test_a_snapshot_exports_exactly_the_last_pass() -> None:
    """A job that ended is gone from the next scrape: no stale series left behind."""
    registry = CollectorRegistry()
    snapshot = Snapshot([STEP])
    registry.register(snapshot)
    assert b"# TYPE test_job_step gauge" in generate_latest(registry), "declared before a pass"
    snapshot.replace({STEP: [(("job-a",), 10.0), (("job-b",), 3.0)]})
    assert registry.get_sample_value("test_job_step", {"job_id": "job-a"}) == 10.0
    snapshot.replace({STEP: [(("job-b",), 4.0)]})
    assert registry.get_sample_value("test_job_step", {"job_id": "job-a"}) is None
    assert registry.get_sample_value("test_job_step", {"job_id": "job-b"}) == 4.0


# --- scaler -------------------------------------------------------------------------------


RESIZES = "spotrain_pool_resizes_total"
GROWN = {"pool": "gpu-spot", "direction": "up", "reason": "pending-demand"}


async def test_a_reconcile_pass_exports_pools_queue_and_its_decisions() -> None:
    clock = FixedClock(NOW)
    deps = make_deps(clock, FakeCluster(clock))
    resizes = value(
        "spotrain_pool_resizes_total", pool="gpu-spot", direction="up", reason="pending-demand"
    )
    launched = value("spotrain_nodes_launched_total", pool="gpu-spot", capacity="spot")
    await queue_job(deps)
    await reconcile(deps)
    spot = {"pool": "gpu-spot", "capacity": "spot"}
    assert value("spotrain_queue_jobs") == 1
    assert value("spotrain_queue_gpus") == 2
    assert value("spotrain_pool_pending_gpus", **spot) == 2
    assert value("spotrain_pool_target_nodes", **spot) == 1
    assert value("spotrain_budget_per_hour_usd") == 10
    assert (
        value(
            "spotrain_pool_resizes_total", pool="gpu-spot", direction="up", reason="pending-demand"
        )
        == resizes + 1
    )
    assert value("spotrain_nodes_launched_total", pool="gpu-spot", capacity="spot") == launched + 1
    await reconcile(deps)  # the node is up: a pass with nothing to change adds no resize
    assert value("spotrain_pool_nodes", **spot) == 1
    assert value("spotrain_pool_gpus", **spot) == 2
    assert value("spotrain_pool_gpus_allocated", **spot) == 0, "the fake Ray hands out nothing"
    assert value("spotrain_cost_per_hour_usd") == pytest.approx(0.68)
    assert (
        value(
            "spotrain_pool_resizes_total", pool="gpu-spot", direction="up", reason="pending-demand"
        )
        == resizes + 1
    )


class ListFeed:
    """A feed that gives its events (twice, as a restarted reader would) and ends."""

    def __init__(self, events: Sequence[Event[Any]]) -> None:
        self._events = events

    async def follow(self, stop: asyncio.Event, add: Callable[[Event[Any]], None]) -> None:
        for event in (*self._events, *self._events):
            add(event)


async def test_cost_accrued_is_the_ledger_of_the_events_read_by_experiment_and_pool() -> None:
    s = Story()
    events = [
        s.launched("n1", 0),
        s.requested("job-a", "ann", "exp"),
        s.started("job-a", 1, "n1", at=0),
        s.ev(JobSucceeded(job_id="job-a", attempt=1), 1800),
        s.ev(
            NodeReleased(
                node="n1", pool="gpu-spot", released_at=s.t(3600), reason=ReleaseReason.SCALED_DOWN
            ),
            3600,
        ),
    ]
    clock = FixedClock(s.t(3600))
    deps = make_deps(clock, FakeCluster(clock))
    await follow_costs(ListFeed(events), deps, asyncio.Event())
    await measure_costs(deps)
    expected = ledger(events, now=s.t(3600))
    assert value("spotrain_cost_usd", experiment="exp", pool="gpu-spot") == pytest.approx(
        0.72 / 2 / 2  # half the node's GPUs for half an hour at $0.72/h
    )
    exported = value("spotrain_cost_usd", experiment="exp", pool="gpu-spot") + value(
        "spotrain_cost_usd", experiment="(idle)", pool="gpu-spot"
    )
    assert exported == pytest.approx(float(expected.attribution.cost_usd))
    assert value("spotrain_gpu_hours", experiment="exp", pool="gpu-spot") == pytest.approx(0.5)
    assert value("spotrain_saving_vs_on_demand_usd", experiment="exp", pool="gpu-spot") > 0
    board = deps.status
    assert isinstance(board, RecordingStatusBoard)
    assert board.latest_spend is not None
    assert board.latest_spend.by_owner == pytest.approx({"ann": 0.72 / 2 / 2})


async def test_owners_spend_counts_this_month_only() -> None:
    """Team budgets are monthly: an attempt across midnight on the 1st counts from then."""
    s = Story(datetime(2026, 11, 30, 23, 30, tzinfo=UTC))
    events = [
        s.launched("n1", 0),
        s.requested("job-a", "ann", "exp"),
        s.started("job-a", 1, "n1", at=0),
        s.ev(JobSucceeded(job_id="job-a", attempt=1), 3600),
    ]
    clock = FixedClock(s.t(3600))
    deps = make_deps(clock, FakeCluster(clock))
    await follow_costs(ListFeed(events), deps, asyncio.Event())
    await measure_costs(deps)
    board = deps.status
    assert isinstance(board, RecordingStatusBoard)
    assert board.latest_spend is not None
    assert board.latest_spend.since == datetime(2026, 12, 1, tzinfo=UTC)
    assert board.latest_spend.by_owner == pytest.approx({"ann": 0.72 / 2 / 2})


async def test_events_that_arrive_after_a_pass_count_in_the_next() -> None:
    """The feed keeps handing events to the list it was given, pass after pass."""
    s = Story()
    clock = FixedClock(s.t(3600))
    deps = make_deps(clock, FakeCluster(clock))
    handed: list[Callable[[Event[Any]], None]] = []

    class HeldFeed:
        async def follow(self, stop: asyncio.Event, add: Callable[[Event[Any]], None]) -> None:
            handed.append(add)

    await follow_costs(HeldFeed(), deps, asyncio.Event())
    [add] = handed
    add(s.launched("n1", 0))
    await measure_costs(deps)
    assert value("spotrain_cost_usd", experiment="late", pool="gpu-spot") == 0
    add(s.requested("job-late", "ann", "late"))
    add(s.started("job-late", 1, "n1", at=0))
    await measure_costs(deps)
    assert value("spotrain_cost_usd", experiment="late", pool="gpu-spot") == pytest.approx(
        0.72 / 2  # half the node's GPUs for the hour
    )


def test_folding_events_again_changes_nothing() -> None:
    """The feed starts again from the first event after a reconnect or a restart."""
    s = Story()
    events = [
        s.launched("n1", 0),
        s.started("job-a", 1, "n1", at=10),
        s.ev(NodeLost(node="n1", source=NoticeSource.LOCAL), 50),
        s.launched("n2", 60),
    ]
    once, twice = CostFold(), CostFold()
    for event in events:
        once.add(event)
    for event in (*events, *events[:2], *events):
        twice.add(event)
    assert once.inputs({}) == twice.inputs({})


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_cost_metrics_add_up_to_the_bill_of_each_pool(
    scenario: tuple[list[Any], list[Any], int, int],
) -> None:
    nodes, holds, lo, hi = scenario
    start, end = window(lo, hi)
    jobs = {f"job-{i}": JobInfo(f"job-{i}", "ann", "exp" if i % 2 else None) for i in range(4)}
    attribution = attribute(nodes, holds, start, end)
    inputs = CostInputs(nodes=tuple(nodes), holds=tuple(holds), jobs=jobs)
    samples = scaler_metrics.cost_samples(Ledger(inputs, attribution, start, end))
    by_pool: dict[str, Fraction] = defaultdict(Fraction)
    for bill in attribution.bills:
        by_pool[bill.pool] += bill.cost_usd
    exported: dict[str, float] = defaultdict(float)
    for (experiment, pool), cost in samples[scaler_metrics.COST]:
        assert experiment in {"exp", "(none)", "(idle)"}
        exported[pool] += cost
    assert exported.keys() <= by_pool.keys()
    for pool, billed in by_pool.items():
        assert exported.get(pool, 0.0) == pytest.approx(float(billed), abs=1e-9)
    waste = dict(samples[scaler_metrics.WASTE])
    for labels, cost in samples[scaler_metrics.COST]:
        assert 0 <= waste[labels] <= cost + 1e-12


# --- submitter ----------------------------------------------------------------------------


def test_the_eta_follows_the_pace_since_the_attempt_started() -> None:
    attempt = Attempt(number=2, submission_id="j-2", submitted_at=NOW, started_at=NOW, from_step=40)
    at = NOW + timedelta(seconds=60)
    assert eta_s(attempt, 70, 100, at) == 60.0, "30 steps a minute, 30 steps left"
    assert eta_s(attempt, 40, 100, at) is None, "no step since the resume: no pace yet"
    assert eta_s(attempt, 70, None, at) is None
    assert eta_s(attempt, 120, 100, at) == 0.0


async def test_a_tracking_pass_exports_jobs_by_state_and_each_running_jobs_progress(
    submitter_deps: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    deps = submitter_deps
    await on_job_requested(job_requested("job-m", experiment="exp-m", owner="ann"), deps)
    await on_job_requested(job_requested("job-q", owner="bob"), deps)
    await place_queued(deps)
    ray(deps).set("job-m-1", RayJobState.RUNNING)
    await track_attempts(deps)  # job-m starts
    deps.progress.reports["file:///checkpoints/job-m"] = ProgressReport(
        job_id="job-m",
        attempt=1,
        step=25,
        total_steps=100,
        metrics={"loss": 0.5},
        updated_at=deps.clock.now() + timedelta(seconds=50),
    )
    await track_attempts(deps)  # its progress is recorded
    await track_attempts(deps)  # and exported from the records this pass read
    job = {"job_id": "job-m", "experiment": "exp-m", "owner": "ann"}
    assert value("spotrain_jobs", state="running") == 1
    assert value("spotrain_jobs", state="queued") == 1
    assert value("spotrain_jobs", state="failed") == 0
    assert value("spotrain_job_step", **job) == 25
    assert value("spotrain_job_total_steps", **job) == 100
    assert value("spotrain_job_eta_seconds", **job) == 150, "25 steps in 50 s, 75 to go"
    assert value("spotrain_job_metric", **job, metric="loss") == 0.5
    assert value("spotrain_job_attempt", **job) == 1

    finished = value("spotrain_jobs_finished_total", outcome="succeeded")
    ray(deps).set("job-m-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    await track_attempts(deps)
    assert value("spotrain_jobs_finished_total", outcome="succeeded") == finished + 1
    assert REGISTRY.get_sample_value("spotrain_job_step", job) is None, "ended: no progress"
    assert value("spotrain_jobs", state="succeeded") == 1


async def test_a_lost_attempt_counts_and_its_successor_running_gives_the_recovery_time(
    submitter_deps: Any,  # noqa: F811
) -> None:
    deps = submitter_deps
    lost = value("spotrain_attempts_lost_total", cause="node-lost")
    recoveries = value("spotrain_recovery_seconds_count")
    under_10s = value("spotrain_recovery_seconds_bucket", le="10.0")
    under_30s = value("spotrain_recovery_seconds_bucket", le="30.0")
    await on_job_requested(job_requested("job-r"), deps)
    await place_queued(deps)
    ray(deps).set("job-r-1", RayJobState.RUNNING, node="gpu-spot-1", pool="gpu-spot")
    await track_attempts(deps)
    await on_job_resumed(resumed_event("job-r", 2), deps)
    await place_queued(deps)
    assert value("spotrain_attempts_lost_total", cause="node-lost") == lost + 1
    deps.clock.advance(timedelta(seconds=20))
    ray(deps).set("job-r-2", RayJobState.RUNNING, node="gpu-spot-2", pool="gpu-spot")
    await track_attempts(deps)
    assert value("spotrain_recovery_seconds_count") == recoveries + 1
    assert value("spotrain_recovery_seconds_bucket", le="30.0") == under_30s + 1
    assert value("spotrain_recovery_seconds_bucket", le="10.0") == under_10s, "it took 20 s"


# --- checkpointer and watcher -------------------------------------------------------------


async def test_a_loss_is_counted_once_however_often_and_from_wherever_it_arrives(
    checkpointer_deps: CheckpointerDeps,  # noqa: F811
) -> None:
    deps = checkpointer_deps
    losses = value("spotrain_nodes_lost_total", pool="gpu-spot")

    def resumed() -> float:
        return sum(value("spotrain_resumes_total", capacity=c.value) for c in CapacityClass)

    resumes = resumed()
    decisions = value("spotrain_resume_decision_seconds_count")
    lost = NodeLost(node="gpu-spot-1", pool="gpu-spot", source=NoticeSource.LOCAL)
    for _ in range(2):
        await on_node_lost(new_event(lost, source="t", time=NOW), deps)
    interrupted = JobInterrupted(
        job_id="job-1", attempt=1, node="gpu-spot-1", cause=InterruptionCause.NODE_LOST
    )
    await on_job_interrupted(new_event(interrupted, source="submitter", time=NOW), deps)
    assert value("spotrain_nodes_lost_total", pool="gpu-spot") == losses + 1
    assert resumed() == resumes + 1
    assert value("spotrain_resume_decision_seconds_count") == decisions + 1


async def test_the_watcher_counts_each_signal_it_relays_once() -> None:
    from shared.messaging.memory import InMemoryBus  # noqa: PLC0415

    deps = WatcherDeps(bus=InMemoryBus(), clock=FixedClock(NOW))
    before = value("spotrain_node_signals_total", source="local", signal="lost")
    signal = NodeSignal(
        key="lost-gpu-spot-7", data=NodeLost(node="gpu-spot-7", source=NoticeSource.LOCAL)
    )
    await publish_signal(signal, deps, source="local")
    await publish_signal(signal, deps, source="local")
    assert value("spotrain_node_signals_total", source="local", signal="lost") == before + 1


def test_every_metric_a_service_exports_is_in_the_catalogue() -> None:
    """docs/metrics.md is what dashboards and users read: nothing exported goes unlisted."""
    catalogue = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    import services.checkpointer.metrics  # noqa: F401, PLC0415
    import shared.messaging.metrics  # noqa: F401, PLC0415

    exported = {metric.name for metric in REGISTRY.collect() if metric.name.startswith("spotrain_")}
    assert exported, "the services' metrics are registered"
    for name in exported:
        documented = name if f"`{name}`" in catalogue else f"{name}_total"
        assert f"`{documented}`" in catalogue, name


# --- spotrain watch -----------------------------------------------------------------------


async def test_watch_shows_the_platforms_eta_from_each_progress_report() -> None:
    progress = Progress(TextColumn("{task.fields[eta]}"), console=Console(file=io.StringIO()))
    task = progress.add_task("job-w", total=None, attempt=1, metrics="", eta="", state="")

    async def events() -> AsyncIterator[Event[Any]]:
        report = JobProgress(job_id="job-w", attempt=1, step=10, total_steps=100, eta_s=3723.4)
        yield new_event(report, source="submitter", time=NOW)

    assert await _show_progress(progress, task, events()) == 0
    assert progress.tasks[0].fields["eta"] == "eta 1:02:03"
    assert progress.tasks[0].total == 100
    assert eta_text(None) == ""


def test_counters_of_known_label_values_start_at_zero() -> None:
    """A pool that never failed to grow reads 0 failures, not a missing series."""
    from services.checkpointer import metrics as checkpointer_metrics  # noqa: PLC0415
    from services.preemption_watcher.handlers import declare_sources  # noqa: PLC0415
    from tests.unit.test_cost_scaler_events import SPOT  # noqa: PLC0415

    unseen = SPOT.model_copy(update={"name": "gpu-never-used"})
    scaler_metrics.declare_pools([unseen])
    submitter_metrics.declare()
    checkpointer_metrics.declare()
    declare_sources(["k8s"])
    zero = {
        "spotrain_pool_resize_failures_total": {"pool": "gpu-never-used"},
        "spotrain_nodes_released_total": {"pool": "gpu-never-used", "reason": "gone"},
        "spotrain_jobs_finished_total": {"outcome": "rejected"},
        "spotrain_attempts_lost_total": {"cause": "preempted"},
        "spotrain_resumes_total": {"capacity": "on-demand"},
        "spotrain_node_signals_total": {"source": "k8s", "signal": "preempting"},
    }
    for name, labels in zero.items():
        assert REGISTRY.get_sample_value(name, labels) is not None, name
