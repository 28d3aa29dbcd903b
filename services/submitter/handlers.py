"""The submitter's reactions: requests and cancellations from the bus, and a tracker that
follows each attempt in Ray. Read → decide (policy) → publish → write, in that order, so
that a crash between two steps is repaired by doing them again: every event id is derived
from the job and attempt, and Ray refuses a second job with the same submission id."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from services.submitter import metrics, policy
from services.submitter.model import Attempt, AttemptState, JobRecord, JobState, RayJobState
from services.submitter.policy import Quotas, Reason, Transition
from services.submitter.ports import (
    JobStore,
    PoolsReader,
    ProgressReader,
    RayJobs,
    Revision,
    Secrets,
    StaleRevisionError,
    TeamHoldStore,
    TeamsSource,
    Workspaces,
)
from shared.checkpoints import CheckpointRequest, StopAsk
from shared.clock import Clock
from shared.events import DEFAULT_PREFIX, Event, EventData, new_event
from shared.events.data import (
    InterruptionCause,
    JobAccepted,
    JobCancelRequested,
    JobFailed,
    JobInterrupted,
    JobPlaced,
    JobRejected,
    JobRequested,
    JobResized,
    JobResumed,
    RejectionReason,
    ResizeReason,
)
from shared.events.types import CapacityClass
from shared.messaging import EventPublisher, HandlerWithDeps, RetryLater, Unhandleable
from shared.policy.teams import Teams
from shared.pools import gpu_hour_usd
from shared.ray_head import RayHeadUnavailableError
from shared.workspace import workspaces_bucket

SERVICE = "submitter"
log = structlog.get_logger()


@dataclass
class AdmissionView:
    """The job records admission last read, and when (monotonic seconds): a burst of
    requests is admitted from one read of the bucket plus what this replica admitted
    since, not a read of every record for each request (1,000 at once took minutes)."""

    records: dict[str, JobRecord] = field(default_factory=dict)
    read_at: float | None = None


@dataclass
class HeadWatch:
    away_since: datetime | None = None
    """Since when Ray's head has not answered the tracker; None while it answers."""
    forgotten: dict[str, datetime] = field(default_factory=dict)
    """Submission id → since when Ray has had no record of that attempt, while it waits
    for the nodes it ran on to join Ray again."""


@dataclass(frozen=True)
class Deps:
    bus: EventPublisher
    clock: Clock
    store: JobStore
    ray: RayJobs
    workspaces: Workspaces
    progress: ProgressReader
    quotas: Quotas
    checkpoint_root: str
    """Each job checkpoints under `<checkpoint_root>/<job_id>`."""
    admission: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Admissions one at a time in this replica: two requests of one owner handled at once
    would each see the other's GPUs as free. Across replicas, team quotas hold by the
    compare-and-set on the holds; the per-owner limit is a per-replica guard."""
    teams: TeamsSource | None = None
    """The teams file; None: no teams, per-owner limits only."""
    holds: TeamHoldStore | None = None
    hold_grace_s: float = 120.0
    """A hold whose job record has not appeared after this long was left by a crash."""
    min_runtime_before_preemption_s: float = 300.0
    """No job gives way for other work before its attempt has run this long."""
    give_way_grace_s: float = 120.0
    """How long a job asked to give way has to checkpoint and stop before Ray stops it."""
    short_of_workers_fallback_s: float = 300.0
    """An elastic attempt short of its MIN workers this long goes on as a new attempt."""
    worker_check_interval_s: float = 5.0
    worker_checks: dict[str, datetime] = field(default_factory=dict)
    """Submission id -> when Ray was last asked for its workers by this replica."""
    pools: PoolsReader | None = None
    """Prices and owners' spend, for team budgets."""
    workspace_bucket: str = workspaces_bucket(DEFAULT_PREFIX)
    """The platform's workspace store: the only one a request's working directory may name."""
    secrets: Secrets | None = None
    """Where `--secret` names are looked up; None: a job naming one is refused."""
    default_max_hours: float = 24.0
    """The hours a job without `--max-hours` is held to on a team with a budget."""
    driver_labels: Mapping[str, str] = field(default_factory=dict)
    """Where multi-node drivers run (`SubmitterSettings.driver_labels`); empty: the head."""
    admission_view: AdmissionView = field(default_factory=AdmissionView)
    admission_view_max_age_s: float = 0.0
    """How old the records admission decides from may be. A job that ended meanwhile still
    counts against its owner's quota for that long (the next request waits, and is given
    its quota by `admit_waiting`); team quotas hold regardless, by compare-and-set."""
    monotonic: Callable[[], float] = time.monotonic
    head: HeadWatch = field(default_factory=HeadWatch)


