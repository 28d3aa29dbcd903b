"""The submitter's handlers through the in-memory bus and fakes of its ports."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from services.submitter.handlers import (
    Deps,
    admit_waiting,
    on_job_cancel_requested,
    on_job_failed,
    on_job_placed,
    on_job_requested,
    on_job_resumed,
    track_attempts,
)
from services.submitter.model import RayJobState
from services.submitter.policy import Quotas
from services.submitter.ports import Revision, StaleRevisionError
from shared.checkpoints import ProgressReport
from shared.events import decode, new_event
from shared.events.data import (
    InterruptionCause,
    JobCancelRequested,
    JobFailed,
    JobResumed,
    RejectionReason,
)
from shared.events.types import CapacityClass
from shared.jobs import JobRecord
from shared.messaging import Unhandleable
from shared.messaging.memory import InMemoryBus
from tests.events import NOW, job_placed, job_requested
from tests.fakes.clock import FixedClock
from tests.fakes.submitter import FakeProgress, FakeRay, FakeWorkspaces, InMemoryJobStore


@pytest.fixture
def deps(tmp_path: Path) -> Deps:
    return Deps(
        bus=InMemoryBus(),
        clock=FixedClock(),
        store=InMemoryJobStore(),
        ray=FakeRay(),
        workspaces=FakeWorkspaces(tmp_path),
        progress=FakeProgress(),
        quotas=Quotas(max_gpus_per_job=4, max_gpus_per_owner=4),
        checkpoint_root="file:///checkpoints",
    )


def published(deps: Deps) -> list[tuple[str, Any]]:
    bus = deps.bus
    assert isinstance(bus, InMemoryBus)
    return [(decode(m.data).type.split(".")[2], decode(m.data).data) for m in bus.messages]


def types(deps: Deps) -> list[str]:
    return [kind for kind, _ in published(deps)]


def ray(deps: Deps) -> FakeRay:
    assert isinstance(deps.ray, FakeRay)
    return deps.ray


async def placed(deps: Deps, request: Any, node: str = "gpu-spot-1") -> None:
    """Requested, then placed by the scaler on `node`: handed to Ray."""
    await on_job_requested(request, deps)
    await on_job_placed(job_placed(request.data.job_id, nodes=(node,)), deps)


async def test_a_request_is_accepted_and_queued_once_and_nothing_reaches_ray_until_placed(
    deps: Deps,
) -> None:
    request = job_requested("job-7", experiment="resnet")
    await on_job_requested(request, deps)
    await on_job_requested(request, deps)
    assert types(deps) == ["accepted", "queued"]
    assert ray(deps).submitted == [], "it waits in the platform's queue, not in Ray's"
    await track_attempts(deps)
    assert ray(deps).submitted == [], "a queued attempt is not repaired into Ray"
    placement = job_placed("job-7", nodes=("gpu-spot-3",))
    await on_job_placed(placement, deps)
    await on_job_placed(placement, deps)
    [(plan, _)] = ray(deps).submitted
    assert plan.submission_id == "job-7-1"
    assert plan.env_vars["SPOTRAIN_CHECKPOINT_URI"] == "file:///checkpoints/job-7"
    assert plan.entrypoint_label_selector == {"spotrain-node": "in(gpu-spot-3)"}
    assert isinstance(deps.store, InMemoryJobStore)
    [attempt] = deps.store.records["job-7"][0].attempts
    assert (attempt.state.value, attempt.placed_on) == ("submitted", ("gpu-spot-3",))


async def test_a_placement_for_another_attempt_or_queueing_hands_nothing_to_ray(
    deps: Deps,
) -> None:
    await on_job_requested(job_requested("job-o"), deps)
    await on_job_placed(job_placed("job-o", attempt=2), deps)
    await on_job_placed(job_placed("job-o", requeued=1), deps)
    assert ray(deps).submitted == []


async def test_a_queued_job_cancelled_leaves_nothing_in_ray(deps: Deps) -> None:
    await on_job_requested(job_requested("job-q"), deps)
    cancel = new_event(
        JobCancelRequested(job_id="job-q", requested_by="alice"), source="t", time=NOW
    )
    await on_job_cancel_requested(cancel, deps)
    await on_job_placed(job_placed("job-q"), deps)  # a placement already on its way
    assert types(deps)[-1] == "cancelled"
    assert ray(deps).submitted == []
    assert ray(deps).stopped == []


async def test_ray_failing_to_start_a_placed_attempt_sends_it_back_to_the_queue(
    deps: Deps,
) -> None:
    """Ray's supervisor timed out waiting for room: the platform's capacity failed, not
    the job. Back in the queue under a new Ray id; no start, no failure, no restart."""
    await placed(deps, job_requested("job-t"))
    ray(deps).set(
        "job-t-1",
        RayJobState.FAILED,
        error_type="JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
        message="Job supervisor actor failed to start within 900.0 seconds",
    )
    await track_attempts(deps)
    assert types(deps) == ["accepted", "queued", "queued"]
    requeued = published(deps)[-1][1]
    assert (requeued.attempt, requeued.requeued) == (1, 1)
    assert isinstance(deps.store, InMemoryJobStore)
    record = deps.store.records["job-t"][0]
    [attempt] = record.attempts
    assert (record.state.value, attempt.state.value, attempt.placed_on) == ("queued", "queued", ())
    await on_job_placed(job_placed("job-t", nodes=("gpu-spot-2",), requeued=1), deps)
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["job-t-1", "job-t-1-r1"]
    ray(deps).set("job-t-1-r1", RayJobState.RUNNING, node="gpu-spot-2")
    ray(deps).set("job-t-1-r1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    assert types(deps)[-2:] == ["started", "succeeded"]


async def test_a_placement_elsewhere_before_ray_started_the_attempt_moves_it(
    deps: Deps,
) -> None:
    """Its first node went before Ray started it; the scaler placed it again."""
    await placed(deps, job_requested("job-m"), "gpu-spot-1")
    await on_job_placed(job_placed("job-m", nodes=("gpu-spot-4",)), deps)
    assert ray(deps).stopped == ["job-m-1"]
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["job-m-1", "job-m-1-r1"]
    assert ray(deps).submitted[-1][0].entrypoint_label_selector == {
        "spotrain-node": "in(gpu-spot-4)"
    }
    # Its second node goes too: the scaler places the same queueing once more, and the
    # attempt follows under a third Ray id.
    await on_job_placed(job_placed("job-m", nodes=("gpu-spot-5",)), deps)
    assert ray(deps).stopped == ["job-m-1", "job-m-1-r1"]
    assert ray(deps).submitted[-1][0].submission_id == "job-m-1-r2"


async def test_a_placement_elsewhere_of_an_attempt_ray_already_runs_changes_nothing(
    deps: Deps,
) -> None:
    await placed(deps, job_requested("job-k"), "gpu-spot-1")
    ray(deps).set("job-k-1", RayJobState.RUNNING, node="gpu-spot-1")
    await on_job_placed(job_placed("job-k", nodes=("gpu-spot-4",)), deps)
    assert ray(deps).stopped == []
    assert len(ray(deps).submitted) == 1


async def test_a_request_over_quota_is_rejected_with_the_reason(deps: Deps) -> None:
    request = job_requested("job-big", worker={"gpus": 4}, num_workers=2)
    await on_job_requested(request, deps)
    [(kind, rejected)] = published(deps)
    assert kind == "rejected"
    assert rejected.detail == "the job asks for 8 GPUs; the limit per job is 4"
    assert ray(deps).submitted == []


async def test_a_deadline_that_cannot_be_met_is_rejected_and_nothing_is_queued(
    deps: Deps,
) -> None:
    """Any tool may publish the request: the submitter does the arithmetic too."""
    now = deps.clock.now()
    request = job_requested("job-late", deadline=now + timedelta(hours=2), estimate_s=3 * 3600)
    await on_job_requested(request, deps)
    [(kind, rejected)] = published(deps)
    assert kind == "rejected"
    assert rejected.reason is RejectionReason.DEADLINE_UNREACHABLE
    assert "needs 3h00m at its estimate, but only 2h00m remain" in rejected.detail
    assert "it would end 1h00m late" in rejected.detail
    assert ray(deps).submitted == []


async def test_a_deadline_job_is_queued_with_its_deadline_and_the_work_it_needs(
    deps: Deps,
) -> None:
    """What the scaler's deadline policy decides from."""
    deadline = deps.clock.now() + timedelta(hours=12)
    request = job_requested("job-dl", deadline=deadline, estimate_s=6 * 3600)
    await on_job_requested(request, deps)
    queued = next(data for kind, data in published(deps) if kind == "queued")
    assert queued.deadline == deadline
    assert queued.work_left_s == 6 * 3600


