"""The submitter's pure decisions: admission, what Ray gets, how records move."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.submitter import policy
from services.submitter.model import (
    Attempt,
    AttemptState,
    JobRecord,
    JobState,
    RayJobState,
    RayJobStatus,
)
from services.submitter.policy import Accept, Quotas, Reason, Reject, WaitForQuota
from shared.checkpoints import ProgressReport
from shared.events.data import (
    InterruptionCause,
    JobInterrupted,
    JobPlaced,
    JobQueued,
    JobRequested,
    JobResized,
    JobStarted,
    RejectionReason,
    ResizeReason,
)
from shared.events.types import Bundle, CapacityClass

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
QUOTAS = Quotas(max_gpus_per_job=8, max_gpus_per_owner=12)


def request(gpus: int = 1, workers: int = 1, **fields: object) -> JobRequested:
    return JobRequested(
        job_id=str(fields.pop("job_id", "job-1")),
        owner="alice",
        entrypoint=fields.pop("entrypoint", ("python", "train.py")),  # type: ignore[arg-type]
        worker=Bundle(gpus=gpus, cpus=4, memory_gb=16),
        num_workers=workers,
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("gpus", "workers", "in_use", "expected"),
    [
        pytest.param(2, 1, 0, Accept(gpus=2), id="small-job-fits"),
        pytest.param(4, 2, 4, Accept(gpus=8), id="at-the-per-job-limit"),
        pytest.param(4, 3, 0, RejectionReason.QUOTA_EXCEEDED, id="over-the-per-job-limit"),
        pytest.param(4, 1, 10, WaitForQuota, id="owner-over-concurrent-limit-waits"),
        pytest.param(4, 4, 0, RejectionReason.QUOTA_EXCEEDED, id="larger-than-an-owner-may-hold"),
        pytest.param(0, 4, 12, Accept(gpus=0), id="cpu-jobs-hold-no-gpus"),
    ],
)
def test_admission_within_quotas(gpus: int, workers: int, in_use: int, expected: object) -> None:
    decision = policy.admit(
        request(gpus, workers), owner_gpus_in_use=in_use, quotas=QUOTAS, now=NOW
    )
    assert_admission(decision, expected)


def assert_admission(decision: object, expected: object) -> None:
    """An `Accept` equal to `expected`, a `WaitForQuota`, or a `Reject` for that reason."""
    if isinstance(expected, Accept):
        assert decision == expected
    elif expected is WaitForQuota:
        assert isinstance(decision, WaitForQuota)
    else:
        assert isinstance(decision, Reject)
        assert decision.reason is expected


@pytest.mark.parametrize(
    ("workers", "most", "in_use", "expected"),
    [
        # 1..3 x 2 GPUs grows to 6 whenever there is room: counted at 6, like a fixed 3 x 2.
        pytest.param(1, 3, 0, Accept(gpus=6), id="elastic-counted-at-its-max"),
        pytest.param(2, 5, 0, RejectionReason.QUOTA_EXCEEDED, id="its-max-over-the-per-job-limit"),
        pytest.param(1, 3, 8, WaitForQuota, id="its-max-over-the-owners-quota-waits"),
    ],
)
def test_an_elastic_job_is_admitted_at_its_max_workers(
    workers: int, most: int, in_use: int, expected: object
) -> None:
    elastic = request(2, workers, max_workers=most)
    decision = policy.admit(elastic, owner_gpus_in_use=in_use, quotas=QUOTAS, now=NOW)
    assert_admission(decision, expected)


def test_a_wait_for_the_owners_quota_says_by_how_much() -> None:
    decision = policy.admit(request(4), owner_gpus_in_use=10, quotas=QUOTAS, now=NOW)
    assert decision == WaitForQuota(
        "alice holds 10 GPUs; with this job's 4 that is 14, over their quota of 12: it waits "
        "for their running jobs to end"
    )


@pytest.mark.parametrize(
    ("in_use", "waiting", "expected"),
    [
        pytest.param(0, 0, Accept, id="room-and-nobody-waits"),
        pytest.param(0, 5, Accept, id="room-for-it-though-larger-ones-wait"),
        pytest.param(12, 999, WaitForQuota, id="the-last-place-in-the-queue"),
        pytest.param(12, 1000, Reject, id="past-the-queue-depth"),
    ],
)
def test_a_sweep_waits_for_its_owners_quota_up_to_the_queue_depth(
    in_use: int, waiting: int, expected: type
) -> None:
    quotas = Quotas(max_gpus_per_job=8, max_gpus_per_owner=12, max_waiting_per_owner=1000)
    decision = policy.admit(
        request(1), owner_gpus_in_use=in_use, owner_waiting=waiting, quotas=quotas, now=NOW
    )
    assert isinstance(decision, expected)


@given(
    gpus=st.integers(0, 16),
    in_use=st.integers(0, 40),
    waiting=st.integers(0, 40),
    depth=st.integers(0, 40),
)
def test_an_owners_queue_never_grows_past_its_depth(
    gpus: int, in_use: int, waiting: int, depth: int
) -> None:
    quotas = Quotas(max_gpus_per_job=16, max_gpus_per_owner=16, max_waiting_per_owner=depth)
    decision = policy.admit(
        request(gpus), owner_gpus_in_use=in_use, owner_waiting=waiting, quotas=quotas, now=NOW
    )
    if isinstance(decision, WaitForQuota):
        assert waiting < depth


@given(gpus=st.integers(0, 16), workers=st.integers(1, 8), in_use=st.integers(0, 40))
def test_an_accepted_job_never_takes_an_owner_past_the_quota(
    gpus: int, workers: int, in_use: int
) -> None:
    decision = policy.admit(
        request(gpus, workers), owner_gpus_in_use=in_use, quotas=QUOTAS, now=NOW
    )
    if isinstance(decision, Accept):
        assert decision.gpus <= QUOTAS.max_gpus_per_job
        assert in_use + decision.gpus <= QUOTAS.max_gpus_per_owner


@pytest.mark.parametrize(
    ("deadline_h", "estimate_h", "expected"),
    [
        pytest.param(12, 6, None, id="fits-with-room"),
        pytest.param(12, None, None, id="no-estimate-nothing-to-check"),
        pytest.param(6, 6, None, id="exactly-fits-on-on-demand"),
        pytest.param(
            4.2,
            6,
            "the job needs 6h00m at its estimate, but only 4h12m remain until "
            "2026-11-30 16:12 UTC: even on on-demand, never preempted, it would end 1h48m late",
            id="too-short-even-on-on-demand",
        ),
        pytest.param(
            -0.5, None, "the deadline 2026-11-30 11:30 UTC has passed (30m00s ago)", id="past"
        ),
    ],
)
def test_a_deadline_that_cannot_be_met_is_refused_with_the_arithmetic(
    deadline_h: float, estimate_h: float | None, expected: str | None
) -> None:
    req = request(2).model_copy(
        update={
            "deadline": NOW + timedelta(hours=deadline_h),
            "estimate_s": round(estimate_h * 3600) if estimate_h is not None else None,
        }
    )
    decision = policy.admit(req, owner_gpus_in_use=0, quotas=QUOTAS, now=NOW)
    if expected is None:
        assert decision == Accept(gpus=2)
    else:
        assert decision == Reject(RejectionReason.DEADLINE_UNREACHABLE, expected)


def waiting_record(req: JobRequested | None = None) -> JobRecord:
    """Accepted, its first attempt in the platform's queue."""
    req = req or request(2)
    return policy.new_record(req, "event-1", Accept(gpus=2), NOW, checkpoint_uri="file:///c/job-1")


