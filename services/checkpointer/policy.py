"""The checkpointer's decisions, pure: which attempts a notice or a loss concerns, and how
a lost attempt carries on (from which checkpoint, on which capacity, or not at all)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from services.checkpointer.model import (
    Attempt,
    AttemptState,
    GiveUp,
    JobRecord,
    LatestCheckpoint,
    Recovery,
    RecoveryConfig,
    Resume,
    Skip,
)
from shared.events.data import JobFailed, JobResumed
from shared.events.types import CapacityClass

_ENDED_ON_ITS_OWN = (AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.STOPPED)


def attempts_on(records: Iterable[JobRecord], node: str) -> list[tuple[JobRecord, Attempt]]:
    """The current attempts of active jobs that run (or ran, until lost) on `node`."""
    return [
        (record, attempt)
        for record in records
        if record.is_active
        and (attempt := record.current) is not None
        and node in attempt.nodes
        and attempt.state not in _ENDED_ON_ITS_OWN
    ]


def checkpoint_now(
    records: Iterable[JobRecord],
    node: str,
    deadline: datetime,
    now: datetime,
    config: RecoveryConfig,
) -> list[tuple[JobRecord, Attempt]]:
    """The attempts to ask for a checkpoint before `deadline`: the live ones on the node,
    when the notice leaves time to write one."""
    if (deadline - now).total_seconds() < config.min_notice_s:
        return []
    return [
        (record, attempt)
        for record, attempt in attempts_on(records, node)
        if attempt.state in (AttemptState.SUBMITTED, AttemptState.RUNNING)
    ]


def recover(
    record: JobRecord,
    lost_attempt: int,
    checkpoint: LatestCheckpoint | None,
    config: RecoveryConfig,
) -> Recovery:
    """How the job carries on after `lost_attempt` lost its capacity.

    At most once per loss: only the job's current attempt is resumed, and the next attempt
    number is the event's identity. An attempt that ended by itself (its own error, success,
    a cancellation) is never resumed as if it were a preemption.
    """
    attempt = record.current
    if not record.is_active:
        return Skip(f"the job is {record.state.value}")
    if record.cancel_requested:
        return Skip("the job is being cancelled")
    if attempt is None or attempt.number != lost_attempt:
        return Skip(f"attempt {lost_attempt} is no longer the current one")
    if attempt.state in _ENDED_ON_ITS_OWN:
        return Skip(f"attempt {lost_attempt} {attempt.state.value} on its own")
    losses = record.interruptions + (0 if attempt.state is AttemptState.LOST else 1)
    budget = record.request.max_restarts
    if losses > budget:
        message = (
            f"the job lost its capacity {losses} times; its restart budget is {budget} "
            f"(raise max_restarts, or ask for on-demand capacity)"
        )
        return GiveUp(JobFailed(job_id=record.job_id, attempt=lost_attempt, message=message))
    from_step = checkpoint.step if checkpoint is not None else 0
    reached = attempt.step if attempt.step is not None else from_step
    return Resume(
        JobResumed(
            job_id=record.job_id,
            attempt=lost_attempt + 1,
            from_checkpoint=checkpoint.uri if checkpoint is not None else None,
            from_step=from_step,
            steps_lost=max(0, reached - from_step),
            capacity=next_capacity(record, attempt, losses, config),
        )
    )


def next_capacity(
    record: JobRecord, attempt: Attempt, losses: int, config: RecoveryConfig
) -> CapacityClass:
    """Spot and on-demand requests keep what they asked for; an `any` job moves to
    on-demand after repeated losses, and stays there."""
    current = record.capacity_of(attempt)
    if record.request.capacity is not CapacityClass.ANY or current is CapacityClass.ON_DEMAND:
        return current
    if losses >= config.fallback_after_interruptions:
        return CapacityClass.ON_DEMAND
    return current
