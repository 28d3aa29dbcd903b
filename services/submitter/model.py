"""The submitter's value types: what Ray says of an attempt and what to submit to it.

The job record itself is public (clients read the bucket) and lives in `shared.jobs`."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from shared.events.types import Frozen
from shared.jobs import TERMINAL_STATES, Attempt, AttemptState, FailureKind, JobRecord, JobState


class RayJobState(StrEnum):
    """Ray's own job states, as the Job Submission API reports them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class RayJobStatus(Frozen):
    state: RayJobState
    message: str | None = None
    error_type: str | None = None
    exit_code: int | None = None
    node: str | None = None
    """The platform's name of the node its driver runs on, once Ray has placed it."""
    pool: str | None = None


class SubmissionPlan(Frozen):
    """What to hand Ray for one attempt; built by the policy, carried out by the adapter."""

    submission_id: str
    entrypoint: str
    entrypoint_num_cpus: float
    entrypoint_num_gpus: float
    entrypoint_memory_bytes: int
    entrypoint_resources: dict[str, float]
    entrypoint_label_selector: dict[str, str] = Field(default_factory=dict)
    """Ray node labels the driver's node must match: a resumed attempt avoids the nodes
    its job lost, which Ray may still count as alive for a few seconds."""
    env_vars: dict[str, str]
    pip: tuple[str, ...]
    metadata: dict[str, str]


__all__ = [
    "TERMINAL_STATES",
    "Attempt",
    "AttemptState",
    "FailureKind",
    "JobRecord",
    "JobState",
    "RayJobState",
    "RayJobStatus",
    "SubmissionPlan",
]