async def on_job_requested(event: Event[JobRequested], deps: Deps) -> None:
    """Admit a request once, then drive it forward; a repeat only repairs missing steps."""
    request = event.data
    found = await deps.store.get(request.job_id)
    if found is None:
        found = await _admit(event, deps)
    record, _ = found
    if record.request != request:
        msg = f"job id {request.job_id} is already taken by another request"
        raise Unhandleable(msg)
    if record.state is JobState.REJECTED:
        rejected = JobRejected(
            job_id=record.job_id,
            reason=record.rejection or RejectionReason.INVALID,
            detail=record.detail or "",
        )
        await _publish(deps, rejected, f"rejected-{record.job_id}")
        log.info("job.rejected", detail=record.detail)
        return
    if record.waiting_for is not None:
        await _publish(
            deps,
            JobAccepted(job_id=record.job_id, owner=request.owner, experiment=request.experiment),
            f"accepted-{record.job_id}",
        )
        log.info("job.waiting_for_quota", team=record.team, reason=record.waiting_for)
        return
    if not policy.answers_request(record):
        log.info("job.request_repeated", state=record.state.value)
        return
    first = record.attempts[0]
    await _publish(
        deps,
        JobAccepted(job_id=record.job_id, owner=request.owner, experiment=request.experiment),
        f"accepted-{record.job_id}",
    )
    # Queued in the platform's queue: it reaches Ray once the scaler places it.
    queued = policy.queued_event(record, first, deps.clock.now())
    await _publish(deps, queued, f"queued-{record.job_id}-1")
    log.info("job.queued", owner=request.owner, gpus=record.gpus)


async def on_job_placed(event: Event[JobPlaced], deps: Deps) -> None:
    """The scaler holds room on named nodes for a queued attempt: hand it to Ray, pinned
    there. A repeat, or a placement the job no longer wants, changes nothing."""
    placement = event.data
    found = await deps.store.get(placement.job_id)
    if found is None:
        log.warning("job.placed_unknown", job_id=placement.job_id)
        return
    record, revision = found
    transition = policy.placed(record, placement, deps.clock.now())
    if transition.reason is Reason.UNCHANGED:
        return
    before = record.current
    if transition.reason is Reason.REPLACED and before is not None:
        try:
            status = await deps.ray.status(before.submission_id)
            if status is not None and status.state is not RayJobState.PENDING:
                return  # it started (or ended) where it was first placed: the tracker follows
            await deps.ray.stop(before.submission_id)
        except RayHeadUnavailableError as away:
            # Whether it started where it was first placed is Ray's to say.
            raise RetryLater(5.0, "Ray's head does not answer") from away
    if await _apply(transition, revision, deps) is None:
        raise RetryLater(0.2, f"job {placement.job_id} moved on while it was being placed")
    attempt = transition.record.current
    if attempt is not None:
        await _submit(transition.record, attempt, deps)
        log.info("job.placed", attempt=attempt.number, nodes=list(placement.nodes))


async def on_job_cancel_requested(event: Event[JobCancelRequested], deps: Deps) -> None:
    found = await deps.store.get(event.data.job_id)
    if found is None:
        msg = f"no job {event.data.job_id} to cancel"
        raise Unhandleable(msg)
    record, revision = found
    teams = deps.teams.current() if deps.teams is not None else None
    refused = policy.who_may_not_cancel(record, event.data.requested_by, teams)
    if refused is not None:
        raise Unhandleable(refused)
    transition = policy.cancel(record, deps.clock.now())
    await _apply(transition, revision, deps)
    attempt = transition.record.current
    if transition.record.cancel_requested and attempt and policy.in_ray(attempt):
        # With the head away, the tracker stops it once the head answers again.
        await _unless_head_away(deps.ray.stop(attempt.submission_id), "stop")
    log.info("job.cancel_requested", requested_by=event.data.requested_by)


