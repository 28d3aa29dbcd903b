"""The checkpointer's value types: what it knows of a checkpoint, and what it decides."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from shared.events.data import JobFailed, JobResumed
from shared.events.types import Frozen
from shared.jobs import Attempt, AttemptState, JobRecord, JobState

__all__ = [
    "Attempt",
    "AttemptState",
    "GiveUp",
    "JobRecord",
    "JobState",
    "LatestCheckpoint",
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


@dataclass(frozen=True)
class LatestCheckpoint:
    uri: str
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
