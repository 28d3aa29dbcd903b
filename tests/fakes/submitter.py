"""Fakes of the submitter's ports, with the same semantics as the real adapters."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from services.submitter.handlers import Deps, on_job_placed
from services.submitter.model import (
    AttemptState,
    JobRecord,
    RayJobState,
    RayJobStatus,
    SubmissionPlan,
)
from services.submitter.policy import Quotas
from services.submitter.ports import Revision, StaleRevisionError
from shared.checkpoints import CheckpointRequest, ProgressReport, StopAsk
from shared.events import new_event
from shared.events.data import JobPlaced
from shared.events.types import ObjectRef
from shared.messaging.memory import InMemoryBus
from shared.policy.teams import TeamHolds, Teams, TeamsStatus
from shared.pools import OwnersSpend, PoolsStatus
from shared.ray_head import RayHeadUnavailableError
from tests.fakes.clock import FixedClock


class InMemoryJobStore:
    def __init__(self) -> None:
        self.records: dict[str, tuple[JobRecord, Revision]] = {}
        self._revision = 0
        self.reads = 0
        """How often every record was read (`all`)."""

    def _next(self) -> Revision:
        self._revision += 1
        return self._revision

    async def create(self, record: JobRecord) -> Revision | None:
        if record.job_id in self.records:
            return None
        revision = self._next()
        self.records[record.job_id] = (record, revision)
        return revision

    async def get(self, job_id: str) -> tuple[JobRecord, Revision] | None:
        return self.records.get(job_id)

    async def update(self, record: JobRecord, revision: Revision) -> Revision:
        current = self.records.get(record.job_id)
        if current is None or current[1] != revision:
            raise StaleRevisionError(record.job_id)
        new_revision = self._next()
        self.records[record.job_id] = (record, new_revision)
        return new_revision

    async def all(self) -> list[tuple[JobRecord, Revision]]:
        self.reads += 1
        records = list(self.records.values())
        # A real bucket answers over the network: others run while the answer travels.
        await asyncio.sleep(0)
        return records

    def state_of(self, job_id: str) -> str:
        return self.records[job_id][0].state.value


class FakeRay:
    """Ray's Job Submission API as a table of submissions whose states a test sets."""

    def __init__(self) -> None:
        self.submitted: list[tuple[SubmissionPlan, Path | None]] = []
        self.statuses: dict[str, RayJobStatus] = {}
        self.stopped: list[str] = []
        self.workers: dict[str, tuple[str, ...]] = {}
        """Submission id -> the nodes its Ray Train workers are on, as a test sets them."""
        self.waiting: set[str] = set()
        """Submission ids whose Ray Train group waits for room (a pending placement group)."""
        self.lost_workers: dict[str, tuple[str, ...]] = {}
        """Submission id -> the dead nodes that held its Ray Train workers."""
        self.worker_lookups: list[str] = []
        self.printed: dict[str, str] = {}
        """Submission id -> what its command printed."""
        self.away = False
        """Ray's head does not answer: `submit`, `status`, `stop` and `logs` raise."""
        self.nodes_seen: set[str] = set()
        """The nodes attempts were pinned to or ran on, as submissions and statuses said."""
        self.down: set[str] = set()
        """Nodes not in Ray now (not yet joined a new head)."""

    def _answer(self) -> None:
        if self.away:
            msg = "Failed to connect to Ray at address: http://head:8265."
            raise RayHeadUnavailableError(msg)

    def forget(self) -> None:
        """A head back without its state: it has heard of no job, and no node has joined
        it yet."""
        self.statuses.clear()
        self.down = set(self.nodes_seen)

    def rejoin(self, *nodes: str) -> None:
        """Nodes that joined the new head, restarted."""
        self.down -= set(nodes)
        self.nodes_seen |= set(nodes)

    async def live_nodes(self) -> frozenset[str] | None:
        return frozenset(self.nodes_seen - self.down)

    async def logs(self, submission_id: str) -> str | None:
        self._answer()
        return self.printed.get(submission_id)

    async def submit(self, plan: SubmissionPlan, working_dir: Path | None) -> None:
        self._answer()
        if plan.submission_id in self.statuses:
            return
        self.submitted.append((plan, working_dir))
        for selected in plan.entrypoint_label_selector.values():
            self.nodes_seen.update(selected.removeprefix("in(").removesuffix(")").split(","))
        self.statuses[plan.submission_id] = RayJobStatus(state=RayJobState.PENDING)

    async def status(self, submission_id: str) -> RayJobStatus | None:
        self._answer()
        return self.statuses.get(submission_id)

    async def worker_nodes(self, submission_id: str) -> tuple[str, ...] | None:
        self.worker_lookups.append(submission_id)
        return self.workers.get(submission_id)

    async def waits_for_room(self, submission_id: str) -> bool | None:
        return submission_id in self.waiting

    async def lost_worker_nodes(self, submission_id: str) -> tuple[str, ...] | None:
        return self.lost_workers.get(submission_id, ())

    async def stop(self, submission_id: str) -> None:
        self._answer()
        self.stopped.append(submission_id)
        if submission_id in self.statuses:
            self.statuses[submission_id] = RayJobStatus(state=RayJobState.STOPPED)

    def set(self, submission_id: str, state: RayJobState, **fields: object) -> None:
        self.statuses[submission_id] = RayJobStatus(state=state, **fields)  # type: ignore[arg-type]
        if isinstance(node := fields.get("node"), str):
            self.nodes_seen.add(node)