async def on_job_resumed(event: Event[JobResumed], deps: Deps) -> None:
    """Carry out the checkpointer's decision: stop what is left of the lost attempt, record
    the next one, and submit it from the checkpoint. A repeat only repairs missing steps."""
    resumed = event.data
    found = await deps.store.get(resumed.job_id)
    if found is None:
        msg = f"no job {resumed.job_id} to resume"
        raise Unhandleable(msg)
    record, revision = found
    lost = record.current
    if lost is not None and lost.number + 1 == resumed.attempt and policy.in_ray(lost):
        # Ray may know better than the record: an attempt that ended on its own (success,
        # its own error) just before its node went is not resumed as if preempted. With
        # the head away, Ray knows nothing better.
        await _unless_head_away(_track(record, lost, revision, deps), "track")
        found = await deps.store.get(resumed.job_id)
        if found is None:
            msg = f"job {resumed.job_id} vanished while it was being resumed"
            raise RuntimeError(msg)
        record, revision = found
        lost = record.current
    transition = policy.resume(record, resumed, deps.clock.now())
    if transition.reason is Reason.RESUMED and lost is not None and policy.in_ray(lost):
        # Whatever survives of it (a driver on a live node, a half-dead job) must not
        # write checkpoints beside the next attempt. A head away took it down with it, or
        # (one that keeps its state) knows it lost: nothing to stop.
        await _unless_head_away(deps.ray.stop(lost.submission_id), "stop")
    if await _apply(transition, revision, deps) is None:
        raise RetryLater(0.2, f"job {resumed.job_id} moved on while it was being resumed")
    attempt = transition.record.current
    if transition.record.waiting_for is not None:
        log.info("job.gave_way", attempt=resumed.attempt, reason=transition.record.waiting_for)
        return
    if transition.reason is Reason.RESUMED and attempt is not None:
        # Queued: it reaches Ray once the scaler places it.
        log.info(
            "job.resumed",
            attempt=attempt.number,
            from_step=resumed.from_step,
            capacity=resumed.capacity.value,
        )


async def on_job_failed(event: Event[JobFailed], deps: Deps) -> None:
    """The checkpointer gave up on a job; the submitter's own `job.failed` is a no-op here."""
    found = await deps.store.get(event.data.job_id)
    if found is None:
        return
    record, revision = found
    lost = record.current
    transition = policy.abandon(record, event.data, deps.clock.now())
    if transition.reason is Reason.ABANDONED and lost is not None and policy.in_ray(lost):
        await _unless_head_away(deps.ray.stop(lost.submission_id), "stop")
    await _apply(transition, revision, deps)


async def track_attempts(deps: Deps) -> None:
    """One pass over active jobs: ask Ray about each current attempt, record what changed.

    Reading the bucket every pass is also how a restarted submitter re-attaches to the
    attempts already running.
    """
    records = await deps.store.all()
    try:
        for record, revision in records:
            attempt = record.current
            if attempt is not None and policy.tracked(record):
                with structlog.contextvars.bound_contextvars(job_id=record.job_id):
                    await _track_one(record, attempt, revision, deps)
    except RayHeadUnavailableError as away:
        # Nothing Ray says now is news of a job: the pass stops, and the next one asks
        # again. No attempt fails and none is resubmitted while the head is away.
        if deps.head.away_since is None:
            deps.head.away_since = deps.clock.now()
            log.warning("ray.head_away", error=str(away))
    else:
        if deps.head.away_since is not None:
            away_s = (deps.clock.now() - deps.head.away_since).total_seconds()
            log.info("ray.head_back", away_s=round(away_s, 1))
            deps.head.away_since = None
    live = {r.current.submission_id for r, _ in records if r.current is not None}
    for gone in deps.worker_checks.keys() - live:
        del deps.worker_checks[gone]
    # As read at the start of the pass: what this pass changed shows on the next.
    metrics.RECORDS.replace(metrics.record_samples(record for record, _ in records))


async def _track_one(record: JobRecord, attempt: Attempt, revision: Revision, deps: Deps) -> None:
    if await _stop_past_max_hours(record, revision, attempt, deps):
        return  # tracked from its new revision on the next pass
    if policy.give_way_overdue(attempt, deps.clock.now(), deps.give_way_grace_s):
        # It did not checkpoint and stop in time: Ray stops it, and it goes on from the
        # last checkpoint it wrote.
        await deps.ray.stop(attempt.submission_id)
    await _track(record, attempt, revision, deps)


