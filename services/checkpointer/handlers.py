"""The checkpointer's reactions; the SUBSCRIPTIONS table at the bottom says which.

A notice asks the attempts on the node to checkpoint now and tells Ray to place nothing
new there; a loss (the node gone, or the submitter's `job.interrupted`) resumes the job
from its latest checkpoint as the next attempt. The checkpointer decides and publishes
`job.resumed`; the submitter, the only writer of job records, submits the attempt. Both
paths of one loss meet in `recover`, which resumes an attempt at most once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import structlog

from services.checkpointer import metrics, policy
from services.checkpointer.model import GiveUp, RecoveryConfig, Resume
from services.checkpointer.ports import CheckpointStore, JobReader, RayNodes
from shared.checkpoints import CheckpointRequest
from shared.clock import Clock
from shared.events import Event, EventData, new_event
from shared.events.data import JobInterrupted, NodeLost, NodePreempting
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "checkpointer"
log = structlog.get_logger()


@dataclass(frozen=True)
class Deps:
    bus: EventPublisher
    clock: Clock
    jobs: JobReader
    checkpoints: CheckpointStore
    ray: RayNodes
    config: RecoveryConfig
    counted: set[str] = field(default_factory=set)
    """What the metrics already counted: the same loss arrives from several sources, a
    decision is published again on every repeat (the bus keeps one), and neither is news."""


async def on_node_preempting(event: Event[NodePreempting], deps: Deps) -> None:
    notice = event.data
    now = deps.clock.now()
    if _first_time(deps, f"notice-{notice.node}"):
        metrics.NOTICES.labels(notice.pool or metrics.UNKNOWN_POOL).inc()
    drained = await deps.ray.drain(notice.node, notice.deadline)
    asked = policy.checkpoint_now(
        await deps.jobs.active(), notice.node, notice.deadline, now, deps.config
    )
    for record, attempt in asked:
        if record.checkpoint_uri is None:
            continue
        request = CheckpointRequest(job_id=record.job_id, attempt=attempt.number, requested_at=now)
        await deps.checkpoints.request(record.checkpoint_uri, request)
        metrics.CHECKPOINT_REQUESTS.inc()
        log.info("checkpoint.requested", job_id=record.job_id, attempt=attempt.number)
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
    await _recover(event.data.job_id, event.data.attempt, deps, signalled_at=event.time)


async def _recover(job_id: str, attempt: int, deps: Deps, *, signalled_at: datetime) -> None:
    record = await deps.jobs.get(job_id)
    if record is None:
        log.warning("job.unknown", job_id=job_id)
        return
    checkpoint = None
    if record.checkpoint_uri is not None:
        checkpoint = await deps.checkpoints.latest(record.checkpoint_uri)
    match policy.recover(record, attempt, checkpoint, deps.config):
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
