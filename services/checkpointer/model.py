"""The checkpointer's value types: what it knows of a checkpoint, and what it decides."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from shared.events.data import JobFailed, JobResumed, MoveReason
from shared.events.types import CapacityClass, Frozen
from shared.jobs import Attempt, AttemptState, JobRecord, JobState

__all__ = [
    "Attempt",
    "AttemptState",
    "GiveUp",
    "JobRecord",
    "JobState",
    "LatestCheckpoint",
    "Move",
    "MoveConfig",
    "Recovery",
    "RecoveryConfig",
    "Resume",
    "Skip",
]


class RecoveryConfig(Frozen):
    fallback_after_interruptions: int = Field(2, ge=1)
    """An `any` job that lost its capacity this many times moves to on-demand capacity."""
    min_notice_s: float = Field(2.0, ge=0)
    """A notice shorter than this leaves no time to checkpoint: the loss is waited for."""


class MoveConfig(Frozen):
    review_interval_s: float = Field(5.0, gt=0)
    """How often running deadline jobs are reviewed: the deadline policy's decision interval."""
    checkpoint_wait_s: float = Field(30.0, ge=0)
    """How long a move waits for the checkpoint it asked for before it moves anyway (from
    the latest checkpoint there is)."""
    restart_overhead_s: float = Field(60.0, ge=0)
    """What a restart costs in time without progress, until the job's own resumes say."""


@dataclass(frozen=True)
class Move:
    """Stop the job's running attempt and go on from its checkpoint on `capacity`."""

    job_id: str
    attempt: int
    capacity: CapacityClass
    reason: MoveReason
    slack_s: float
    """What the deadline policy left to spare when it decided."""
    room: bool = True
    """Whether there is room on `capacity` now. Without, the move waits: the room is asked
    for (`job.move_requested`) and the attempt keeps running meanwhile."""


@dataclass(frozen=True)
class LatestCheckpoint:
    uri: str | None
    """The helper's checkpoint, handed to the next attempt (SPOTRAIN_RESUME_FROM); None
    for a Ray Train run's own, which the next attempt's driver restores by itself."""
    step: int


@dataclass(frozen=True)
class Resume:
    resumed: JobResumed


@dataclass(frozen=True)
class GiveUp:
    failed: JobFailed


@dataclass(frozen=True)
class Skip:
    why: str


Recovery = Resume | GiveUp | Skip
