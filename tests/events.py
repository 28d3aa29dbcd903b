"""Builders of valid events for tests, so each test states only what it cares about."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shared.events import Event, new_event
from shared.events.data import JobRequested

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def job_requested(job_id: str = "job-1", **fields: Any) -> Event[JobRequested]:
    data = JobRequested(
        job_id=job_id,
        owner=fields.pop("owner", "alice"),
        entrypoint=fields.pop("entrypoint", ("python", "train.py")),
        **fields,
    )
    return new_event(data, source="tests", time=NOW, subject=job_id)
