"""An attempt in Ray, pure: what Ray gets for it, how the record moves as Ray reports on
it and training reports progress, its workers, a resume, a cancellation, its end."""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping
from datetime import datetime

from services.submitter.model import (
    Attempt,
    AttemptState,
    FailureKind,
    JobRecord,
    JobState,
    RayJobState,
    RayJobStatus,
    SubmissionPlan,
)
from services.submitter.policy.give_way import GIVE_WAY, gave_way_message
from services.submitter.policy.queue import lost_nodes, never_started, queued_event, requeue
from services.submitter.policy.transitions import (
    Fact,
    Reason,
    Transition,
    cancel_attempt,
    end_attempt,
    in_ray,
    interrupt,
    started_fact,
    submission_id,
    unseen_start,
    with_attempt,
    with_driver_node,
)
from shared.checkpoints import ProgressReport
from shared.events.data import (
    InterruptionCause,
    JobCancelled,
    JobFailed,
    JobProgress,
    JobResized,
    JobResumed,
    JobSucceeded,
    ResizeReason,
)
from shared.resources import NODE_LABEL, RESOURCE_PER_JOB, capacity_resource

LAUNCHER = ("python", "-m", "shared.usercode.launch", "--")
"""What runs in front of every attempt's command, on its node."""

RAY_TRAIN_ON_SPOT = {
    # A worker group waits this long for its placement before Ray Train decides again: on
    # a notice, the group restarts at the deadline while the going node still counts as
    # alive, and the first try, which wants it too, must not hold the job for a minute.
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "3",
    # How soon the workers hear of a drained node (Ray's default is 5 s of a 15 s notice).
    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
    # How often the controller polls the workers: a lost one is seen, and a checkpoint
    # saved on a notice registered, within a second (Ray's default is 2 s).
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1",
}
"""Ray Train's settings for multi-node jobs on capacity that goes (Ray Train reads them in
the driver and passes them to its controller)."""


def plan_submission(
    record: JobRecord,
    attempt: Attempt,
    *,
    checkpoint_uri: str,
    driver_labels: Mapping[str, str] | None = None,
) -> SubmissionPlan:
    """What Ray gets for one attempt: a quoted command, its pinning, the training contract.
    `driver_labels`: the nodes a multi-node driver runs on; none: the head."""
    request = record.request
    single_node = request.num_workers == 1
    pin = capacity_resource(record.capacity_of(attempt))
    env = {
        **request.env,
        "SPOTRAIN_JOB_ID": request.job_id,
        "SPOTRAIN_ATTEMPT": str(attempt.number),
        "SPOTRAIN_CHECKPOINT_URI": checkpoint_uri,
        "SPOTRAIN_NUM_WORKERS": str(request.num_workers),
        "SPOTRAIN_MAX_WORKERS": str(request.max_workers or request.num_workers),
        "SPOTRAIN_GPUS_PER_WORKER": str(request.worker.gpus),
        "SPOTRAIN_CPUS_PER_WORKER": str(request.worker.cpus),
    }
    if not single_node and pin:
        # The workers, not the driver, go on the attempt's capacity: the training helper
        # hands this to Ray Train as each worker's resources.
        env["SPOTRAIN_WORKER_RESOURCES"] = json.dumps({pin: RESOURCE_PER_JOB})
    if not single_node:
        env |= RAY_TRAIN_ON_SPOT
    if attempt.resumed_from:
        env["SPOTRAIN_RESUME_FROM"] = attempt.resumed_from
    metadata = {"job_id": request.job_id, "attempt": str(attempt.number), "owner": request.owner}
    selector: dict[str, str] = {}
    if single_node and attempt.placed_on:
        # The room the scaler holds for this attempt, and no other: Ray's own choice of a
        # node would take room held for the next attempt in the platform's order.
        selector = {NODE_LABEL: f"in({','.join(sorted(set(attempt.placed_on)))})"}
    elif single_node and (lost := lost_nodes(record)):
        # Not for a multi-node driver: any selector counts to Ray as asking for room, and
        # it would no longer keep that driver on the head.
        selector = {NODE_LABEL: f"!in({','.join(lost)})"}
    elif not single_node and driver_labels:
        # Off the head, where Ray's job API is, onto the drivers' own nodes.
        selector = dict(driver_labels)
    if request.experiment:
        metadata["experiment"] = request.experiment
    return SubmissionPlan(
        submission_id=attempt.submission_id,
        # An argv list, quoted here: no user string reaches a shell unquoted. The launcher
        # gives the command its checkpoint folder, the notice as SIGTERM, and Ray Train's
        # defaults (`shared.usercode`).
        entrypoint=shlex.join((*LAUNCHER, *request.entrypoint)),
        # A single-node job's driver is its worker, on the attempt's capacity. A multi-node
        # driver only coordinates the workers it places itself (Ray Train): it asks for
        # nothing, so Ray runs it on the head, or on the drivers' nodes where there are
        # some (on-demand, never resized), and losing any spot node never loses the attempt.
        entrypoint_num_cpus=request.worker.cpus if single_node else 0,
        entrypoint_num_gpus=request.worker.gpus if single_node else 0,
        entrypoint_memory_bytes=int(request.worker.memory_gb * 1024**3) if single_node else 0,
        entrypoint_resources={pin: RESOURCE_PER_JOB} if pin and single_node else {},
        entrypoint_label_selector=selector,
        env_vars=env,
        pip=request.pip,
        metadata=metadata,
    )