async def _forgotten_may_go_on(attempt: Attempt, deps: Deps) -> bool:
    """Ray has no record of the attempt: whether it may be taken as gone yet
    (`policy.forgotten_may_go_on`), its wait counted from when it was first found so."""
    now = deps.clock.now()
    since = deps.head.forgotten.setdefault(attempt.submission_id, now)
    waited_s = (now - since).total_seconds()
    if policy.forgotten_may_go_on(attempt, await deps.ray.live_nodes(), waited_s):
        deps.head.forgotten.pop(attempt.submission_id, None)
        return True
    if since == now:
        log.info("attempt.waits_for_its_nodes", nodes=sorted(policy.ran_on(attempt)))
    return False


async def _unless_head_away(call: Awaitable[object], doing: str) -> None:
    """`call`, a step the tracker repairs if it is skipped: with Ray's head away it is
    skipped rather than failing the event (a handler retried past its limit would
    dead-letter a good event during an outage)."""
    try:
        await call
    except RayHeadUnavailableError:
        log.info("ray.head_away_skipped", doing=doing)


async def _stop_past_max_hours(
    record: JobRecord, revision: Revision, attempt: Attempt, deps: Deps
) -> bool:
    """Stop a job that ran past its max hours (it ends cancelled, with the reason); whether
    the record moved."""
    stopping = policy.past_max_hours(record, deps.clock.now())
    if stopping is None:
        return False
    try:
        await deps.store.update(stopping, revision)
    except StaleRevisionError:
        return True  # the next pass sees what moved it
    log.info("job.max_hours_reached", max_hours=record.max_hours)
    await deps.ray.stop(attempt.submission_id)
    return True


async def _track(record: JobRecord, attempt: Attempt, revision: Revision, deps: Deps) -> None:
    status = await deps.ray.status(attempt.submission_id)
    if status is None and not await _forgotten_may_go_on(attempt, deps):
        return
    if status is not None and status.state is not RayJobState.PENDING:
        # Progress first: a run that ended since the last pass reported its last steps in
        # between, and they belong before its end.
        moved = await _record_progress(record, revision, deps)
        if moved is None:
            return  # someone moved the record on; the next pass starts from there
        record, revision = moved
    asked = StopAsk.NONE
    lost_workers: tuple[str, ...] = ()
    if status is not None and status.state is RayJobState.FAILED:
        asked = await deps.progress.stop_asked(_checkpoint_uri(record, deps), attempt.number)
        if policy.is_multi_node(record):
            # Ray Train gives up when a loss outruns the script's own retries: that failure
            # is the node's. Ray unable to say counts as no loss.
            lost_workers = await deps.ray.lost_worker_nodes(attempt.submission_id) or ()
    transition = policy.on_ray_status(
        record,
        status,
        deps.clock.now(),
        checkpoint_requested=asked is not StopAsk.NONE,
        moving=asked is StopAsk.MOVE,
        lost_worker_nodes=lost_workers,
    )
    if transition.reason is Reason.NOT_SUBMITTED:
        # Accepted, but the process died before Ray heard of the attempt.
        await _submit(record, attempt, deps)
        return
    if record.cancel_requested and not transition.facts:
        await deps.ray.stop(attempt.submission_id)
    new_revision = await _apply(transition, revision, deps)
    if new_revision is not None and transition.reason is Reason.STARTED:
        await _record_progress(transition.record, new_revision, deps)


async def _record_progress(
    record: JobRecord, revision: Revision, deps: Deps
) -> tuple[JobRecord, Revision] | None:
    """The attempt's latest report, recorded and published once; None if the record moved."""
    report = await deps.progress.latest(_checkpoint_uri(record, deps))
    nodes = None
    if (attempt := record.current) is not None and policy.wants_worker_nodes(record, report):
        nodes = await deps.ray.worker_nodes(attempt.submission_id)
        deps.worker_checks[attempt.submission_id] = deps.clock.now()  # this interval's look
    now = deps.clock.now()
    applied = await _apply_seen(
        record,
        revision,
        lambda current: policy.on_progress(current, report, now, worker_nodes=nodes),
        deps,
    )
    if applied is None:
        return None
    progressed, new_revision = applied
    return await _check_workers(progressed.record, new_revision, deps)


