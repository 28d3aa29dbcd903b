"""The submitter's reactions to events; the SUBSCRIPTIONS table at the bottom says which."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from shared.clock import Clock
from shared.events import Event, EventData, new_event
from shared.events.data import JobAccepted, JobCancelRequested, JobRequested
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "submitter"
log = structlog.get_logger()


@dataclass(frozen=True)
class Deps:
    bus: EventPublisher
    clock: Clock


async def on_job_requested(event: Event[JobRequested], deps: Deps) -> None:
    """Accept a request that passed the contract's validation.

    The accepted event's id is derived from the job id, so a request delivered twice,
    or replayed later, is accepted once: the server drops the second copy.
    """
    request = event.data
    accepted = new_event(
        JobAccepted(job_id=request.job_id, owner=request.owner, experiment=request.experiment),
        source=SERVICE,
        time=deps.clock.now(),
        event_id=f"job-accepted-{request.job_id}",
        subject=request.job_id,
    )
    ack = await deps.bus.publish(accepted)
    log.info("job.accepted", owner=request.owner, duplicate=ack.duplicate)


async def on_job_cancel_requested(event: Event[JobCancelRequested], deps: Deps) -> None:
    log.info("job.cancel_requested", requested_by=event.data.requested_by)


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    JobRequested: on_job_requested,
    JobCancelRequested: on_job_cancel_requested,
}