# Ray reports these when the process supervising the job vanished with its node. The
# last: Ray's job manager looks a running job's supervisor up and finds none, which is
# what it sees once the supervisor's node was killed (ray/dashboard/modules/job/
# job_manager.py, "failed to get job supervisor"); user code cannot cause it.
_NODE_LOSS_ERRORS = frozenset(
    {
        "JOB_SUPERVISOR_ACTOR_DIED",
        "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE",
        "JOB_SUPERVISOR_ACTOR_START_FAILURE",
    }
)


FORGOTTEN_BY_RAY = (
    "Ray's head was lost and came back without its state: the attempt went with it (it goes "
    "on from its latest checkpoint, no restart spent)"
)


def driver_lost_off_the_pools(
    record: JobRecord, status: RayJobStatus, *, checkpoint_requested: bool, workers_lost: bool
) -> bool:
    """Whether a failed attempt lost its driver on the platform's own Ray node, not on its
    capacity: a multi-node driver runs on the head (or the drivers' nodes), off the pools,
    and Ray saying its supervisor died there means that node went (a head back with its
    state reports so of every driver it ran). Not the job's loss."""
    attempt = record.current
    return (
        is_multi_node(record)
        and status.error_type in _NODE_LOSS_ERRORS
        and status.node is None
        and attempt is not None
        and not attempt.nodes
        and not checkpoint_requested
        and not workers_lost
    )


def classify_failure(
    status: RayJobStatus, *, checkpoint_requested: bool, workers_lost: bool = False
) -> FailureKind:
    """A failed attempt is the user's unless Ray says its node went away under it, a node
    that held its Ray Train workers died (Ray Train gives up when a loss outruns the
    script's own `max_failures`, by default at once), or the platform itself asked it to
    checkpoint and stop (its node is being preempted)."""
    if checkpoint_requested or workers_lost or status.error_type in _NODE_LOSS_ERRORS:
        return FailureKind.NODE_LOST
    return FailureKind.USER_ERROR


def on_ray_status(
    record: JobRecord,
    status: RayJobStatus | None,
    now: datetime,
    *,
    checkpoint_requested: bool = False,
    moving: bool = False,
    lost_worker_nodes: tuple[str, ...] = (),
) -> Transition:
    """How the record moves given what Ray says of its current attempt.

    `checkpoint_requested`: whether the platform asked this attempt to checkpoint and stop
    (CHECKPOINT_NOW names it); `moving`: whether it asked so to move the job to other
    capacity (then its end is a move, not a loss). Only looked at when Ray says the
    attempt failed.
    """
    attempt = record.current
    if attempt is None or attempt.state not in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        return Transition(Reason.UNCHANGED, record)
    if status is None:
        return _forgotten(record, attempt, now)
    job_id, n = record.job_id, attempt.number
    match status.state:
        case RayJobState.PENDING:
            return Transition(Reason.UNCHANGED, record)
        case RayJobState.RUNNING:
            placed = with_driver_node(attempt, status)
            if attempt.state is AttemptState.RUNNING:
                if placed == attempt:
                    return Transition(Reason.UNCHANGED, record)
                return Transition(Reason.PLACED, with_attempt(record, placed, record.state, now))
            started = placed.model_copy(update={"state": AttemptState.RUNNING, "started_at": now})
            return Transition(
                Reason.STARTED,
                with_attempt(record, started, JobState.RUNNING, now),
                (started_fact(started, job_id),),
            )
        case RayJobState.SUCCEEDED:
            ended = end_attempt(attempt, AttemptState.SUCCEEDED, now, status.message)
            return Transition(
                Reason.SUCCEEDED,
                with_attempt(record, ended, JobState.SUCCEEDED, now),
                (
                    *unseen_start(attempt, job_id),
                    Fact(f"succeeded-{job_id}-{n}", JobSucceeded(job_id=job_id, attempt=n)),
                ),
            )
        case RayJobState.STOPPED | RayJobState.FAILED if (
            attempt.give_way is not None and not record.cancel_requested
        ):
            # Asked to give way: its end, by its own checkpoint-and-exit or by Ray's stop
            # after the grace, is that preemption, whatever Ray calls it.
            placed = with_driver_node(attempt, status)
            return interrupt(record, placed, attempt.give_way, now, gave_way_message(attempt))
        case RayJobState.STOPPED:
            return cancel_attempt(record, attempt, now, status.message)
        case RayJobState.FAILED:
            if record.cancel_requested:
                return cancel_attempt(record, attempt, now, status.message)
            if never_started(status, attempt):
                return requeue(record, now)
            return _failed(
                record, attempt, status, now, checkpoint_requested=checkpoint_requested,
                moving=moving, lost_worker_nodes=lost_worker_nodes,
            )  # fmt: skip


