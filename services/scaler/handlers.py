"""The scaler's reactions to events; the SUBSCRIPTIONS table at the bottom says which.

Until the scaling policy lands, the scaler records the demand it sees in its log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from shared.events import Event, EventData
from shared.events.data import JobCancelled, JobFailed, JobQueued, JobStarted, JobSucceeded
from shared.messaging import EventPublisher, HandlerWithDeps

SERVICE = "scaler"
log = structlog.get_logger()


@dataclass(frozen=True)
class Deps:
    bus: EventPublisher


async def on_job_queued(event: Event[JobQueued], deps: Deps) -> None:
    demand = event.data
    log.info(
        "demand.queued",
        attempt=demand.attempt,
        gpus=sum(bundle.gpus for bundle in demand.bundles),
        bundles=len(demand.bundles),
        capacity=demand.capacity.value,
    )


async def on_job_settled(event: Event[Any], deps: Deps) -> None:
    """A job left the queue (started) or the cluster (ended): its demand is gone."""
    log.info("demand.settled", event_type=event.type)


SUBSCRIPTIONS: dict[type[EventData], HandlerWithDeps[Deps]] = {
    JobQueued: on_job_queued,
    JobStarted: on_job_settled,
    JobSucceeded: on_job_settled,
    JobFailed: on_job_settled,
    JobCancelled: on_job_settled,
}