async def test_a_request_past_its_owners_quota_waits_and_is_queued_once_it_frees(
    deps: Deps,
) -> None:
    await placed(deps, job_requested("job-a", worker={"gpus": 3}))
    await on_job_requested(job_requested("job-b", worker={"gpus": 2}), deps)
    assert types(deps) == ["accepted", "queued", "accepted"], "accepted, not queued yet"
    assert isinstance(deps.store, InMemoryJobStore)
    waiting = deps.store.records["job-b"][0]
    assert waiting.waiting_for == (
        "alice holds 3 GPUs; with this job's 2 that is 5, over their quota of 4: it waits "
        "for their running jobs to end"
    )
    await admit_waiting(deps)
    assert types(deps)[-1] == "accepted", "still over the quota"
    ray(deps).set("job-a-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    await admit_waiting(deps)
    assert types(deps)[-1] == "queued"
    assert deps.store.records["job-b"][0].waiting_for is None


async def test_an_owner_past_their_queue_depth_is_refused_with_the_numbers(deps: Deps) -> None:
    deps = replace(
        deps, quotas=Quotas(max_gpus_per_job=4, max_gpus_per_owner=1, max_waiting_per_owner=2)
    )
    for n in range(4):
        await on_job_requested(job_requested(f"job-{n}", worker={"gpus": 1}), deps)
    assert types(deps) == ["accepted", "queued", "accepted", "accepted", "rejected"]
    rejected = published(deps)[-1][1]
    assert rejected.reason is RejectionReason.QUOTA_EXCEEDED
    assert rejected.detail == (
        "alice already has 2 jobs waiting for quota, the most one person may queue (2); "
        "cancel some or wait"
    )


async def test_two_requests_of_one_owner_at_once_cannot_both_pass_the_quota(deps: Deps) -> None:
    """Each asks for 3 of the owner's 4 GPUs: handled concurrently, only one is queued for
    room; the other waits for the quota."""
    await asyncio.gather(
        on_job_requested(job_requested("job-p", worker={"gpus": 3}), deps),
        on_job_requested(job_requested("job-q", worker={"gpus": 3}), deps),
    )
    assert sorted(types(deps)) == ["accepted", "accepted", "queued"]


async def test_a_job_id_reused_by_another_request_is_unhandleable(deps: Deps) -> None:
    await on_job_requested(job_requested("job-x"), deps)
    with pytest.raises(Unhandleable, match="already taken"):
        await on_job_requested(job_requested("job-x", entrypoint=("python", "other.py")), deps)


async def test_the_tracker_follows_an_attempt_to_success(deps: Deps) -> None:
    await placed(deps, job_requested("job-ok"))
    await track_attempts(deps)
    ray(deps).set("job-ok-1", RayJobState.RUNNING)
    await track_attempts(deps)
    await track_attempts(deps)
    ray(deps).set("job-ok-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    await track_attempts(deps)
    assert types(deps) == ["accepted", "queued", "started", "succeeded"]
    assert isinstance(deps.store, InMemoryJobStore)
    assert deps.store.state_of("job-ok") == "succeeded"


async def test_a_script_error_fails_the_job_and_a_lost_node_interrupts_it(deps: Deps) -> None:
    await placed(deps, job_requested("job-bug"))
    await placed(deps, job_requested("job-lost", owner="bob"))
    ray(deps).set(
        "job-bug-1",
        RayJobState.FAILED,
        error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
        message="ZeroDivisionError",
    )
    ray(deps).set(
        "job-lost-1",
        RayJobState.FAILED,
        error_type="JOB_SUPERVISOR_ACTOR_DIED",
        message="node died",
    )
    await track_attempts(deps)
    ended = dict(published(deps)[-4:])
    assert ended["failed"].message == "ZeroDivisionError"
    assert ended["interrupted"].job_id == "job-lost"
    assert types(deps).count("started") == 2, "each attempt is reported started before its end"


async def test_a_restarted_submitter_submits_an_attempt_ray_never_heard_of(deps: Deps) -> None:
    await placed(deps, job_requested("job-crash"))
    ray(deps).statuses.clear()  # as if the process died between the record and Ray
    ray(deps).submitted.clear()
    await track_attempts(deps)
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["job-crash-1"]


async def test_cancel_stops_the_running_attempt_and_ends_the_job(deps: Deps) -> None:
    await placed(deps, job_requested("job-c"))
    ray(deps).set("job-c-1", RayJobState.RUNNING)
    await track_attempts(deps)
    cancel = new_event(
        JobCancelRequested(job_id="job-c", requested_by="alice"), source="t", time=NOW
    )
    await on_job_cancel_requested(cancel, deps)
    assert ray(deps).stopped == ["job-c-1"]
    await track_attempts(deps)
    assert types(deps)[-1] == "cancelled"
    assert isinstance(deps.store, InMemoryJobStore)
    assert deps.store.state_of("job-c") == "cancelled"


async def test_a_job_is_its_owners_to_cancel(deps: Deps) -> None:
    """Bob's request to cancel alice's job is refused, and the job runs on untouched."""
    await placed(deps, job_requested("job-a"))
    ray(deps).set("job-a-1", RayJobState.RUNNING)
    await track_attempts(deps)
    cancel = new_event(JobCancelRequested(job_id="job-a", requested_by="bob"), source="t", time=NOW)
    with pytest.raises(Unhandleable, match="bob may not cancel job-a: only alice may"):
        await on_job_cancel_requested(cancel, deps)
    assert ray(deps).stopped == []
    assert isinstance(deps.store, InMemoryJobStore)
    found = await deps.store.get("job-a")
    assert found is not None
    assert not found[0].cancel_requested


async def test_cancelling_an_unknown_job_is_unhandleable(deps: Deps) -> None:
    cancel = new_event(
        JobCancelRequested(job_id="nope", requested_by="alice"), source="t", time=NOW
    )
    with pytest.raises(Unhandleable, match="no job nope"):
        await on_job_cancel_requested(cancel, deps)


async def test_training_progress_is_published_once_per_step(deps: Deps) -> None:
    await placed(deps, job_requested("job-p"))
    ray(deps).set("job-p-1", RayJobState.RUNNING)
    assert isinstance(deps.progress, FakeProgress)
    uri = "file:///checkpoints/job-p"
    for step, loss in ((10, 0.9), (10, 0.9), (20, 0.5)):
        deps.progress.reports[uri] = ProgressReport(
            job_id="job-p",
            attempt=1,
            step=step,
            total_steps=100,
            metrics={"loss": loss},
            updated_at=NOW,
        )
        await track_attempts(deps)
    progress = [data for kind, data in published(deps) if kind == "progress"]
    assert [(p.step, p.metrics) for p in progress] == [(10, {"loss": 0.9}), (20, {"loss": 0.5})]
    assert isinstance(deps.store, InMemoryJobStore)
    assert deps.store.records["job-p"][0].attempts[-1].step == 20


async def test_the_last_report_of_a_run_that_ended_between_passes_comes_before_its_end(
    deps: Deps,
) -> None:
    await placed(deps, job_requested("job-e"))
    ray(deps).set("job-e-1", RayJobState.RUNNING)
    await track_attempts(deps)
    assert isinstance(deps.progress, FakeProgress)
    deps.progress.reports["file:///checkpoints/job-e"] = ProgressReport(
        job_id="job-e", attempt=1, step=60, total_steps=60, metrics={}, updated_at=NOW
    )
    ray(deps).set("job-e-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    assert types(deps)[-2:] == ["progress", "succeeded"]
    assert dict(published(deps))["progress"].step == 60


async def test_an_elastic_attempt_says_which_nodes_hold_its_workers_when_its_group_changes(
    deps: Deps,
) -> None:
    deps = replace(deps, quotas=Quotas(max_gpus_per_job=8, max_gpus_per_owner=8))
    await placed(deps, job_requested("job-w", num_workers=2, max_workers=4))
    ray(deps).set("job-w-1", RayJobState.RUNNING)
    assert isinstance(deps.progress, FakeProgress)
    uri = "file:///checkpoints/job-w"
    story = [
        (10, 4, ("a", "a", "b", "b")),
        (11, 4, ("a", "a", "b", "b")),
        (12, 4, ("a", "a", "b", "b")),
        (9, 2, ("b", "b")),  # a went: the group went on from the checkpoint of step 9
    ]
    for step, workers, nodes in story:
        ray(deps).workers["job-w-1"] = nodes
        deps.progress.reports[uri] = ProgressReport(
            job_id="job-w", attempt=1, step=step, metrics={}, updated_at=NOW, workers=workers
        )
        await track_attempts(deps)
    resized = [data for kind, data in published(deps) if kind == "resized"]
    assert [(r.workers, r.nodes, r.steps_lost) for r in resized] == [
        (4, ("a", "a", "b", "b"), 0),
        (2, ("b", "b"), 3),
    ]
    # Ray was asked at the first count and at the restart, not at each step between.
    assert ray(deps).worker_lookups == ["job-w-1", "job-w-1"]


class LosesOneRace(InMemoryJobStore):
    """A job store where another writer moves a record on just before one update."""

    def __init__(self) -> None:
        super().__init__()
        self.race_next = False

    async def update(self, record: JobRecord, revision: Revision) -> Revision:
        if self.race_next:
            self.race_next = False
            current, _ = self.records[record.job_id]
            self.records[record.job_id] = (current, self._next())  # the other writer's
            raise StaleRevisionError(record.job_id)
        return await super().update(record, revision)


async def test_a_resize_published_is_recorded_though_another_writer_came_first(
    deps: Deps,
) -> None:
    """The shrink is published, then the record's write loses a race: decided again on
    the fresh record, it is written. Else the group back on 4 would read as 4 -> 4."""
    store = LosesOneRace()
    deps = replace(deps, store=store, quotas=Quotas(max_gpus_per_job=8, max_gpus_per_owner=8))
    await placed(deps, job_requested("job-r", num_workers=2, max_workers=4))
    ray(deps).set("job-r-1", RayJobState.RUNNING)
    assert isinstance(deps.progress, FakeProgress)
    uri = "file:///checkpoints/job-r"
    story: list[tuple[int, int, tuple[str, ...], bool]] = [
        (10, 4, ("a", "a", "b", "b"), False),
        (9, 2, ("b", "b"), True),  # a went; the write of the shrink loses a race
        (12, 4, ("b", "b", "c", "c"), False),
    ]
    for step, workers, nodes, race in story:
        store.race_next = race
        ray(deps).workers["job-r-1"] = nodes
        deps.progress.reports[uri] = ProgressReport(
            job_id="job-r", attempt=1, step=step, metrics={}, updated_at=NOW, workers=workers
        )
        await track_attempts(deps)
    resized = [data for kind, data in published(deps) if kind == "resized"]
    assert [(r.previous, r.workers, r.reason.value) for r in resized] == [
        (None, 4, "counted"),
        (4, 2, "shrank"),
        (2, 4, "grew"),
    ]
    record, _ = store.records["job-r"]
    assert record.current is not None
    assert record.current.worker_nodes == ("b", "b", "c", "c")


async def test_an_elastic_attempt_that_cannot_get_its_min_workers_goes_on_as_a_new_attempt(
    deps: Deps,
) -> None:
    deps = replace(
        deps,
        quotas=Quotas(max_gpus_per_job=8, max_gpus_per_owner=8),
        short_of_workers_fallback_s=120,
    )
    clock = deps.clock
    assert isinstance(clock, FixedClock)
    await placed(deps, job_requested("job-s", num_workers=2, max_workers=4))
    ray(deps).set("job-s-1", RayJobState.RUNNING)
    ray(deps).workers["job-s-1"] = ("a", "b")
    assert isinstance(deps.progress, FakeProgress)
    deps.progress.reports["file:///checkpoints/job-s"] = ProgressReport(
        job_id="job-s", attempt=1, step=1, metrics={}, updated_at=NOW, workers=2
    )
    await track_attempts(deps)
    ray(deps).workers["job-s-1"] = ("a",)  # one of its two nodes went, and no room came
    for _ in range(40):  # 200 s of passes, 5 s apart, with no report
        clock.advance(timedelta(seconds=5))
        await track_attempts(deps)
    assert types(deps)[-1] == "interrupted"
    interrupted = dict(published(deps))["interrupted"]
    assert interrupted.cause is InterruptionCause.SHORT_OF_WORKERS
    assert ray(deps).stopped == ["job-s-1"]
    # Short from the first look after the loss (5 s), given up 120 s later; room for
    # the missing worker was asked for at that first look.
    assert isinstance(deps.store, InMemoryJobStore)
    lost = deps.store.records["job-s"][0].attempts[-1]
    assert lost.ended_at is not None
    assert lost.ended_at - NOW == timedelta(seconds=125)
    [_, shrank] = [data for kind, data in published(deps) if kind == "resized"]
    assert (shrank.workers, shrank.previous, shrank.min_workers) == (1, 2, 2)


def resumed_event(job_id: str, attempt: int, **fields: Any) -> Any:
    data = JobResumed(
        job_id=job_id,
        attempt=attempt,
        capacity=fields.pop("capacity", CapacityClass.ANY),
        **fields,
    )
    return new_event(data, source="checkpointer", time=NOW, event_id=f"r-{job_id}-{attempt}")


async def running(deps: Deps, job_id: str, node: str = "gpu-spot-1") -> None:
    await placed(deps, job_requested(job_id), node)
    ray(deps).set(f"{job_id}-1", RayJobState.RUNNING, node=node, pool="gpu-spot")
    await track_attempts(deps)


async def test_a_running_attempt_records_the_node_its_driver_runs_on(deps: Deps) -> None:
    await running(deps, "job-n")
    started = dict(published(deps))["started"]
    assert (started.nodes, started.pool) == (("gpu-spot-1",), "gpu-spot")
    assert isinstance(deps.store, InMemoryJobStore)
    assert deps.store.records["job-n"][0].attempts[0].nodes == ("gpu-spot-1",)


async def test_an_attempt_that_stops_when_asked_to_checkpoint_is_preempted_not_failed(
    deps: Deps,
) -> None:
    await running(deps, "job-p")
    assert isinstance(deps.progress, FakeProgress)
    deps.progress.checkpoint_requests.add(("file:///checkpoints/job-p", 1))
    ray(deps).set("job-p-1", RayJobState.FAILED, error_type="JOB_ENTRYPOINT_COMMAND_ERROR")
    await track_attempts(deps)
    interrupted = dict(published(deps))["interrupted"]
    assert (interrupted.cause, interrupted.node) == (InterruptionCause.PREEMPTED, "gpu-spot-1")
    assert "failed" not in types(deps)
    assert isinstance(deps.store, InMemoryJobStore)
    assert deps.store.state_of("job-p") == "interrupted"


async def test_a_resume_stops_the_lost_attempt_and_submits_the_next_from_its_checkpoint(
    deps: Deps,
) -> None:
    await running(deps, "job-r")
    resumed = resumed_event(
        "job-r",
        2,
        from_checkpoint="file:///checkpoints/job-r/step-000000000040",
        from_step=40,
        capacity=CapacityClass.ON_DEMAND,
    )
    await on_job_resumed(resumed, deps)
    await on_job_resumed(resumed, deps)  # a repeat changes nothing

    assert ray(deps).stopped == ["job-r-1"]
    after = published(deps)[-2:]
    assert [kind for kind, _ in after] == ["interrupted", "queued"]
    queued = after[1][1]
    assert (queued.attempt, queued.capacity) == (2, CapacityClass.ON_DEMAND)
    assert queued.avoid_nodes == ("gpu-spot-1",), "the scaler places it off the lost node"
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["job-r-1"]
    await on_job_placed(job_placed("job-r", attempt=2, nodes=("gpu-on-demand-1",)), deps)
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["job-r-1", "job-r-2"]
    plan = ray(deps).submitted[-1][0]
    assert plan.env_vars["SPOTRAIN_RESUME_FROM"] == "file:///checkpoints/job-r/step-000000000040"
    assert plan.env_vars["SPOTRAIN_ATTEMPT"] == "2"
    assert plan.entrypoint_resources == {"spotrain-capacity-on-demand": 0.001}
    assert plan.entrypoint_label_selector == {"spotrain-node": "in(gpu-on-demand-1)"}


async def test_a_resume_of_an_attempt_that_is_not_the_current_one_is_ignored(deps: Deps) -> None:
    await running(deps, "job-s")
    await on_job_resumed(resumed_event("job-s", 3), deps)
    assert ray(deps).stopped == []
    assert len(ray(deps).submitted) == 1


async def test_a_job_the_checkpointer_gave_up_on_ends_failed(deps: Deps) -> None:
    await running(deps, "job-g")
    failed = JobFailed(job_id="job-g", attempt=1, message="restart budget spent")
    await on_job_failed(new_event(failed, source="checkpointer", time=NOW), deps)
    assert isinstance(deps.store, InMemoryJobStore)
    record = deps.store.records["job-g"][0]
    assert (record.state.value, record.detail) == ("failed", "restart budget spent")
    assert ray(deps).stopped == ["job-g-1"]


async def test_a_request_replayed_after_its_job_ran_publishes_and_submits_nothing(
    deps: Deps,
) -> None:
    request = job_requested("job-old")
    await placed(deps, request)
    ray(deps).set("job-old-1", RayJobState.SUCCEEDED)
    await track_attempts(deps)
    before = types(deps)
    await on_job_requested(request, deps)  # a replay, long after the duplicate window
    assert types(deps) == before, "no second answer, no demand queued again"
    assert len(ray(deps).submitted) == 1


async def test_a_resume_of_an_attempt_that_had_failed_by_its_own_code_is_refused(
    deps: Deps,
) -> None:
    await running(deps, "job-u")
    # It failed on its own just before its node went; the record had not heard yet.
    ray(deps).set("job-u-1", RayJobState.FAILED, error_type="JOB_ENTRYPOINT_COMMAND_ERROR")
    await on_job_resumed(resumed_event("job-u", 2), deps)
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["job-u-1"]
    assert isinstance(deps.store, InMemoryJobStore)
    assert deps.store.state_of("job-u") == "failed"


async def test_a_burst_is_admitted_from_one_read_of_the_records_and_its_own_admissions(
    deps: Deps,
) -> None:
    """Fifty requests at once: the bucket is read once, and each admission sees those
    this replica made since, so the owner's quota still holds within the burst."""
    store = deps.store
    assert isinstance(store, InMemoryJobStore)
    deps = replace(deps, admission_view_max_age_s=60.0)
    await asyncio.gather(
        *(on_job_requested(job_requested(f"j-{n}", worker={"gpus": 1}), deps) for n in range(50))
    )
    assert store.reads == 1
    queued = [data for kind, data in published(deps) if kind == "queued"]
    assert len(queued) == 4, "the owner's quota of 4 GPUs, no more"


async def test_a_head_away_fails_nothing_and_one_back_without_its_state_resumes_what_ran(
    deps: Deps,
) -> None:
    """While Ray's head is away the tracker changes nothing and a placed attempt waits in
    its record; a head back without its state has heard of no job: the attempt that ran is
    the head's loss (a resume, no restart spent), the one that never ran is handed to Ray
    once."""
    await placed(deps, job_requested("ran", max_restarts=0))
    ray(deps).set("ran-1", RayJobState.RUNNING, node="gpu-spot-1")
    await track_attempts(deps)
    assert types(deps)[-1] == "started"

    ray(deps).away = True
    await track_attempts(deps)
    await placed(deps, job_requested("waited"), node="gpu-spot-2")
    await track_attempts(deps)
    assert types(deps)[-2:] == ["accepted", "queued"], "nothing but the new job's news"
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["ran-1"]
    assert deps.head.away_since is not None

    ray(deps).forget()
    ray(deps).away = False
    await track_attempts(deps)
    assert deps.head.away_since is None
    # Until their nodes have joined the new head, what ran there may still run there.
    assert "interrupted" not in types(deps)
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["ran-1"]
    ray(deps).rejoin("gpu-spot-1", "gpu-spot-2")
    await track_attempts(deps)
    await track_attempts(deps)
    [interrupted] = [data for kind, data in published(deps) if kind == "interrupted"]
    assert (interrupted.job_id, interrupted.cause) == ("ran", InterruptionCause.HEAD_LOST)
    assert [plan.submission_id for plan, _ in ray(deps).submitted] == ["ran-1", "waited-1"]
    assert isinstance(deps.store, InMemoryJobStore)
    ran = deps.store.records["ran"][0]
    assert ran.interruptions == 0, "a head's loss spends none of the job's restart budget"


async def test_a_head_back_with_its_state_leaves_what_carried_on(deps: Deps) -> None:
    await placed(deps, job_requested("ran"))
    ray(deps).set("ran-1", RayJobState.RUNNING, node="gpu-spot-1")
    await track_attempts(deps)
    before = types(deps)
    ray(deps).away = True
    await track_attempts(deps)
    ray(deps).away = False
    await track_attempts(deps)
    assert types(deps) == before
    assert isinstance(deps.store, InMemoryJobStore)
    assert deps.store.records["ran"][0].state.value == "running"


async def test_a_cancel_while_the_head_is_away_stops_the_attempt_once_it_is_back(
    deps: Deps,
) -> None:
    await placed(deps, job_requested("ran"))
    ray(deps).set("ran-1", RayJobState.RUNNING, node="gpu-spot-1")
    await track_attempts(deps)
    ray(deps).away = True
    cancel = new_event(JobCancelRequested(job_id="ran", requested_by="alice"), source="t", time=NOW)
    await on_job_cancel_requested(cancel, deps)
    await track_attempts(deps)
    assert ray(deps).stopped == []
    ray(deps).away = False
    await track_attempts(deps)
    assert ray(deps).stopped == ["ran-1"]