FORGOTTEN_NODES_WAIT_S = 600.0
"""How long what Ray forgot of an attempt waits for the nodes it ran on to join the new
head: as long as a node's raylet waits for a head (`RAY_gcs_rpc_server_reconnect_timeout_s`
on a fault-tolerant cluster)."""


def ran_on(attempt: Attempt) -> frozenset[str]:
    """Every node the attempt ran or was placed on: its driver's, its workers'."""
    return frozenset((*attempt.nodes, *attempt.worker_nodes, *attempt.placed_on))


def forgotten_may_go_on(
    attempt: Attempt, live_nodes: frozenset[str] | None, waited_s: float
) -> bool:
    """Whether an attempt Ray has no record of may be taken as gone, and go on (resumed, or
    handed to Ray again). Only once every node it ran on has joined Ray since: a head back
    without its state forgets its jobs at once, but each node's raylet gives the lost head up
    in its own time, and until then what the attempt ran there may still run; a node joins
    a head only as a restarted node, with nothing of its last run left. Or once the wait is
    over (a node that never comes back). `live_nodes`: the nodes alive in Ray now, None
    when Ray cannot say."""
    nodes = ran_on(attempt)
    if not nodes or waited_s >= FORGOTTEN_NODES_WAIT_S:
        return True
    return live_nodes is not None and nodes <= live_nodes


def _forgotten(record: JobRecord, attempt: Attempt, now: datetime) -> Transition:
    """Ray has not heard of the attempt."""
    if attempt.state is AttemptState.RUNNING:
        # Ray ran it and no longer knows it: a head back without its state, which took the
        # attempt's processes down with the cluster.
        return interrupt(record, attempt, InterruptionCause.HEAD_LOST, now, FORGOTTEN_BY_RAY)
    # Never seen running: handed to Ray again as it is (the process died before Ray heard
    # of it, or a head back without its state forgot it before it ran).
    return Transition(Reason.NOT_SUBMITTED, record)


def _failed(  # on_ray_status's inputs, passed on
    record: JobRecord,
    attempt: Attempt,
    status: RayJobStatus,
    now: datetime,
    *,
    checkpoint_requested: bool,
    moving: bool,
    lost_worker_nodes: tuple[str, ...],
) -> Transition:
    """Ray says the attempt failed: its capacity went (a preemption, a move, a lost node)
    or its own code failed."""
    job_id, n = record.job_id, attempt.number
    message = status.message or "the job failed"
    if driver_lost_off_the_pools(
        record,
        status,
        checkpoint_requested=checkpoint_requested,
        workers_lost=bool(lost_worker_nodes),
    ):
        return interrupt(record, attempt, InterruptionCause.HEAD_LOST, now, message)
    kind = classify_failure(
        status, checkpoint_requested=checkpoint_requested, workers_lost=bool(lost_worker_nodes)
    )
    if lost_worker_nodes and not checkpoint_requested:
        message = f"lost the node(s) of its workers: {', '.join(lost_worker_nodes)}"
    if kind is FailureKind.NODE_LOST:
        cause = InterruptionCause.PREEMPTED if checkpoint_requested else InterruptionCause.NODE_LOST
        if checkpoint_requested and moving:
            cause = InterruptionCause.MOVED
        return interrupt(record, with_driver_node(attempt, status), cause, now, message)
    failed = end_attempt(attempt, AttemptState.FAILED, now, message)
    failure = JobFailed(job_id=job_id, attempt=n, message=message[-8000:])
    return Transition(
        Reason.USER_ERROR,
        with_attempt(record, failed, JobState.FAILED, now),
        (*unseen_start(attempt, job_id), Fact(f"failed-{job_id}-{n}", failure)),
    )