def queued_record(req: JobRequested | None = None, nodes: tuple[str, ...] = ("n1",)) -> JobRecord:
    """Accepted and placed on `nodes`: handed to Ray, which has not started it yet."""
    record = waiting_record(req)
    placement = JobPlaced(job_id=record.job_id, attempt=1, nodes=nodes, pool="gpu-spot")
    return policy.placed(record, placement, NOW).record


def test_a_new_job_waits_in_the_platforms_queue_until_placed() -> None:
    record = waiting_record()
    [attempt] = record.attempts
    assert attempt.state is AttemptState.QUEUED
    transition = policy.on_ray_status(record, None, NOW)
    assert transition.reason is Reason.UNCHANGED, "a queued attempt is not Ray's to repair"


@pytest.mark.parametrize(
    ("attempt", "requeued", "cancelled", "expected"),
    [
        pytest.param(1, 0, False, Reason.SUBMITTED, id="its-attempt"),
        pytest.param(2, 0, False, Reason.UNCHANGED, id="another-attempt"),
        pytest.param(1, 1, False, Reason.UNCHANGED, id="an-older-queueing"),
        pytest.param(1, 0, True, Reason.UNCHANGED, id="cancel-requested"),
    ],
)
def test_a_placement_hands_to_ray_only_the_attempt_it_answers(
    attempt: int, requeued: int, cancelled: bool, expected: Reason
) -> None:
    record = waiting_record().model_copy(update={"cancel_requested": cancelled})
    placement = JobPlaced(
        job_id="job-1", attempt=attempt, requeued=requeued, nodes=("n2",), pool="gpu-spot"
    )
    assert policy.placed(record, placement, NOW).reason is expected


def test_a_placed_single_node_attempt_is_pinned_to_its_node() -> None:
    record = queued_record(request(1), nodes=("gpu-spot-7",))
    plan = policy.plan_submission(record, record.attempts[0], checkpoint_uri="file:///c")
    assert plan.entrypoint_label_selector == {"spotrain-node": "in(gpu-spot-7)"}


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        pytest.param(
            1, {"spotrain-node": "!in(gpu-spot-7)"}, id="single-node-avoids-the-lost-node"
        ),
        pytest.param(2, {}, id="multi-node-driver-stays-on-the-head"),
    ],
)
def test_the_attempt_after_a_lost_one_keeps_its_driver_off_the_lost_node(
    workers: int, expected: dict[str, str]
) -> None:
    """A multi-node driver asks for nothing so that Ray keeps it on the head; any label
    selector would count as asking, and Ray would run it on a spot node that may go."""
    record = queued_record(request(0, workers=workers))
    lost = record.attempts[0].model_copy(
        update={"state": AttemptState.LOST, "nodes": ("gpu-spot-7",), "placed_on": ()}
    )
    record = record.model_copy(update={"attempts": (lost, lost.model_copy(update={"number": 2}))})
    plan = policy.plan_submission(record, record.attempts[1], checkpoint_uri="file:///c")
    assert plan.entrypoint_label_selector == expected


