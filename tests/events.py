"""Builders of valid events for tests, so each test states only what it cares about."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shared.events import Event, new_event
from shared.events.data import JobPlaced, JobRequested

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def job_requested(job_id: str = "job-1", **fields: Any) -> Event[JobRequested]:
    data = JobRequested(
        job_id=job_id,
        owner=fields.pop("owner", "alice"),
        entrypoint=fields.pop("entrypoint", ("python", "train.py")),
        **fields,
    )
    return new_event(data, source="tests", time=NOW, subject=job_id)


def job_placed(
    job_id: str = "job-1",
    attempt: int = 1,
    nodes: tuple[str, ...] = ("gpu-spot-1",),
    *,
    requeued: int = 0,
    pool: str = "gpu-spot",
) -> Event[JobPlaced]:
    """The scaler's placement of a queued attempt on named nodes."""
    data = JobPlaced(job_id=job_id, attempt=attempt, nodes=nodes, requeued=requeued, pool=pool)
    key = f"placed-{job_id}-{attempt}-{requeued}-{'-'.join(nodes)}"
    return new_event(data, source="scaler", time=NOW, event_id=key, subject=job_id)