def is_multi_node(record: JobRecord) -> bool:
    request = record.request
    return request.num_workers > 1 or (request.max_workers or 0) > 1


def wants_worker_nodes(record: JobRecord, report: ProgressReport | None) -> bool:
    """Whether this report is worth asking Ray where a multi-node attempt's workers are:
    before the first count, and whenever its group may have restarted (a new count, or
    the step went back). Not on every step: Ray's state API is not free."""
    attempt = record.current
    if (
        report is None
        or attempt is None
        or attempt.state is not AttemptState.RUNNING
        or report.attempt != attempt.number
        or not is_multi_node(record)
    ):
        return False
    return (
        attempt.workers is None
        or (is_news(attempt, report) and report.workers not in (None, attempt.workers))
        or (attempt.step is not None and report.step < attempt.step)
    )


def is_news(attempt: Attempt, report: ProgressReport) -> bool:
    """Whether the record has not taken this report yet (another step, or written since):
    only a new report says how many workers there are now, since one already taken may be
    older than what Ray said since (`on_workers_seen`)."""
    return attempt.step is None or (report.step, report.updated_at) != (
        attempt.step,
        attempt.reported_at,
    )


def watches_workers(record: JobRecord) -> bool:
    """Whether the tracker asks Ray, now and then, where a running attempt's workers are:
    every multi-node attempt, whether or not its script reports (one written for Ray Train
    alone never does), so that the platform charges their nodes, finds them for `preempt
    --job`, and asks for room the moment one goes."""
    attempt = record.current
    return attempt is not None and attempt.state is AttemptState.RUNNING and is_multi_node(record)


def on_workers_seen(
    record: JobRecord,
    alive: tuple[str, ...] | None,
    now: datetime,
    *,
    fallback_after_s: float,
    waits_for_room: bool | None = None,
) -> Transition:
    """Ray says where a running multi-node attempt's workers are (`alive`: one node per live
    worker; None: it could not say).

    - Other nodes or another count than recorded: it was resized (`job.resized`), and the
      scaler asks for room for each worker it misses below its MIN at once. Not before its
      first gang: until then its own demand stands for it. No worker at all counts only
      while its group `waits_for_room`: else Ray Train is between two groups (a restart
      finds its room at once), or the run is past its last step, its driver ending.
    - Fewer than its MIN since `fallback_after_s` ago: Ray Train waits for room that has not
      come, so the attempt ends as lost (`short-of-workers`) and the checkpointer takes it
      on from its latest checkpoint, as for any lost attempt, with its budget and its
      fallback to on-demand."""
    attempt = record.current
    if alive is None or attempt is None or attempt.state is not AttemptState.RUNNING:
        return Transition(Reason.UNCHANGED, record)
    least = record.request.num_workers
    if attempt.workers is None and len(alive) < least:
        return Transition(Reason.UNCHANGED, record)
    facts: tuple[Fact, ...] = ()
    seen = attempt
    if not alive and not waits_for_room:
        return Transition(Reason.UNCHANGED, record)
    if len(alive) != attempt.workers or alive != attempt.worker_nodes:
        step = attempt.step if attempt.step is not None else 0
        facts = (_resized(record, attempt, len(alive), step, alive),)
        seen = attempt.model_copy(update={"workers": len(alive), "worker_nodes": alive})
    if len(alive) >= least:
        if seen.short_of_workers_since is not None:
            seen = seen.model_copy(update={"short_of_workers_since": None})
    else:
        since = seen.short_of_workers_since or now
        if (now - since).total_seconds() >= fallback_after_s:
            message = (
                f"{len(alive)} of its {least} workers (MIN) could be held for "
                f"{(now - since).total_seconds():.0f} s: it goes on as a new attempt from its "
                "latest checkpoint"
            )
            return interrupt(record, seen, InterruptionCause.SHORT_OF_WORKERS, now, message)
        seen = seen.model_copy(update={"short_of_workers_since": since})
    if seen == attempt:
        return Transition(Reason.UNCHANGED, record)
    return Transition(Reason.SHORT_OF_WORKERS, with_attempt(record, seen, record.state, now), facts)