DRIVERS = {"spotrain-role": "driver"}


@pytest.mark.parametrize(
    ("workers", "lost", "expected"),
    [
        pytest.param(2, False, DRIVERS, id="multi-node-driver-on-the-drivers-nodes"),
        pytest.param(2, True, DRIVERS, id="after-a-loss-too"),
        pytest.param(1, False, {"spotrain-node": "in(n1)"}, id="single-node-on-its-room"),
        pytest.param(1, True, {"spotrain-node": "!in(gpu-spot-7)"}, id="single-after-a-loss"),
    ],
)
def test_a_multi_node_driver_runs_on_the_drivers_nodes_where_there_are_some(
    workers: int, lost: bool, expected: dict[str, str]
) -> None:
    """With a drivers group (the chart's default), no job's code runs on the head, where
    Ray's job API answers whoever holds the cluster's token."""
    record = queued_record(request(0, workers=workers))
    if lost:
        gone = record.attempts[0].model_copy(
            update={"state": AttemptState.LOST, "nodes": ("gpu-spot-7",), "placed_on": ()}
        )
        record = record.model_copy(
            update={"attempts": (gone, gone.model_copy(update={"number": 2}))}
        )
    plan = policy.plan_submission(
        record, record.attempts[-1], checkpoint_uri="file:///c", driver_labels=DRIVERS
    )
    assert plan.entrypoint_label_selector == expected
    assert plan.entrypoint_num_cpus == (0 if workers > 1 else record.request.worker.cpus)


@pytest.mark.parametrize(
    ("error_type", "expected"),
    [
        pytest.param("JOB_SUPERVISOR_ACTOR_START_TIMEOUT", Reason.REQUEUED, id="start-timeout"),
        pytest.param("JOB_SUPERVISOR_ACTOR_START_FAILURE", Reason.NODE_LOST, id="start-failure"),
        pytest.param("JOB_ENTRYPOINT_COMMAND_ERROR", Reason.USER_ERROR, id="its-own-error"),
        pytest.param("JOB_SUPERVISOR_ACTOR_DIED", Reason.NODE_LOST, id="node-died"),
    ],
)
def test_an_attempt_ray_never_started_for_want_of_room_goes_back_to_the_queue(
    error_type: str, expected: Reason
) -> None:
    record = queued_record()
    failed = status(RayJobState.FAILED, error_type=error_type, message="m")
    transition = policy.on_ray_status(record, failed, NOW)
    assert transition.reason is expected
    if expected is Reason.REQUEUED:
        [attempt] = transition.record.attempts
        assert (attempt.state, attempt.requeued, attempt.submission_id) == (
            AttemptState.QUEUED,
            1,
            "job-1-1-r1",
        )
        assert transition.record.state is JobState.QUEUED
        [fact] = transition.facts
        assert isinstance(fact.data, JobQueued)
        assert (fact.data.attempt, fact.data.requeued) == (1, 1)
        assert not any(isinstance(f.data, JobStarted) for f in transition.facts)


def test_a_submission_quotes_the_command_and_carries_the_training_contract() -> None:
    hostile = ("python", "train.py", "--name", "x; rm -rf ~", "$(reboot)")
    record = queued_record(
        request(2, capacity=CapacityClass.SPOT, entrypoint=hostile, env={"SEED": "7"})
    )
    plan = policy.plan_submission(record, record.attempts[0], checkpoint_uri="file:///ckpt/job-1")
    # The launcher runs first, and hands the command on as the argv it was.
    assert shlex.split(plan.entrypoint) == [*policy.LAUNCHER, *hostile]
    assert plan.submission_id == "job-1-1"
    assert plan.entrypoint_num_gpus == 2
    assert plan.entrypoint_num_cpus == 4
    assert plan.entrypoint_memory_bytes == 16 * 1024**3
    assert plan.entrypoint_resources == {"spotrain-capacity-spot": 0.001}
    assert plan.env_vars["SPOTRAIN_JOB_ID"] == "job-1"
    assert plan.env_vars["SPOTRAIN_ATTEMPT"] == "1"
    assert plan.env_vars["SPOTRAIN_CHECKPOINT_URI"] == "file:///ckpt/job-1"
    assert plan.env_vars["SEED"] == "7"
    assert "SPOTRAIN_RESUME_FROM" not in plan.env_vars