async def _check_workers(
    record: JobRecord, revision: Revision, deps: Deps
) -> tuple[JobRecord, Revision] | None:
    """Where a running multi-node attempt's workers are, as Ray says (now and then): a
    change is a resize, and one short of its MIN for too long goes on as a new attempt."""
    now = deps.clock.now()
    attempt = record.current
    if attempt is None or not policy.watches_workers(record):
        return record, revision
    asked = deps.worker_checks.get(attempt.submission_id)
    if asked is not None and (now - asked).total_seconds() < deps.worker_check_interval_s:
        return record, revision
    deps.worker_checks[attempt.submission_id] = now
    alive = await deps.ray.worker_nodes(attempt.submission_id)
    waiting = await deps.ray.waits_for_room(attempt.submission_id) if alive == () else None
    applied = await _apply_seen(
        record,
        revision,
        lambda current: policy.on_workers_seen(
            current,
            alive,
            now,
            fallback_after_s=deps.short_of_workers_fallback_s,
            waits_for_room=waiting,
        ),
        deps,
    )
    if applied is None:
        return None
    transition, new_revision = applied
    if transition.reason is Reason.NODE_LOST:
        log.info("job.short_of_workers", alive=len(alive or ()), min=record.request.num_workers)
        deps.worker_checks.pop(attempt.submission_id, None)
        await deps.ray.stop(attempt.submission_id)
    return transition.record, new_revision


async def _admit(event: Event[JobRequested], deps: Deps) -> tuple[JobRecord, Revision]:
    async with deps.admission:
        return await _admit_alone(event, deps)


async def _admit_alone(event: Event[JobRequested], deps: Deps) -> tuple[JobRecord, Revision]:
    request = event.data
    records = await _admission_records(deps)
    decision = policy.admit(
        request,
        owner_gpus_in_use=policy.owner_gpus_in_use(records.values(), request.owner),
        owner_waiting=policy.owner_waiting(records.values(), request.owner),
        quotas=deps.quotas,
        now=deps.clock.now(),
    )
    unknown = await _unknown_secrets(request, deps)
    if unknown and isinstance(decision, policy.Accept):
        detail = policy.unknown_secrets_detail(unknown, _team_name(request.owner, deps))
        decision = policy.Reject(RejectionReason.INVALID, detail)
    not_theirs = policy.workspace_refusal(request, deps.workspace_bucket)
    if not_theirs is not None:
        decision = policy.Reject(RejectionReason.INVALID, not_theirs)
    found_team = deps.teams.current().team_of(request.owner) if deps.teams is not None else None
    if isinstance(decision, policy.Accept) and deps.teams is not None:
        decision = await _admit_in_team(request, records, deps)
    record = policy.new_record(
        request,
        event.id,
        decision,
        deps.clock.now(),
        checkpoint_uri=policy.checkpoint_uri(deps.checkpoint_root, request.job_id),
        team=found_team.name if found_team is not None else None,
        max_hours=policy.max_hours_of(request, found_team, deps.default_max_hours),
    )
    revision = await deps.store.create(record)
    if revision is not None:
        deps.admission_view.records[record.job_id] = record
    if revision is not None and record.state is JobState.REJECTED:
        metrics.FINISHED.labels(record.state.value).inc()
    if revision is None:
        # Another delivery of the same request got there first; carry on from its record.
        found = await deps.store.get(request.job_id)
        if found is None:
            msg = f"job {request.job_id} vanished while it was being created"
            raise RuntimeError(msg)
        return found
    return record, revision


async def _admission_records(deps: Deps) -> dict[str, JobRecord]:
    """Every job record, as admission weighs them: read again once the view is older
    than `admission_view_max_age_s` (at once by default)."""
    view = deps.admission_view
    now = deps.monotonic()
    if view.read_at is None or now - view.read_at >= deps.admission_view_max_age_s:
        view.records = {record.job_id: record for record, _ in await deps.store.all()}
        view.read_at = now
    return view.records


_HOLD_TRIES = 32


