"""What the submitter needs from the world, each with the semantics it relies on."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from services.submitter.model import JobRecord, RayJobStatus, SubmissionPlan
from shared.checkpoints import ProgressReport, StopAsk
from shared.events.types import ObjectRef

Revision = int


class StaleRevisionError(Exception):
    """The record changed since it was read; read it again and decide again."""


class JobStore(Protocol):
    """The `jobs` bucket. The submitter is its only writer; every write is compare-and-set."""

    async def create(self, record: JobRecord) -> Revision | None:
        """Store a new record; None if the job id already has one."""
        ...

    async def get(self, job_id: str) -> tuple[JobRecord, Revision] | None: ...

    async def update(self, record: JobRecord, revision: Revision) -> Revision:
        """Replace the record if it is still at `revision`, else raise StaleRevisionError."""
        ...

    async def all(self) -> list[tuple[JobRecord, Revision]]:
        """Every record, in no particular order."""
        ...


class RayJobs(Protocol):
    """Ray's Job Submission API."""

    async def submit(self, plan: SubmissionPlan, working_dir: Path | None) -> None:
        """Submit one attempt. Idempotent by submission id: submitting an attempt Ray
        already knows is not an error and starts nothing new."""
        ...

    async def status(self, submission_id: str) -> RayJobStatus | None:
        """What Ray says of an attempt; None if Ray has never heard of it."""
        ...

    async def stop(self, submission_id: str) -> None:
        """Ask Ray to stop an attempt; a no-op for one that ended or is unknown."""
        ...


class ProgressReader(Protocol):
    """Progress that training code writes beside its checkpoints (`shared.training`)."""

    async def latest(self, checkpoint_uri: str) -> ProgressReport | None:
        """The job's last report; None if it has reported nothing yet. Eventually
        consistent: a report may lag the training loop by one write."""
        ...

    async def stop_asked(self, checkpoint_uri: str, attempt: int) -> StopAsk:
        """Whether the platform asked `attempt` to checkpoint and stop (CHECKPOINT_NOW), and
        why: its node goes, or the job moves to other capacity."""
        ...


class Workspaces(Protocol):
    """Packed working directories that clients uploaded for their jobs."""

    async def unpack(self, ref: ObjectRef) -> Path:
        """A local folder with the working directory's files, verified against its hash."""
        ...