def test_a_multi_node_driver_holds_no_gpu_and_any_capacity_pins_nothing() -> None:
    third = Attempt(number=3, submission_id="job-1-3", submitted_at=NOW, resumed_from="gs://b/j/s")
    plan = policy.plan_submission(
        queued_record(request(2, workers=4)), third, checkpoint_uri="gs://b/j"
    )
    assert (plan.entrypoint_num_gpus, plan.entrypoint_num_cpus) == (0, 0)
    assert plan.entrypoint_resources == {}
    assert plan.env_vars["SPOTRAIN_NUM_WORKERS"] == "4"
    assert plan.env_vars["SPOTRAIN_RESUME_FROM"] == "gs://b/j/s"
    assert plan.submission_id == "job-1-3"


def test_a_multi_node_spot_job_puts_its_workers_on_spot_and_its_driver_on_the_head() -> None:
    """Issue 18: the driver asks for nothing (Ray runs it on the head, on-demand), so losing
    a spot node never loses the attempt; the workers get the capacity pin, and the range."""
    elastic = request(2, workers=2, capacity=CapacityClass.SPOT, max_workers=4)
    record = queued_record(elastic)
    plan = policy.plan_submission(record, record.attempts[0], checkpoint_uri="gs://b/j")
    assert plan.entrypoint_resources == {}
    assert (plan.entrypoint_num_gpus, plan.entrypoint_num_cpus) == (0, 0)
    env = plan.env_vars
    assert (env["SPOTRAIN_NUM_WORKERS"], env["SPOTRAIN_MAX_WORKERS"]) == ("2", "4")
    assert json.loads(env["SPOTRAIN_WORKER_RESOURCES"]) == {"spotrain-capacity-spot": 0.001}
    assert (env["SPOTRAIN_GPUS_PER_WORKER"], env["SPOTRAIN_CPUS_PER_WORKER"]) == ("2", "4.0")
    # Ray Train tuned for capacity that goes: a restart after a notice takes seconds.
    assert env["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] == "3"
    assert env["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] == "1"
    single = queued_record(request(2, capacity=CapacityClass.SPOT))
    alone = policy.plan_submission(single, single.attempts[0], checkpoint_uri="gs://b/j")
    assert not any(name.startswith("RAY_TRAIN_") for name in alone.env_vars)


def status(state: RayJobState, **fields: object) -> RayJobStatus:
    return RayJobStatus(state=state, **fields)  # type: ignore[arg-type]


R, J, A = RayJobState, JobState, AttemptState
SCRIPT_ERROR = status(R.FAILED, error_type="JOB_ENTRYPOINT_COMMAND_ERROR", message="exit 1")
NODE_DIED = status(R.FAILED, error_type="JOB_SUPERVISOR_ACTOR_DIED", message="node died")


@pytest.mark.parametrize(
    ("ray", "reason", "job_state", "attempt_state"),
    [
        pytest.param(None, Reason.NOT_SUBMITTED, J.QUEUED, A.SUBMITTED, id="ray-never-heard"),
        pytest.param(status(R.PENDING), Reason.UNCHANGED, J.QUEUED, A.SUBMITTED, id="pending"),
        pytest.param(status(R.RUNNING), Reason.STARTED, J.RUNNING, A.RUNNING, id="running"),
        pytest.param(status(R.SUCCEEDED), Reason.SUCCEEDED, J.SUCCEEDED, A.SUCCEEDED, id="done"),
        pytest.param(SCRIPT_ERROR, Reason.USER_ERROR, J.FAILED, A.FAILED, id="users-error"),
        pytest.param(NODE_DIED, Reason.NODE_LOST, J.INTERRUPTED, A.LOST, id="lost-node"),
        pytest.param(
            status(
                R.FAILED,
                error_type="JOB_SUPERVISOR_ACTOR_START_FAILURE",
                message="Unexpected error occurred: failed to get job supervisor.",
            ),
            Reason.NODE_LOST,
            J.INTERRUPTED,
            A.LOST,
            id="supervisor-gone-with-its-node",
        ),
        pytest.param(status(R.STOPPED), Reason.CANCELLED, J.CANCELLED, A.STOPPED, id="stopped"),
    ],
)
def test_ray_status_moves_the_record(
    ray: RayJobStatus | None, reason: Reason, job_state: JobState, attempt_state: AttemptState
) -> None:
    transition = policy.on_ray_status(queued_record(), ray, NOW)
    assert transition.reason is reason
    assert transition.record.state is job_state
    assert transition.record.attempts[-1].state is attempt_state


def test_the_same_status_twice_changes_nothing_the_second_time() -> None:
    running = policy.on_ray_status(queued_record(), status(RayJobState.RUNNING), NOW).record
    again = policy.on_ray_status(running, status(RayJobState.RUNNING), NOW)
    assert again.reason is Reason.UNCHANGED
    assert again.facts == ()


def test_a_failure_after_a_cancel_request_is_a_cancellation() -> None:
    flagged = policy.cancel(queued_record(), NOW).record
    transition = policy.on_ray_status(flagged, status(RayJobState.FAILED, message="killed"), NOW)
    assert transition.reason is Reason.CANCELLED


def test_cancelling_a_job_with_nothing_running_ends_it_at_once() -> None:
    record = queued_record()
    lost = policy.on_ray_status(
        record, status(RayJobState.FAILED, error_type="JOB_SUPERVISOR_ACTOR_DIED"), NOW
    ).record
    transition = policy.cancel(lost, NOW)
    assert transition.reason is Reason.CANCELLED
    assert transition.record.state is JobState.CANCELLED


def test_an_attempt_that_ended_between_two_looks_is_reported_started_first() -> None:
    transition = policy.on_ray_status(queued_record(), status(R.SUCCEEDED), NOW)
    assert [fact.key for fact in transition.facts] == ["started-job-1-1", "succeeded-job-1-1"]
    running = policy.on_ray_status(queued_record(), status(R.RUNNING), NOW).record
    after = policy.on_ray_status(running, status(R.SUCCEEDED), NOW)
    assert [fact.key for fact in after.facts] == ["succeeded-job-1-1"]


def report(step: int, attempt: int = 1, **metrics: float) -> ProgressReport:
    return ProgressReport(
        job_id="job-1", attempt=attempt, step=step, metrics=metrics, updated_at=NOW
    )


RUNNING = policy.on_ray_status(queued_record(), status(R.RUNNING), NOW).record


@pytest.mark.parametrize(
    ("record", "progress", "reason"),
    [
        pytest.param(RUNNING, report(5, loss=0.3), Reason.PROGRESSED, id="first-report"),
        pytest.param(RUNNING, None, Reason.UNCHANGED, id="nothing-reported"),
        pytest.param(RUNNING, report(5, attempt=2), Reason.UNCHANGED, id="another-attempts-file"),
        pytest.param(queued_record(), report(5), Reason.UNCHANGED, id="not-running-yet"),
        pytest.param(
            policy.on_progress(RUNNING, report(5), NOW).record,
            report(5),
            Reason.UNCHANGED,
            id="same-step",
        ),
    ],
)
def test_progress_is_published_for_the_running_attempt_only(
    record: JobRecord, progress: ProgressReport | None, reason: Reason
) -> None:
    assert policy.on_progress(record, progress, NOW).reason is reason


def test_non_finite_metrics_stay_out_of_events() -> None:
    transition = policy.on_progress(RUNNING, report(7, loss=float("nan"), acc=0.9), NOW)
    [fact] = transition.facts
    assert fact.data.metrics == {"acc": 0.9}  # type: ignore[attr-defined]
    assert fact.key == "progress-job-1-1-7"


def workers_report(step: int, workers: int) -> ProgressReport:
    return ProgressReport(
        job_id="job-1", attempt=1, step=step, metrics={}, updated_at=NOW, workers=workers
    )


ELASTIC = policy.on_ray_status(
    queued_record(request(1, workers=2, max_workers=4, capacity=CapacityClass.SPOT)),
    status(R.RUNNING),
    NOW,
).record


def resizes(record: JobRecord, *reports: ProgressReport) -> list[tuple[int | None, int, str]]:
    """(previous, workers, reason) of each `job.resized` the reports publish, in turn."""
    seen = []
    for progress in reports:
        transition = policy.on_progress(record, progress, NOW)
        record = transition.record
        seen += [
            (f.data.previous, f.data.workers, f.data.reason.value)
            for f in transition.facts
            if isinstance(f.data, JobResized)
        ]
    return seen


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        pytest.param([workers_report(10, 4)], [(None, 4, "counted")], id="first-count"),
        pytest.param(
            [workers_report(10, 4), workers_report(20, 4)], [(None, 4, "counted")], id="same"
        ),
        pytest.param(
            # The group restarted on 3 from the checkpoint of step 15: steps went back.
            [workers_report(20, 4), workers_report(16, 3), workers_report(30, 4)],
            [(None, 4, "counted"), (4, 3, "shrank"), (3, 4, "grew")],
            id="shrank-then-grew",
        ),
        pytest.param([report(10)], [], id="a-single-node-run-says-nothing"),
    ],
)
def test_a_new_worker_count_is_a_resize(
    reports: list[ProgressReport], expected: list[tuple[int | None, int, str]]
) -> None:
    assert resizes(ELASTIC, *reports) == expected