async def _admit_in_team(
    request: JobRequested, records: Mapping[str, JobRecord], deps: Deps
) -> policy.Admission:
    """Decide under the teams file and write the job's hold by compare-and-set; another
    replica's write in between means deciding again on what it wrote."""
    if deps.teams is None or deps.holds is None:
        msg = "team admission needs the teams file and the holds"
        raise RuntimeError(msg)
    teams = deps.teams.current()
    money = await _money(teams, deps)
    for _ in range(_HOLD_TRIES):
        holds, revision = await deps.holds.read()
        now = deps.clock.now()
        stale = policy.stale_holds(holds, records, now, grace_s=deps.hold_grace_s)
        decision, after = policy.admit_in_team(
            request,
            teams,
            policy.released(holds, stale),
            now,
            records=records,
            min_runtime_s=deps.min_runtime_before_preemption_s,
            money=money,
        )
        if after == holds:
            return decision
        try:
            await deps.holds.write(after, revision)
        except StaleRevisionError:
            metrics.HOLD_CONFLICTS.inc()
            continue
        if isinstance(decision, policy.Accept) and decision.cause is not None:
            for victim in decision.preempting:
                await _ask_to_give_way(victim, decision.cause, request.job_id, deps)
        return decision
    raise RetryLater(0.2, f"the team holds kept changing while {request.job_id} was admitted")


async def _money(teams: Teams, deps: Deps) -> policy.Money | None:
    """What budgets are weighed with, when any team has one and the scaler has said."""
    if deps.pools is None or all(t.monthly_budget_usd is None for t in teams.teams.values()):
        return None
    status, spend = await deps.pools.status(), await deps.pools.spend()
    if status is None or spend is None:
        return None
    return policy.Money(
        spent_by_owner=spend.by_owner,
        gpu_hour_usd={capacity: gpu_hour_usd(status, capacity) for capacity in CapacityClass},
        default_max_hours=deps.default_max_hours,
    )


async def _ask_to_give_way(job_id: str, cause: InterruptionCause, for_job: str, deps: Deps) -> None:
    """Ask a job to checkpoint and stop for `for_job`: its record says so (the tracker
    stops it in Ray if it has not stopped within the grace), and CHECKPOINT_NOW asks its
    training loop. One not on a node yet is stopped in Ray at once: it loses nothing."""
    for _ in range(_HOLD_TRIES):
        found = await deps.store.get(job_id)
        if found is None:
            return
        record, revision = found
        queued = policy.gave_way_queued(record, cause, for_job, deps.clock.now())
        if queued is not None:
            if await _apply(queued, revision, deps) is None:
                continue
            metrics.GIVE_WAY_ASKED.labels(cause.value).inc()
            log.info("job.gave_way_queued", job_id=job_id, cause=cause.value, for_job=for_job)
            return
        asked = policy.give_way(record, cause, for_job, deps.clock.now())
        if asked is None:
            return
        try:
            await deps.store.update(asked, revision)
        except StaleRevisionError:
            continue
        attempt = asked.current
        if attempt is None:
            return
        metrics.GIVE_WAY_ASKED.labels(cause.value).inc()
        log.info("job.asked_to_give_way", job_id=job_id, cause=cause.value, for_job=for_job)
        if attempt.state is AttemptState.SUBMITTED:
            # Overdue by the grace, the tracker stops it when the head answers.
            await _unless_head_away(deps.ray.stop(attempt.submission_id), "stop")
            return
        request = CheckpointRequest(
            job_id=job_id, attempt=attempt.number, requested_at=deps.clock.now()
        )
        await deps.progress.request_stop(_checkpoint_uri(asked, deps), request)
        return


async def _release(job_id: str, deps: Deps) -> None:
    """Give an ended job's GPUs back to its team's quota."""
    if deps.holds is None:
        return
    for _ in range(_HOLD_TRIES):
        holds, revision = await deps.holds.read()
        if job_id not in holds.holds:
            return
        try:
            await deps.holds.write(policy.released(holds, [job_id]), revision)
        except StaleRevisionError:
            metrics.HOLD_CONFLICTS.inc()
            continue
        log.info("team.hold_released", job_id=job_id)
        return
    # Left for the next admission's clean-up: a hold of an ended job is dropped there.
    log.warning("team.hold_release_deferred", job_id=job_id)