class FakeWorkspaces:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def unpack(self, ref: ObjectRef) -> Path:
        return self.root / ref.sha256


class FakeProgress:
    """Progress reports by checkpoint URI, as training code would have written them."""

    def __init__(self) -> None:
        self.reports: dict[str, ProgressReport] = {}
        self.checkpoint_requests: set[tuple[str, int]] = set()
        self.moves_requested: set[tuple[str, int]] = set()
        self.kept: dict[tuple[str, int], str] = {}
        """(checkpoint URI, attempt) -> the end of its output, as its launcher kept it."""

    async def kept_output(self, checkpoint_uri: str, attempt: int) -> str | None:
        return self.kept.get((checkpoint_uri, attempt))

    async def latest(self, checkpoint_uri: str) -> ProgressReport | None:
        return self.reports.get(checkpoint_uri)

    async def request_stop(self, checkpoint_uri: str, request: CheckpointRequest) -> None:
        self.checkpoint_requests.add((checkpoint_uri, request.attempt))

    async def stop_asked(self, checkpoint_uri: str, attempt: int) -> StopAsk:
        if (checkpoint_uri, attempt) in self.moves_requested:
            return StopAsk.MOVE
        if (checkpoint_uri, attempt) in self.checkpoint_requests:
            return StopAsk.STOP
        return StopAsk.NONE


class FixedTeams:
    """The teams file, as a test sets it."""

    def __init__(self, teams: Teams) -> None:
        self.teams = teams

    def current(self) -> Teams:
        return self.teams


class InMemoryTeamHolds:
    """The holds with the bucket's compare-and-set; `conflicts` makes the next writes lose
    to a write another replica made in between (which changes nothing)."""

    def __init__(self) -> None:
        self.holds = TeamHolds()
        self.revision: Revision | None = None
        self.conflicts = 0
        self.reads = 0
        self.status: TeamsStatus | None = None

    async def read(self) -> tuple[TeamHolds, Revision | None]:
        self.reads += 1
        await asyncio.sleep(0)
        return self.holds, self.revision

    async def write(self, holds: TeamHolds, revision: Revision | None) -> Revision:
        if self.conflicts:
            self.conflicts -= 1
            self.revision = (self.revision or 0) + 1
        if revision != self.revision:
            raise StaleRevisionError("holds")
        self.holds, self.revision = holds, (self.revision or 0) + 1
        return self.revision

    async def publish_status(self, status: TeamsStatus) -> None:
        self.status = status


class FixedPools:
    """The scaler's pools bucket as a test sets it: prices, and owners' spend."""

    def __init__(self, status: PoolsStatus | None = None, spend: OwnersSpend | None = None) -> None:
        self.latest_status = status
        self.latest_spend = spend

    async def status(self) -> PoolsStatus | None:
        return self.latest_status

    async def spend(self) -> OwnersSpend | None:
        return self.latest_spend


class FixedSecrets:
    """The platform's secrets, by name, as a test sets them."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    async def value(self, name: str, team: str | None) -> str | None:
        """`team/name` for a team's secret, `name` for a platform without teams."""
        return self.values.get(f"{team}/{name}" if team is not None else name)


def submitter_deps(tmp_path: Path, **fields: Any) -> Deps:
    """The submitter's dependencies on fakes, with `fields` in place of the defaults."""
    defaults: dict[str, Any] = {
        "bus": InMemoryBus(),
        "clock": FixedClock(),
        "store": InMemoryJobStore(),
        "ray": FakeRay(),
        "workspaces": FakeWorkspaces(tmp_path),
        "progress": FakeProgress(),
        "quotas": Quotas(max_gpus_per_job=8, max_gpus_per_owner=16),
        "checkpoint_root": "file:///checkpoints",
    }
    return Deps(**(defaults | fields))


async def place_queued(deps: Deps, node: str = "gpu-spot-1") -> list[str]:
    """The scaler's part, for tests of the submitter alone: every attempt waiting in the
    platform's queue (not for quota) is placed on `node`. Returns the jobs placed."""
    placed = []
    for record, _ in await deps.store.all():
        attempt = record.current
        if (
            not record.is_active
            or record.waiting_for is not None
            or attempt is None
            or attempt.state is not AttemptState.QUEUED
        ):
            continue
        placement = JobPlaced(
            job_id=record.job_id,
            attempt=attempt.number,
            requeued=attempt.requeued,
            nodes=(node,),
            pool=node.rsplit("-", 1)[0],
        )
        key = f"placed-{record.job_id}-{attempt.number}-{attempt.requeued}"
        event = new_event(placement, source="scaler", time=deps.clock.now(), event_id=key)
        await on_job_placed(event, deps)
        placed.append(record.job_id)
    return placed