def test_a_resize_says_what_the_scaler_needs_and_the_step_it_went_back_to() -> None:
    record = policy.on_progress(ELASTIC, workers_report(20, 4), NOW).record
    transition = policy.on_progress(record, workers_report(16, 3), NOW)
    # Ray Train went back to the checkpoint of step 16 to resize: the attempt is there now.
    resized, progressed = (fact.data for fact in transition.facts)
    assert isinstance(resized, JobResized)
    assert (resized.min_workers, resized.max_workers, resized.step) == (2, 4, 16)
    assert resized.capacity is CapacityClass.SPOT
    assert resized.worker == ELASTIC.request.worker
    assert progressed.step == 16  # type: ignore[attr-defined]
    current = transition.record.current
    assert current is not None
    assert (current.workers, current.step) == (3, 16)


def nodes_report(step: int, workers: int | None = None) -> ProgressReport:
    return ProgressReport(
        job_id="job-1", attempt=1, step=step, metrics={}, updated_at=NOW, workers=workers
    )


@pytest.mark.parametrize(
    ("before", "report", "wanted"),
    [
        pytest.param([], nodes_report(5, 4), True, id="before-the-first-count"),
        pytest.param([], nodes_report(5), True, id="a-script-that-does-not-count"),
        pytest.param([nodes_report(5, 4)], nodes_report(9, 4), False, id="a-step-on"),
        pytest.param([nodes_report(5, 4)], nodes_report(9, 3), True, id="a-new-count"),
        pytest.param([nodes_report(9, 4)], nodes_report(5, 4), True, id="the-step-went-back"),
    ],
)
def test_where_the_workers_are_is_asked_only_when_the_group_may_have_changed(
    before: list[ProgressReport], report: ProgressReport, wanted: bool
) -> None:
    record = ELASTIC
    for earlier in before:
        record = policy.on_progress(record, earlier, NOW, worker_nodes=("w-1",) * 4).record
    assert policy.wants_worker_nodes(record, report) is wanted