async def admit_waiting(deps: Deps) -> None:
    """Give waiting jobs their quota as it frees (their owner's, then their team's), higher
    priority first, then older; and publish what `spotrain teams` shows. One pass; a lost
    race waits for the next."""
    found = await deps.store.all()
    records = {record.job_id: record for record, _ in found}
    revisions = {record.job_id: revision for record, revision in found}
    in_use: dict[str, int] = {}
    for record in records.values():
        owner = record.request.owner
        in_use[owner] = in_use.get(owner, 0) + policy.owner_gpus_in_use([record], owner)
    # A job that must wait says that a later one of its team and class, no smaller and no
    # higher, waits too: one decision each, not one per waiting job, per pass.
    blocked: dict[policy.WaitingClass, tuple[int, int]] = {}
    for record in policy.waiting_order(records.values()):
        owner = record.request.owner
        if policy.waits_behind(record, blocked):
            continue
        with structlog.contextvars.bound_contextvars(job_id=record.job_id):
            over = policy.owner_over_quota(record.request, in_use.get(owner, 0), deps.quotas)
            decision: policy.Admission
            if over is not None:
                decision = policy.WaitForQuota(over)
            elif deps.teams is not None and deps.holds is not None:
                decision = await _admit_in_team(record.request, records, deps)
                if not isinstance(decision, policy.Accept):
                    blocked[policy.waiting_class(record)] = (record.gpus, record.request.priority)
            else:
                decision = policy.Accept(gpus=record.gpus)
            if isinstance(decision, policy.Accept):
                admitted = await _quota_freed(record, revisions[record.job_id], deps)
                if admitted is not None:
                    records[record.job_id] = admitted
                    in_use[owner] = in_use.get(owner, 0) + record.gpus
                continue
            reason = (
                decision.reason if isinstance(decision, policy.WaitForQuota) else decision.detail
            )
            if reason != record.waiting_for:
                updated = record.model_copy(
                    update={"waiting_for": reason, "updated_at": deps.clock.now()}
                )
                with contextlib.suppress(StaleRevisionError):
                    await deps.store.update(updated, revisions[record.job_id])
    if deps.teams is None or deps.holds is None:
        return
    holds, _ = await deps.holds.read()
    teams = deps.teams.current()
    money = await _money(teams, deps)
    spent = money.spent_by_owner if money is not None else None
    await deps.holds.publish_status(
        policy.teams_status(teams, holds, records.values(), deps.clock.now(), spent)
    )


async def _quota_freed(record: JobRecord, revision: Revision, deps: Deps) -> JobRecord | None:
    """Give a waiting job, whose hold is written, its attempt and submit it; None if it no
    longer waits (cancelled, or another replica did it). A record that moved meanwhile
    only by another replica's new reason to wait is read again: the hold is what counts."""
    for _ in range(_HOLD_TRIES):
        if not record.is_active or record.waiting_for is None:
            return None
        admitted = policy.quota_freed(record, deps.clock.now())
        try:
            await deps.store.update(admitted, revision)
        except StaleRevisionError:
            found = await deps.store.get(record.job_id)
            if found is None:
                return None
            record, revision = found
            continue
        attempt = admitted.attempts[-1]
        queued = policy.queued_event(admitted, attempt, deps.clock.now())
        key = f"queued-{record.job_id}-{attempt.number}"
        await _publish(deps, queued, key if attempt.requeued == 0 else f"{key}-r{attempt.requeued}")
        log.info("job.quota_freed", owner=record.request.owner, team=record.team, gpus=record.gpus)
        return admitted
    return None


async def _unknown_secrets(request: JobRequested, deps: Deps) -> list[str]:
    names = sorted(set(request.secrets.values()))
    if not names:
        return []
    if deps.secrets is None:
        return names
    team = _team_name(request.owner, deps)
    return [name for name in names if await deps.secrets.value(name, team) is None]


def _team_name(owner: str, deps: Deps) -> str | None:
    found = deps.teams.current().team_of(owner) if deps.teams is not None else None
    return found.name if found is not None else None


async def _submit(record: JobRecord, attempt: Attempt, deps: Deps) -> None:
    working_dir = None
    if record.request.working_dir is not None:
        working_dir = await deps.workspaces.unpack(record.request.working_dir)
    plan = policy.plan_submission(
        record,
        attempt,
        checkpoint_uri=_checkpoint_uri(record, deps),
        driver_labels=deps.driver_labels,
    )
    if record.request.secrets:
        # Looked up now, for this submission only: the value goes to Ray and nowhere else.
        values = {}
        for variable, name in record.request.secrets.items():
            # The record's team: the one it was admitted in, whatever the file says now.
            value = await deps.secrets.value(name, record.team) if deps.secrets else None
            if value is None:
                msg = f"the secret {name} of {record.job_id} is gone; the attempt waits for it"
                raise RetryLater(5.0, msg)
            values[variable] = value
        plan = plan.model_copy(update={"env_vars": {**plan.env_vars, **values}})
    try:
        await deps.ray.submit(plan, working_dir)
    except RayHeadUnavailableError:
        # The attempt stays handed over in its record: once the head answers, Ray has
        # not heard of it and the tracker submits it (`Reason.NOT_SUBMITTED`).
        log.info("attempt.waits_for_the_head", submission_id=plan.submission_id)
        return
    log.info("attempt.submitted", submission_id=plan.submission_id)