def on_progress(
    record: JobRecord,
    report: ProgressReport | None,
    now: datetime,
    *,
    worker_nodes: tuple[str, ...] | None = None,
) -> Transition:
    """Training reported a step: publish it once, for the attempt that is running now; and
    when a multi-node attempt has a new number of workers (as its training reports, else as
    many as `worker_nodes`, where Ray says they are), or the same number on other nodes,
    that it was resized. Ray Train resizes by restarting the group from its latest
    checkpoint: the step may go back, and the attempt is at that step from then on."""
    attempt = record.current
    if (
        report is None
        or attempt is None
        or attempt.state is not AttemptState.RUNNING
        or report.attempt != attempt.number
    ):
        return Transition(Reason.UNCHANGED, record)
    workers = report.workers
    if workers is None and worker_nodes and is_multi_node(record):
        workers = len(worker_nodes)
    moved = bool(worker_nodes) and worker_nodes != attempt.worker_nodes
    fresh = is_news(attempt, report)
    resized = fresh and workers is not None and (workers != attempt.workers or moved)
    if attempt.step is not None and report.step <= attempt.step and not resized:
        return Transition(Reason.UNCHANGED, record)
    # Events carry finite numbers under well-formed names; a NaN loss stays in the file.
    metrics = {
        name: value
        for name, value in report.metrics.items()
        if math.isfinite(value) and _METRIC_NAME.match(name)
    }
    eta = eta_s(attempt, report.step, report.total_steps, report.updated_at)
    nodes = worker_nodes or ()
    update: dict[str, object] = {
        "step": report.step,
        "metrics": metrics,
        "total_steps": report.total_steps,
        "eta_s": eta,
        "short_of_workers_since": None,  # it reports: its group is up
        "reported_at": report.updated_at,
    }
    if resized:
        update |= {"workers": workers, "worker_nodes": nodes}
    progress = JobProgress(
        job_id=record.job_id,
        attempt=attempt.number,
        step=report.step,
        total_steps=report.total_steps,
        metrics=dict(sorted(metrics.items())[:64]),
        eta_s=eta,
    )
    facts = [Fact(f"progress-{record.job_id}-{attempt.number}-{report.step}", progress)]
    if resized:
        assert workers is not None
        facts.insert(0, _resized(record, attempt, workers, report.step, nodes))
    return Transition(
        Reason.PROGRESSED,
        with_attempt(record, attempt.model_copy(update=update), record.state, now),
        tuple(facts),
    )


def _resized(
    record: JobRecord, attempt: Attempt, workers: int, step: int, nodes: tuple[str, ...]
) -> Fact:
    request = record.request
    previous = attempt.workers
    if previous is None:
        reason = ResizeReason.COUNTED
    elif workers == previous:
        reason = ResizeReason.MOVED
    else:
        reason = ResizeReason.GREW if workers > previous else ResizeReason.SHRANK
    went_back = attempt.step is not None and step < attempt.step
    resized = JobResized(
        job_id=record.job_id,
        attempt=attempt.number,
        workers=workers,
        previous=previous,
        min_workers=request.num_workers,
        max_workers=max(request.max_workers or request.num_workers, workers),
        reason=reason,
        worker=request.worker,
        capacity=attempt.capacity or request.capacity,
        priority=request.priority,
        step=step,
        nodes=nodes,
        steps_lost=attempt.step - step if went_back and attempt.step is not None else 0,
    )
    key = f"resized-{record.job_id}-{attempt.number}-{previous or 0}-{workers}-{step}"
    return Fact(key, resized)


def eta_s(attempt: Attempt, step: int, total_steps: int | None, at: datetime) -> float | None:
    """Seconds left at the pace the attempt kept since it started (from the step it
    resumed at); None without a total, or before a step's worth of pace is known."""
    if total_steps is None or attempt.started_at is None:
        return None
    done = step - attempt.from_step
    took = (at - attempt.started_at).total_seconds()
    if done <= 0 or took <= 0:
        return None
    return round(max(total_steps - step, 0) * took / done, 3)


_METRIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")