def test_a_single_node_job_never_asks_where_its_workers_are() -> None:
    record = policy.on_ray_status(queued_record(request(1)), status(R.RUNNING), NOW).record
    assert policy.wants_worker_nodes(record, report(1)) is False


def test_a_resize_names_its_workers_nodes_and_the_steps_the_restart_went_back() -> None:
    first = policy.on_progress(ELASTIC, nodes_report(20, 3), NOW, worker_nodes=("a", "b", "c"))
    moved = policy.on_progress(first.record, nodes_report(16, 3), NOW, worker_nodes=("a", "b", "d"))
    [counted] = [f.data for f in first.facts if isinstance(f.data, JobResized)]
    [resized] = [f.data for f in moved.facts if isinstance(f.data, JobResized)]
    assert (counted.nodes, counted.steps_lost) == (("a", "b", "c"), 0)
    # Same count, other nodes: a node went and another was there when the group restarted.
    assert (resized.reason, resized.nodes, resized.steps_lost) == (
        ResizeReason.MOVED,
        ("a", "b", "d"),
        4,
    )
    current = moved.record.current
    assert current is not None
    assert current.worker_nodes == ("a", "b", "d")


def test_a_script_that_does_not_count_its_workers_is_counted_where_ray_says_they_are() -> None:
    transition = policy.on_progress(ELASTIC, nodes_report(3), NOW, worker_nodes=("a", "b"))
    [counted] = [f.data for f in transition.facts if isinstance(f.data, JobResized)]
    assert (counted.workers, counted.reason, counted.nodes) == (2, ResizeReason.COUNTED, ("a", "b"))
    # Ray could not say: nothing is counted, and it is asked again at the next report.
    unknown = policy.on_progress(ELASTIC, nodes_report(3), NOW, worker_nodes=None)
    assert not [f for f in unknown.facts if isinstance(f.data, JobResized)]
    assert policy.wants_worker_nodes(unknown.record, nodes_report(4))


def later(s: float) -> datetime:
    return NOW + timedelta(seconds=s)


def test_every_running_multi_node_attempt_has_its_workers_looked_for() -> None:
    running = policy.on_ray_status(ELASTIC, status(R.RUNNING), NOW).record
    assert policy.watches_workers(running)
    single = policy.on_ray_status(queued_record(request(1)), status(R.RUNNING), NOW).record
    assert not policy.watches_workers(single)


def test_an_attempt_waiting_for_its_first_gang_is_not_counted_short() -> None:
    # Its own demand stands for the gang until it first runs: no growth is asked beside it.
    assert policy.on_workers_seen(ELASTIC, ("a",), later(60), fallback_after_s=120).reason is (
        policy.Reason.UNCHANGED
    )


def counted(*nodes: str) -> JobRecord:
    return policy.on_workers_seen(ELASTIC, nodes, NOW, fallback_after_s=120).record


def test_a_script_that_never_reports_is_counted_where_ray_says_its_workers_are() -> None:
    transition = policy.on_workers_seen(ELASTIC, ("a", "b"), NOW, fallback_after_s=120)
    [resized] = [f.data for f in transition.facts]
    assert isinstance(resized, JobResized)
    assert (resized.workers, resized.reason, resized.nodes) == (2, ResizeReason.COUNTED, ("a", "b"))
    again = policy.on_workers_seen(transition.record, ("a", "b"), later(5), fallback_after_s=120)
    assert again.reason is policy.Reason.UNCHANGED


def test_a_lost_worker_is_a_resize_at_once_so_the_scaler_asks_for_its_room() -> None:
    transition = policy.on_workers_seen(counted("a", "b"), ("a",), later(5), fallback_after_s=120)
    [resized] = [f.data for f in transition.facts]
    assert isinstance(resized, JobResized)
    assert (resized.workers, resized.previous, resized.reason) == (1, 2, ResizeReason.SHRANK)
    assert resized.min_workers == 2  # below MIN: the scaler wants one worker's room now
    current = transition.record.current
    assert current is not None
    assert current.short_of_workers_since == later(5)


