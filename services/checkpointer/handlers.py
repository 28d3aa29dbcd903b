"""The checkpointer's reactions; the SUBSCRIPTIONS table at the bottom says which.

A notice asks the attempts on the node to checkpoint now and tells Ray to place nothing
new there; a loss (the node gone, or the submitter's `job.interrupted`) resumes the job
from its latest checkpoint as the next attempt. The checkpointer decides and publishes
`job.resumed`; the submitter, the only writer of job records, submits the attempt. Both
paths of one loss meet in `recover`, which resumes an attempt at most once.

A review (`review_moves`, every few seconds) moves running deadline jobs between spot and
on-demand as the deadline policy says: it asks the attempt to checkpoint and stop, and
when it has stopped (or has not within the wait) resumes it on the other capacity.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from services.checkpointer import metrics, policy
from services.checkpointer.model import GiveUp, JobRecord, Move, MoveConfig, RecoveryConfig, Resume
from services.checkpointer.ports import CheckpointStore, JobReader, PoolsReader, RayNodes
from shared.checkpoints import CheckpointRequest
from shared.clock import Clock
from shared.events import Event, EventData, new_event
from shared.events.data import JobInterrupted, JobMoveRequested, NodeLost, NodePreempting
from shared.jobs import PLATFORM_STOPS, bundles_of
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "checkpointer"
log = structlog.get_logger()


@dataclass(frozen=True)
class PendingMove:
    move: Move
    asked_at: datetime
    """When the attempt was asked to checkpoint and stop."""


@dataclass(frozen=True)
class Deps:
    bus: EventPublisher
    clock: Clock
    jobs: JobReader
    checkpoints: CheckpointStore
    ray: RayNodes
    config: RecoveryConfig
    pools: PoolsReader
    moves: MoveConfig = field(default_factory=MoveConfig)
    moving: dict[str, PendingMove] = field(default_factory=dict)
    """Moves asked for and not yet resumed, by job. In memory: after a restart, the stopped
    attempt resumes as after a loss (spending nothing of its budget) and the next review
    decides again."""
    counted: set[str] = field(default_factory=set)
    """What the metrics already counted: the same loss arrives from several sources, a
    decision is published again on every repeat (the bus keeps one), and neither is news."""


async def on_node_preempting(event: Event[NodePreempting], deps: Deps) -> None:
    notice = event.data
    now = deps.clock.now()
    if _first_time(deps, f"notice-{notice.node}"):
        metrics.NOTICES.labels(notice.pool or metrics.UNKNOWN_POOL).inc()
    # Alongside the checkpoint requests, not before them: a head that is away keeps the
    # drain waiting for its GCS for many seconds of a short notice.
    draining = asyncio.create_task(deps.ray.drain(notice.node, notice.deadline))
    asked = policy.checkpoint_now(
        await deps.jobs.active(), notice.node, notice.deadline, now, deps.config
    )
    for record, attempt in asked:
        if record.checkpoint_uri is None:
            continue
        request = CheckpointRequest(
            job_id=record.job_id,
            attempt=attempt.number,
            requested_at=now,
            save_by=notice.deadline,
        )
        await deps.checkpoints.request(record.checkpoint_uri, request)
        metrics.CHECKPOINT_REQUESTS.inc()
        log.info("checkpoint.requested", job_id=record.job_id, attempt=attempt.number)
    drained = await draining
    log.info(
        "node.preempting",
        node=notice.node,
        deadline=notice.deadline.isoformat(),
        notice_s=round((notice.deadline - now).total_seconds(), 1),
        drained=drained,
        attempts=len(asked),
    )


async def on_node_lost(event: Event[NodeLost], deps: Deps) -> None:
    lost = event.data
    if _first_time(deps, f"lost-{lost.node}"):
        metrics.LOSSES.labels(lost.pool or metrics.UNKNOWN_POOL).inc()
    concerned = policy.attempts_on(await deps.jobs.active(), lost.node)
    for record, attempt in concerned:
        await _recover(record.job_id, attempt.number, deps, signalled_at=lost.lost_at or event.time)
    log.info("node.lost", node=lost.node, source=lost.source.value, attempts=len(concerned))


async def on_job_interrupted(event: Event[JobInterrupted], deps: Deps) -> None:
    await _recover(
        event.data.job_id,
        event.data.attempt,
        deps,
        signalled_at=event.time,
        platform_stop=event.data.cause in PLATFORM_STOPS,
    )


async def review_moves(deps: Deps) -> None:
    """Every running deadline job, by the deadline policy: ask those that should change
    capacity to checkpoint and stop; resume on the other capacity those that were asked and
    did not stop within the wait (from the latest checkpoint there is)."""
    now = deps.clock.now()
    records = {record.job_id: record for record in await deps.jobs.active()}
    for job_id, asked in list(deps.moving.items()):
        current = records[job_id].current if job_id in records else None
        if current is None or current.number != asked.move.attempt:
            del deps.moving[job_id]  # resumed (by either path), or ended
    pools = await deps.pools.status()
    if pools is None:
        return  # no scaler yet: nothing says what spot looks like
    for record in records.values():
        pending = deps.moving.get(record.job_id)
        if pending is not None:
            if (now - pending.asked_at).total_seconds() >= deps.moves.checkpoint_wait_s:
                await _resume_moved(record, pending.move, deps, signalled_at=pending.asked_at)
            continue
        move = policy.move(record, pools, now, deps.moves)
        if move is None:
            continue
        if not move.room:
            await _ask_for_room(record, move, deps)
            continue
        deps.moving[record.job_id] = PendingMove(move, asked_at=now)
        log.info(
            "job.move",
            job_id=record.job_id,
            attempt=move.attempt,
            to=move.capacity.value,
            reason=move.reason.value,
            slack_s=round(move.slack_s),
        )
        if record.checkpoint_uri is None:
            await _resume_moved(record, move, deps, signalled_at=now)
            continue
        request = CheckpointRequest(
            job_id=record.job_id, attempt=move.attempt, requested_at=now, moving=True
        )
        await deps.checkpoints.request(record.checkpoint_uri, request)
        metrics.CHECKPOINT_REQUESTS.inc()


async def _ask_for_room(record: JobRecord, move: Move, deps: Deps) -> None:
    """Make before break: the scaler grows the capacity the job would move to (or learns
    that the market has none), and a later review moves the job once there is room."""
    wanted = JobMoveRequested(
        job_id=record.job_id,
        attempt=move.attempt,
        capacity=move.capacity,
        bundles=bundles_of(record.request),
        priority=record.request.priority,
        reason=move.reason,
    )
    event_id = f"job-move-requested-{record.job_id}-{move.attempt}-{move.capacity.value}"
    await _publish(deps, wanted, event_id, record.job_id)
    if _first_time(deps, event_id):
        log.info("job.move_requested", job_id=record.job_id, attempt=move.attempt)


async def _resume_moved(
    record: JobRecord, move: Move, deps: Deps, *, signalled_at: datetime
) -> None:
    checkpoint = None
    if record.checkpoint_uri is not None:
        checkpoint = await deps.checkpoints.latest(record.checkpoint_uri)
    match policy.moved(record, move, checkpoint):
        case Resume(resumed=resumed):
            event_id = f"job-resumed-{record.job_id}-{resumed.attempt}"
            await _publish(deps, resumed, event_id, record.job_id)
            if _first_time(deps, f"resumed-{record.job_id}-{resumed.attempt}"):
                metrics.MOVES.labels(move.reason.value).inc()
                metrics.RESUMES.labels(resumed.capacity.value).inc()
                took = (deps.clock.now() - signalled_at).total_seconds()
                metrics.DECISION_SECONDS.observe(max(took, 0.0))
            log.info(
                "job.moved",
                job_id=record.job_id,
                attempt=resumed.attempt,
                from_step=resumed.from_step,
                steps_lost=resumed.steps_lost,
                capacity=resumed.capacity.value,
                reason=move.reason.value,
            )
        case skip:
            log.info("job.not_moved", job_id=record.job_id, attempt=move.attempt, why=str(skip))


async def _recover(
    job_id: str, attempt: int, deps: Deps, *, signalled_at: datetime, platform_stop: bool = False
) -> None:
    record = await deps.jobs.get(job_id)
    if record is None:
        log.warning("job.unknown", job_id=job_id)
        return
    pending = deps.moving.get(job_id)
    if pending is not None and pending.move.attempt == attempt:
        # Stopped as it was asked to (or lost meanwhile): it goes on where it was moving to.
        await _resume_moved(record, pending.move, deps, signalled_at=signalled_at)
        return
    checkpoint = None
    if record.checkpoint_uri is not None:
        checkpoint = await deps.checkpoints.latest(record.checkpoint_uri)
    match policy.recover(record, attempt, checkpoint, deps.config, platform_stop=platform_stop):
        case Resume(resumed=resumed):
            await _publish(deps, resumed, f"job-resumed-{job_id}-{resumed.attempt}", job_id)
            if _first_time(deps, f"resumed-{job_id}-{resumed.attempt}"):
                metrics.RESUMES.labels(resumed.capacity.value).inc()
                took = (deps.clock.now() - signalled_at).total_seconds()
                metrics.DECISION_SECONDS.observe(max(took, 0.0))
            log.info(
                "job.resume",
                job_id=job_id,
                attempt=resumed.attempt,
                from_step=resumed.from_step,
                steps_lost=resumed.steps_lost,
                capacity=resumed.capacity.value,
            )
        case GiveUp(failed=failed):
            await _publish(deps, failed, f"job-failed-{job_id}-{attempt}", job_id)
            if _first_time(deps, f"given-up-{job_id}"):
                metrics.GIVE_UPS.inc()
            log.warning("job.given_up", job_id=job_id, attempt=attempt, why=failed.message)
        case skip:
            log.info("job.not_resumed", job_id=job_id, attempt=attempt, why=skip.why)


def _first_time(deps: Deps, key: str) -> bool:
    if key in deps.counted:
        return False
    deps.counted.add(key)
    return True


async def _publish(deps: Deps, data: EventData, event_id: str, job_id: str) -> None:
    await deps.bus.publish(
        new_event(data, source=SERVICE, time=deps.clock.now(), event_id=event_id, subject=job_id)
    )


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    NodePreempting: on_node_preempting,
    NodeLost: on_node_lost,
    JobInterrupted: on_job_interrupted,
}
