"""What the submitter needs from the world, each with the semantics it relies on."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from services.submitter.model import JobRecord, RayJobStatus, SubmissionPlan
from shared.checkpoints import CheckpointRequest, ProgressReport, StopAsk
from shared.events.types import ObjectRef
from shared.policy.teams import TeamHolds, Teams, TeamsStatus
from shared.pools import OwnersSpend, PoolsStatus

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
    """Ray's Job Submission API. `submit`, `status`, `stop` and `logs` raise
    `shared.ray_head.RayHeadUnavailableError` while the head does not answer; the others
    then say they cannot tell (None)."""

    async def submit(self, plan: SubmissionPlan, working_dir: Path | None) -> None:
        """Submit one attempt. Idempotent by submission id: submitting an attempt Ray
        already knows is not an error and starts nothing new."""
        ...

    async def status(self, submission_id: str) -> RayJobStatus | None:
        """What Ray says of an attempt; None if Ray has never heard of it (or forgot it: a
        head back without its state)."""
        ...

    async def stop(self, submission_id: str) -> None:
        """Ask Ray to stop an attempt; a no-op for one that ended or is unknown."""
        ...

    async def worker_nodes(self, submission_id: str) -> tuple[str, ...] | None:
        """The nodes that hold an attempt's Ray Train workers now, one per worker, sorted;
        None when Ray cannot say (its state API is down, the attempt is unknown)."""
        ...

    async def waits_for_room(self, submission_id: str) -> bool | None:
        """Whether an attempt's Ray Train group waits for room (a placement group of its
        job pending): a group with no worker alive is then down, not between two groups
        or done. None when Ray cannot say."""
        ...

    async def logs(self, submission_id: str) -> str | None:
        """What the attempt printed, as Ray keeps it; None when Ray has no such job."""
        ...

    async def live_nodes(self) -> frozenset[str] | None:
        """The platform's nodes alive in Ray now (their `spotrain-node` labels); None when
        Ray cannot say."""
        ...

    async def lost_worker_nodes(self, submission_id: str) -> tuple[str, ...] | None:
        """The nodes that held any of an attempt's Ray Train workers and are dead now:
        its failure may be theirs, not its code's. None when Ray cannot say."""
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

    async def kept_output(self, checkpoint_uri: str, attempt: int) -> str | None:
        """The end of what an attempt printed, as its launcher kept it beside the job's
        checkpoints; None when it kept nothing."""
        ...

    async def request_stop(self, checkpoint_uri: str, request: CheckpointRequest) -> None:
        """Ask the attempt to checkpoint and stop (CHECKPOINT_NOW), to give way."""
        ...


class Workspaces(Protocol):
    """Packed working directories that clients uploaded for their jobs."""

    async def unpack(self, ref: ObjectRef) -> Path:
        """A local folder with the working directory's files, verified against its hash."""
        ...


class TeamsSource(Protocol):
    """The teams file."""

    def current(self) -> Teams:
        """The last valid teams: a file that turned bad since is logged and not used."""
        ...


class Secrets(Protocol):
    """The platform's secrets, by name (a folder of files, a mounted Kubernetes Secret)."""

    async def value(self, name: str, team: str | None) -> str | None:
        """The secret's value for a job of `team` (its own secrets only; a platform
        without teams has one set); None when there is no such secret for it."""
        ...


class PoolsReader(Protocol):
    """The scaler's `pools` bucket, read for team budgets: prices, and owners' spend."""

    async def status(self) -> PoolsStatus | None: ...

    async def spend(self) -> OwnersSpend | None:
        """What each owner spent this month by the ledger; None before the scaler said."""
        ...


class TeamHoldStore(Protocol):
    """The teams bucket: every job's hold on its team's quota, as one value that every
    submitter replica writes by compare-and-set only, and the status clients read."""

    async def read(self) -> tuple[TeamHolds, Revision | None]:
        """The holds and their revision; None before the first write."""
        ...

    async def write(self, holds: TeamHolds, revision: Revision | None) -> Revision:
        """Replace the holds if still at `revision` (None: create them), else raise
        StaleRevisionError."""
        ...

    async def publish_status(self, status: TeamsStatus) -> None: ...


class RequestAllowances(Protocol):
    """Each person's share of requests (`shared.desk.take_request`)."""

    async def take(self, person: str) -> float | None:
        """Count one request of `person`'s: None if it may go, else in how many seconds
        one may."""
        ...