def test_no_worker_at_all_is_a_resize_only_while_the_group_waits_for_room() -> None:
    # Between two groups, or between a run's last step and its driver's end, Ray holds none
    # of its workers either, and no placement group of the job waits.
    between = policy.on_workers_seen(
        counted("a", "b"), (), later(5), fallback_after_s=120, waits_for_room=False
    )
    assert between.reason is policy.Reason.UNCHANGED
    down = policy.on_workers_seen(
        counted("a", "b"), (), later(5), fallback_after_s=120, waits_for_room=True
    )
    [resized] = [f.data for f in down.facts]
    assert isinstance(resized, JobResized)
    assert (resized.workers, resized.previous) == (0, 2)


def test_a_new_report_at_the_same_step_says_the_group_restarted_smaller() -> None:
    # A notice: the workers saved at step 280, and the group went on from it with fewer.
    record = policy.on_progress(ELASTIC, nodes_report(280, 4), NOW).record
    restarted = nodes_report(280, 2).model_copy(update={"updated_at": later(20)})
    transition = policy.on_progress(record, restarted, later(21))
    [resized] = [f.data for f in transition.facts if isinstance(f.data, JobResized)]
    assert (resized.previous, resized.workers, resized.reason) == (4, 2, ResizeReason.SHRANK)


def test_a_stale_report_does_not_undo_what_ray_said_since() -> None:
    record = policy.on_progress(ELASTIC, nodes_report(5, 2), NOW).record
    shrunk = policy.on_workers_seen(record, ("a",), later(5), fallback_after_s=120).record
    again = policy.on_progress(shrunk, nodes_report(5, 2), later(6))
    assert again.reason is policy.Reason.UNCHANGED


def short_story(*seen: tuple[float, tuple[str, ...] | None]) -> list[policy.Transition]:
    record, transitions = counted("a", "b"), []
    for at_s, alive in seen:
        transition = policy.on_workers_seen(
            record, alive, later(at_s), fallback_after_s=120, waits_for_room=True
        )
        record = transition.record
        transitions.append(transition)
    return transitions


def test_an_elastic_attempt_short_of_its_min_for_too_long_is_lost_to_go_on_afresh() -> None:
    *waiting, fell_back = short_story(
        (20, ("a",)), (80, ()), (100, ("a",)), (139, ("a",)), (140, ("a",))
    )
    assert [t.reason for t in waiting] == [
        policy.Reason.SHORT_OF_WORKERS,  # noted: short since 20
        policy.Reason.SHORT_OF_WORKERS,  # its group is down (already short): room for both
        policy.Reason.SHORT_OF_WORKERS,
        policy.Reason.UNCHANGED,
    ]
    resized = [f.data for t in waiting for f in t.facts if isinstance(f.data, JobResized)]
    assert [r.workers for r in resized] == [1, 0, 1]
    assert fell_back.reason is policy.Reason.NODE_LOST
    [interrupted] = [f.data for f in fell_back.facts]
    assert isinstance(interrupted, JobInterrupted)
    assert interrupted.cause is InterruptionCause.SHORT_OF_WORKERS
    lost = fell_back.record.current
    assert lost is not None
    assert lost.state is AttemptState.LOST
    assert "1 of its 2 workers" in (lost.message or "")


@pytest.mark.parametrize(
    "seen",
    [
        pytest.param([(20, ("a",)), (100, ("a", "b")), (200, ("a",))], id="it-got-them-back"),
        pytest.param(
            [(20, ("a",)), (100, None), (139, ("a",))], id="ray-could-not-say-and-time-is-not-up"
        ),
    ],
)
def test_an_elastic_attempt_that_holds_its_min_again_starts_the_count_over(
    seen: list[tuple[float, tuple[str, ...] | None]],
) -> None:
    assert all(t.reason is not policy.Reason.NODE_LOST for t in short_story(*seen))


def test_a_report_says_the_group_is_up() -> None:
    short = short_story((20, ("a",)))[-1].record
    progressed = policy.on_progress(short, nodes_report(5, 2), later(30), worker_nodes=("a", "b"))
    current = progressed.record.current
    assert current is not None
    assert current.short_of_workers_since is None


def _at(record: JobRecord, state: AttemptState, **fields: object) -> JobRecord:
    attempt = record.attempts[-1].model_copy(update={"state": state})
    return record.model_copy(update={"attempts": (attempt,), **fields})


@pytest.mark.parametrize(
    ("state", "fields", "answered", "tracked"),
    [
        pytest.param(AttemptState.QUEUED, {}, True, False, id="queued"),
        pytest.param(AttemptState.SUBMITTED, {}, False, True, id="handed-to-ray"),
        pytest.param(AttemptState.RUNNING, {}, False, True, id="running"),
        pytest.param(AttemptState.SUCCEEDED, {}, False, False, id="ended"),
        pytest.param(
            AttemptState.SUBMITTED, {"waiting_for": "quota"}, False, False, id="gave-way-waits"
        ),
    ],
)
def test_what_a_repeated_request_and_the_tracker_do_with_an_attempt(
    state: AttemptState, fields: dict[str, object], answered: bool, tracked: bool
) -> None:
    """A repeat is answered while the first attempt waits in the queue; the tracker asks
    Ray only about attempts Ray holds."""
    record = _at(waiting_record(), state, **fields)
    assert policy.answers_request(record) is answered
    assert policy.tracked(record) is tracked