def _checkpoint_uri(record: JobRecord, deps: Deps) -> str:
    # Records written before the record carried its URI fall back to the root's layout.
    return record.checkpoint_uri or policy.checkpoint_uri(deps.checkpoint_root, record.job_id)


async def _apply_seen(
    record: JobRecord,
    revision: Revision,
    decide: Callable[[JobRecord], Transition],
    deps: Deps,
    *,
    tries: int = 3,
) -> tuple[Transition, Revision] | None:
    """What was seen of a running attempt (a report, where Ray has its workers), decided
    and applied; when another writer moved the record on first, decided again on the
    fresh record from the same sighting. Its facts are published before the record is
    written: decided again, they are the same facts (the bus keeps one), and the record
    says them. Left to the next pass, the sighting is gone by then (a group already grown
    back), and the record would never say what was published (a shrink)."""
    for _ in range(tries):
        transition = decide(record)
        new_revision = await _apply(transition, revision, deps)
        if new_revision is not None:
            return transition, new_revision
        found = await deps.store.get(record.job_id)
        if found is None:
            return None
        record, revision = found
    return None


async def _apply(transition: Transition, revision: Revision, deps: Deps) -> Revision | None:
    """Publish the transition's facts, then write its record; the next pass repairs a gap.

    Returns the record's new revision, or None when someone else moved it on first.
    """
    for fact in transition.facts:
        await _publish(deps, fact.data, fact.key)
    if transition.reason is Reason.UNCHANGED and not transition.record.cancel_requested:
        return revision
    try:
        revision = await deps.store.update(transition.record, revision)
    except StaleRevisionError:
        log.info("job.record_moved_on", reason=transition.reason.value)
        return None
    if not transition.record.is_active:
        await _release(transition.record.job_id, deps)
    if transition.reason is not Reason.PROGRESSED:
        state = transition.record.state.value
        log.info("job.transition", reason=transition.reason.value, state=state)
        _count(transition)
    return revision


def _count(transition: Transition) -> None:
    """Counted once the record says so, so a transition retried after a lost race is not
    counted twice."""
    record = transition.record
    attempt = record.current
    if transition.reason is Reason.STARTED and attempt is not None:
        capacity = record.capacity_of(attempt).value
        metrics.ATTEMPTS_STARTED.labels(attempt.pool or "unknown", capacity).inc()
        lost = record.attempts[-2] if len(record.attempts) > 1 else None
        if (
            lost is not None
            and lost.state is AttemptState.LOST
            and lost.ended_at is not None
            and attempt.started_at is not None
        ):
            took = (attempt.started_at - lost.ended_at).total_seconds()
            metrics.RECOVERY_SECONDS.observe(max(took, 0.0))
    for fact in transition.facts:
        if isinstance(fact.data, JobInterrupted):
            metrics.ATTEMPTS_LOST.labels(fact.data.cause.value).inc()
        if isinstance(fact.data, JobResized) and fact.data.reason is not ResizeReason.COUNTED:
            metrics.RESIZES.labels(fact.data.reason.value).inc()
    if not record.is_active and transition.reason is not Reason.UNCHANGED:
        metrics.FINISHED.labels(record.state.value).inc()


async def _publish(deps: Deps, data: EventData, key: str) -> None:
    event = new_event(
        data,
        source=SERVICE,
        time=deps.clock.now(),
        event_id=f"job-{key}",
        subject=getattr(data, "job_id", None),
    )
    await deps.bus.publish(event)


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    JobRequested: on_job_requested,
    JobCancelRequested: on_job_cancel_requested,
    JobPlaced: on_job_placed,
    JobResumed: on_job_resumed,
    JobFailed: on_job_failed,
}