def cancel(record: JobRecord, now: datetime) -> Transition:
    """A cancellation request: flag the record; a job with nothing running ends at once."""
    if not record.is_active:
        return Transition(Reason.UNCHANGED, record)
    flagged = record.model_copy(update={"cancel_requested": True, "updated_at": now})
    attempt = record.current
    if attempt is not None and attempt.state is AttemptState.QUEUED:
        # Nothing of it is in Ray: it ends here, and its demand goes with `job.cancelled`.
        flagged = with_attempt(
            flagged,
            end_attempt(attempt, AttemptState.STOPPED, now, "cancelled"),
            flagged.state,
            now,
        )
    if attempt is None or attempt.state not in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        ended = flagged.model_copy(update={"state": JobState.CANCELLED})
        cancelled = JobCancelled(job_id=record.job_id, attempt=attempt.number if attempt else None)
        return Transition(Reason.CANCELLED, ended, (Fact(f"cancelled-{record.job_id}", cancelled),))
    return Transition(Reason.UNCHANGED, flagged)


def resume(record: JobRecord, resumed: JobResumed, now: datetime) -> Transition:
    """The checkpointer decided that the job carries on as attempt `resumed.attempt`.

    Applies once, and only to the attempt it follows: a repeat, or a decision about an
    attempt that is no longer the current one, changes nothing. An attempt still live in
    the record (its loss was news to us) ends as lost first, so the interruption is said.
    """
    attempt = record.current
    if not record.is_active or attempt is None or resumed.attempt != attempt.number + 1:
        return Transition(Reason.UNCHANGED, record)
    facts: tuple[Fact, ...] = ()
    if attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        cause, message = InterruptionCause.NODE_LOST, "its node was lost"
        if resumed.moved is not None:
            cause = InterruptionCause.MOVED
            message = f"moved to {resumed.capacity.value} capacity ({resumed.moved.value})"
        if attempt.give_way is not None:
            cause, message = attempt.give_way, gave_way_message(attempt)
        interrupted = interrupt(record, attempt, cause, now, message)
        record, facts = interrupted.record, interrupted.facts
    elif attempt.state is not AttemptState.LOST:
        return Transition(Reason.UNCHANGED, record)
    lost = record.attempts[-1]
    following = Attempt(
        number=resumed.attempt,
        submission_id=submission_id(record.job_id, resumed.attempt),
        state=AttemptState.QUEUED,
        submitted_at=now,
        capacity=resumed.capacity if resumed.capacity is not record.request.capacity else None,
        resumed_from=resumed.from_checkpoint,
        from_step=resumed.from_step,
    )
    if lost.cause in GIVE_WAY:
        # It gave its quota away: it waits for quota again, and is no demand until then.
        waiting = record.model_copy(
            update={
                "attempts": (*record.attempts, following),
                "state": JobState.QUEUED,
                "updated_at": now,
                "waiting_for": f"{gave_way_message(lost)}; it goes on from its checkpoint once its "
                "team's quota allows",
            }
        )
        return Transition(Reason.RESUMED, waiting, facts)
    moved = record.model_copy(
        update={
            "attempts": (*record.attempts, following),
            "state": JobState.QUEUED,
            "updated_at": now,
        }
    )
    queued = queued_event(moved, following, now)
    return Transition(
        Reason.RESUMED,
        moved,
        (*facts, Fact(f"queued-{record.job_id}-{following.number}", queued)),
    )


def past_max_hours(record: JobRecord, now: datetime) -> JobRecord | None:
    """The record of a job that ran past its max hours, asked to stop (it ends cancelled,
    with the reason); None while it may run on."""
    if (
        record.max_hours is None
        or record.cancel_requested
        or not record.is_active
        or record.ran_s(now) < record.max_hours * 3600
    ):
        return None
    detail = f"stopped after {record.max_hours:g} h of running, its limit (--max-hours)"
    return record.model_copy(update={"cancel_requested": True, "detail": detail, "updated_at": now})


def abandon(record: JobRecord, failed: JobFailed, now: datetime) -> Transition:
    """The checkpointer gave up on the job (restart budget spent): it ends as failed.

    The checkpointer published the `job.failed` itself; this only brings the record along.
    """
    attempt = record.current
    if not record.is_active or attempt is None or attempt.number != failed.attempt:
        return Transition(Reason.UNCHANGED, record)
    if attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING):
        attempt = end_attempt(attempt, AttemptState.LOST, now, failed.message)
    ended = with_attempt(record, attempt, JobState.FAILED, now)
    return Transition(Reason.ABANDONED, ended.model_copy(update={"detail": failed.message}))


def tracked(record: JobRecord) -> bool:
    """Whether the tracker asks Ray about the job's current attempt: an active job's
    attempt that Ray holds, and not one that waits to be given quota again."""
    return record.is_active and record.waiting_for is None and in_ray(record.current)