@pytest.mark.parametrize(
    ("gpus", "priority", "expected"),
    [
        pytest.param(2, 5, True, id="as-large-and-as-urgent-waits-too"),
        pytest.param(4, 3, True, id="larger-and-lower-waits-too"),
        pytest.param(1, 5, False, id="smaller-is-looked-at"),
        pytest.param(2, 7, False, id="more-urgent-is-looked-at"),
    ],
)
def test_a_waiting_job_behind_one_of_its_class_that_had_to_wait(
    gpus: int, priority: int, expected: bool
) -> None:
    record = waiting_record(request(gpus, priority=priority, capacity=CapacityClass.SPOT))
    record = record.model_copy(update={"team": "vision"})
    blocked = {policy.waiting_class(record): (2, 5)}
    assert policy.waits_behind(record, blocked) is expected
    assert not policy.waits_behind(record, {("nlp", CapacityClass.SPOT): (1, 9)})


HEAD_GONE = status(
    R.FAILED,
    error_type="JOB_SUPERVISOR_ACTOR_START_FAILURE",
    message="Unexpected error occurred: failed to get job supervisor.",
)


def test_a_running_attempt_ray_no_longer_knows_was_lost_with_the_head() -> None:
    """A head back without its state knows none of the jobs it ran: each running attempt
    went with the cluster, and goes on as a new one, on the platform's account."""
    running = policy.on_ray_status(queued_record(), status(R.RUNNING, node="n1"), NOW).record
    transition = policy.on_ray_status(running, None, NOW)
    assert transition.reason is Reason.NODE_LOST
    lost = transition.record.attempts[-1]
    assert (lost.state, lost.cause) == (A.LOST, InterruptionCause.HEAD_LOST)
    [fact] = transition.facts
    assert isinstance(fact.data, JobInterrupted)
    assert fact.data.cause is InterruptionCause.HEAD_LOST
    assert transition.record.interruptions == 0, "a head's loss spends no restart"


@pytest.mark.parametrize(
    ("workers", "ray", "lost_workers", "cause"),
    [
        # A multi-node driver runs on the head: its supervisor dying there is the head's.
        pytest.param(2, HEAD_GONE, (), InterruptionCause.HEAD_LOST, id="driver-on-the-head"),
        pytest.param(2, NODE_DIED, (), InterruptionCause.HEAD_LOST, id="supervisor-died-there"),
        # Its workers' node died too: that loss is the job's capacity's.
        pytest.param(2, HEAD_GONE, ("n2",), InterruptionCause.NODE_LOST, id="workers-lost-too"),
        # A single-node driver runs on its own pool node: its loss is the node's.
        pytest.param(1, HEAD_GONE, (), InterruptionCause.NODE_LOST, id="single-node"),
    ],
)
def test_a_supervisor_lost_off_the_pools_is_the_heads_loss(
    workers: int, ray: RayJobStatus, lost_workers: tuple[str, ...], cause: InterruptionCause
) -> None:
    record = queued_record(request(1, workers))
    running = policy.on_ray_status(record, status(R.RUNNING), NOW).record
    transition = policy.on_ray_status(running, ray, NOW, lost_worker_nodes=lost_workers)
    lost = transition.record.attempts[-1]
    assert (lost.state, lost.cause) == (A.LOST, cause)


def test_an_attempt_ray_forgot_before_it_ran_is_handed_to_it_again() -> None:
    transition = policy.on_ray_status(queued_record(), None, NOW)
    assert transition.reason is Reason.NOT_SUBMITTED
    assert transition.record == queued_record()


@pytest.mark.parametrize(
    ("live", "waited_s", "goes_on"),
    [
        # Every node it ran on joined the new head, restarted: nothing of it runs there.
        pytest.param(frozenset({"n1", "n2", "n9"}), 0.0, True, id="its-nodes-rejoined"),
        # One has not: its old raylet may still run the attempt's processes.
        pytest.param(frozenset({"n1"}), 0.0, False, id="a-node-not-back"),
        pytest.param(None, 0.0, False, id="ray-cannot-say"),
        # A node that never comes back holds nothing up past the wait.
        pytest.param(frozenset(), policy.FORGOTTEN_NODES_WAIT_S, True, id="waited-enough"),
    ],
)
def test_what_ray_forgot_goes_on_once_the_nodes_it_ran_on_rejoined(
    live: frozenset[str] | None, waited_s: float, goes_on: bool
) -> None:
    running = policy.on_ray_status(queued_record(), status(R.RUNNING, node="n1"), NOW).record
    attempt = running.attempts[-1].model_copy(update={"worker_nodes": ("n2",)})
    assert policy.ran_on(attempt) == {"n1", "n2"}
    assert policy.forgotten_may_go_on(attempt, live, waited_s) is goes_on


def test_an_attempt_ray_never_heard_of_on_no_node_goes_on_at_once() -> None:
    record = waiting_record()
    assert policy.forgotten_may_go_on(record.attempts[-1], None, 0.0)
