"""The checkpointer's decisions, pure: which attempts a notice or a loss concerns, how
a lost attempt carries on (from which checkpoint, on which capacity, or not at all), and
when a running deadline job moves between spot and on-demand (`shared.policy.deadline`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from statistics import median

from services.checkpointer.model import (
    Attempt,
    AttemptState,
    GiveUp,
    JobRecord,
    LatestCheckpoint,
    Move,
    MoveConfig,
    Recovery,
    RecoveryConfig,
    Resume,
    Skip,
)
from shared.events.data import JobFailed, JobResumed, MoveReason
from shared.events.types import CapacityClass
from shared.jobs import bundles_of, work_left_s
from shared.policy import deadline
from shared.policy.deadline import Run, WindowTally
from shared.pools import PoolsStatus

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
    *,
    platform_stop: bool = False,
) -> Recovery:
    """How the job carries on after `lost_attempt` lost its capacity.

    At most once per loss: only the job's current attempt is resumed, and the next attempt
    number is the event's identity. An attempt that ended by itself (its own error, success,
    a cancellation) is never resumed as if it were a preemption. `platform_stop`: the
    platform stopped it on purpose for other work (`shared.jobs.PLATFORM_STOPS`), which
    spends no restart budget and moves it to no other capacity, whatever the record
    (written after the event) says yet.
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
    losses = record.interruptions + (
        0 if attempt.state is AttemptState.LOST or platform_stop else 1
    )
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
    """Spot and on-demand requests keep what they asked for; an `any` job with a deadline
    goes on as `any`, placed by the deadline policy (also after a move pinned it to spot);
    any other `any` job moves to on-demand after repeated losses, and stays there."""
    if record.request.capacity is CapacityClass.ANY and record.request.deadline is not None:
        return CapacityClass.ANY
    current = record.capacity_of(attempt)
    if record.request.capacity is not CapacityClass.ANY or current is CapacityClass.ON_DEMAND:
        return current
    if losses >= config.fallback_after_interruptions:
        return CapacityClass.ON_DEMAND
    return current


def move(record: JobRecord, pools: PoolsStatus, now: datetime, config: MoveConfig) -> Move | None:
    """Whether a running deadline job should leave on-demand for spot now, by the deadline
    policy: when spot can be had and its windows pay for the restarts (once there is room
    on spot: `Move.room`). Only jobs that asked for `any` move: spot or on-demand were
    asked for on purpose.

    The policy's other way off on-demand, stopping to wait for spot once far enough ahead,
    is not taken live: it saves at most the margin of one restart over the reserve, and
    the job would be back on on-demand, a restart later, as soon as that margin is spent
    (seen on the local market); moving straight to spot once there is room does better.

    A job on spot never moves to on-demand while it runs: its slack does not shrink while
    it progresses, and once its pace says even on-demand would be late, a restart would
    only end it later. It goes to on-demand when it loses spot, placed by the same policy."""
    attempt = record.current
    request = record.request
    if (
        request.deadline is None
        or request.capacity is not CapacityClass.ANY
        or record.cancel_requested
        or not record.is_active
        or attempt is None
        or attempt.state is not AttemptState.RUNNING
        or attempt.pool is None
    ):
        return None
    held = next((pool for pool in pools.pools if pool.pool == attempt.pool), None)
    work_left = work_left_s(record, now)
    if held is None or held.capacity is not CapacityClass.ON_DEMAND or work_left is None:
        return None
    # Spot pools of the shape it runs on: never weighed against a smaller pool's price.
    spot = [
        p
        for p in pools.pools
        if p.capacity is CapacityClass.SPOT
        and (p.gpus_per_node is None or p.gpus_per_node >= (held.gpus_per_node or 0))
    ]
    if not spot:
        return None
    cheapest = min(spot, key=lambda p: p.price_per_hour_usd)
    restart_h = restart_overhead_s(record, config) / 3600
    decision = deadline.decide(
        deadline.DeadlineState(
            hours_left=(request.deadline - now).total_seconds() / 3600,
            work_left_h=work_left / 3600,
            running=Run.ON_DEMAND,
            restart_overhead_h=restart_h,
            decision_interval_h=config.review_interval_s / 3600,
            spot_available=any(p.can_grow or p.gpus_free for p in spot),
            spot_price_ratio=min(
                1.0, max(cheapest.price_per_hour_usd / max(held.price_per_hour_usd, 1e-9), 1e-6)
            ),
            # What the scaler has seen of the pool; the prior until it says.
            outlook=cheapest.outlook or deadline.outlook(WindowTally(), 0.0, restart_h),
        )
    )
    if decision.run is not Run.SPOT:
        return None
    per_node = max(bundle.gpus for bundle in bundles_of(request))
    return Move(
        record.job_id,
        attempt.number,
        CapacityClass.SPOT,
        MoveReason.SPOT_RETURNED,
        slack_s=decision.slack_h * 3600,
        room=any(p.gpus_free >= per_node and (p.gpus_per_node or 0) >= per_node for p in spot),
    )


def restart_overhead_s(record: JobRecord, config: MoveConfig) -> float:
    """What a restart of this job costs, as measured on its own resumed attempts (from
    their submission to their start: placement, boot, resume); the configured guess until
    it has been resumed."""
    measured = [
        (a.started_at - a.submitted_at).total_seconds()
        for a in record.attempts[1:]
        if a.started_at is not None
    ]
    return median(measured) if measured else config.restart_overhead_s


def moved(record: JobRecord, move: Move, checkpoint: LatestCheckpoint | None) -> Recovery:
    """How the job goes on once its attempt stopped for `move` (or will not stop by itself):
    the next attempt, from the latest checkpoint, on the move's capacity. Unlike a loss, it
    spends nothing of the restart budget."""
    attempt = record.current
    if not record.is_active:
        return Skip(f"the job is {record.state.value}")
    if record.cancel_requested:
        return Skip("the job is being cancelled")
    if attempt is None or attempt.number != move.attempt:
        return Skip(f"attempt {move.attempt} is no longer the current one")
    if attempt.state in _ENDED_ON_ITS_OWN:
        return Skip(f"attempt {move.attempt} {attempt.state.value} on its own")
    from_step = checkpoint.step if checkpoint is not None else 0
    reached = attempt.step if attempt.step is not None else from_step
    return Resume(
        JobResumed(
            job_id=record.job_id,
            attempt=move.attempt + 1,
            from_checkpoint=checkpoint.uri if checkpoint is not None else None,
            from_step=from_step,
            steps_lost=max(0, reached - from_step),
            capacity=move.capacity,
            moved=move.reason,
        )
    )
