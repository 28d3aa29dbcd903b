"""What the platform learns of each pool: the pure record (`shared.policy.pool_knowledge`) and
the scaler that keeps it across restarts and weighs pools by it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from services.scaler.adapters.node_history import BusNodeHistory
from services.scaler.handlers import Deps, on_job_queued, reconcile
from services.scaler.model import PoolSpec, ScalerConfig
from shared.events import Event, new_event
from shared.events.data import JobQueued
from shared.events.types import Bundle, CapacityClass
from shared.messaging.memory import InMemoryBus
from shared.policy.pool_knowledge import WINDOWS_KEPT, PoolRecord, observe
from tests.events import NOW
from tests.fakes.clock import FixedClock
from tests.fakes.scaler import (
    FakeCluster,
    FakeObserver,
    InMemoryDemandStore,
    RecordingStatusBoard,
)


def test_a_window_opens_when_a_node_is_held_and_closes_at_a_loss_or_a_stock_out() -> None:
    record = observe(None, "gpu-spot", now=NOW, nodes=0)
    assert record.available_since is None
    record = observe(record, "gpu-spot", now=NOW + timedelta(minutes=10), nodes=1)
    assert record.available_since == NOW + timedelta(minutes=10)
    record = observe(record, "gpu-spot", now=NOW + timedelta(minutes=70), nodes=1, taken_back=1)
    assert record.windows_h == (1.0,)
    assert record.taken_back == 1
    # Still holding another node: a new window opens at once.
    assert record.available_since == NOW + timedelta(minutes=70)
    record = observe(
        record, "gpu-spot", now=NOW + timedelta(minutes=100), nodes=0, stocked_out=True
    )
    assert record.windows_h == (1.0, 0.5)
    assert (record.stock_outs, record.available_since) == (1, None)
    # Each pass counts the nodes it sees over the time since the one before.
    assert record.node_hours == pytest.approx(1 / 6 + 1)


def test_time_nobody_watched_is_not_counted_as_held() -> None:
    record = observe(None, "gpu-spot", now=NOW, nodes=2)
    record = observe(record, "gpu-spot", now=NOW + timedelta(hours=5), nodes=2, max_gap_s=6)
    assert record.node_hours == pytest.approx(2 * 6 / 3600)
    assert record.watched_h == 5


def test_only_the_latest_windows_are_kept() -> None:
    record = PoolRecord(
        pool="p", watched_since=NOW, seen_until=NOW, available_since=NOW,
        windows_h=(0.1,) * WINDOWS_KEPT,
    )  # fmt: skip
    record = observe(record, "p", now=NOW + timedelta(hours=2), nodes=0, taken_back=1)
    assert len(record.windows_h) == WINDOWS_KEPT
    assert record.windows_h[-1] == 2
    assert record.windows_closed == WINDOWS_KEPT + 1, "every window counted, not only the kept"
    assert record.outlook(0.1, NOW + timedelta(hours=2)).windows_per_h == pytest.approx(
        (WINDOWS_KEPT + 2) / (2 + 2)
    )


def test_a_windows_age_is_known_only_while_a_node_is_held() -> None:
    held = PoolRecord(
        pool="p", watched_since=NOW, seen_until=NOW, available_since=NOW - timedelta(hours=1)
    )
    assert held.outlook(0.1, NOW).window_age_h == pytest.approx(1.0)
    assert held.model_copy(update={"available_since": None}).outlook(0.1, NOW).window_age_h is None


def test_the_outlook_follows_the_windows_seen_once_the_pool_has_been_watched_long() -> None:
    short = PoolRecord(
        pool="p", watched_since=NOW, seen_until=NOW + timedelta(days=3),
        windows_h=(0.25,) * 40,
    )  # fmt: skip
    assert short.outlook(0.05, NOW + timedelta(days=3)).mean_window_h < 0.3
    fresh = PoolRecord(pool="p", watched_since=NOW, seen_until=NOW)
    assert fresh.outlook(0.05, NOW).mean_window_h == 2.0, "the prior, until something is seen"


ZONE_A = PoolSpec(
    name="spot-a", capacity=CapacityClass.SPOT, gpus=2, cpus=4, price_per_hour_usd=1.0,
    boot_time_s=600, zone="a",
)  # fmt: skip
ZONE_B = ZONE_A.model_copy(update={"name": "spot-b", "zone": "b"})


def scaler(cluster: FakeCluster, board: RecordingStatusBoard, clock: FixedClock) -> Deps:
    bus = InMemoryBus()
    return Deps(
        bus=bus,
        clock=clock,
        pools=(ZONE_A, ZONE_B),
        config=ScalerConfig(budget_per_hour_usd=10, idle_timeout_s=10**6, settle_s=0),
        provider=cluster,
        observer=FakeObserver(cluster),
        demand=InMemoryDemandStore(),
        status=board,
        history=BusNodeHistory(bus),
    )


def queued(job_id: str) -> Event[JobQueued]:
    data = JobQueued(
        job_id=job_id,
        attempt=1,
        bundles=(Bundle(gpus=2),),
        capacity=CapacityClass.SPOT,
        priority=5,
    )
    return new_event(data, source="submitter", time=NOW)


async def test_the_scaler_learns_losses_keeps_them_across_a_restart_and_grows_the_safer_zone() -> (
    None
):
    clock = FixedClock(NOW)
    cluster = FakeCluster(clock)
    board = RecordingStatusBoard()
    first = scaler(cluster, board, clock)
    # Spot-a is the first of two equal pools: its node is taken back twice.
    for _ in range(2):
        [node] = await cluster.launch(ZONE_A, 1)
        await reconcile(first)
        clock.advance(timedelta(seconds=2))
        cluster.stop(node)
        await reconcile(first)
    assert board.latest_knowledge is not None
    assert board.latest_knowledge.pools["spot-a"].taken_back == 2
    assert board.latest_knowledge.pools["spot-b"].taken_back == 0
    await reconcile(first)  # the status shows what the passes before it learnt
    status = board.latest
    assert status is not None
    assert {p.pool: p.taken_back for p in status.pools} == {"spot-a": 2, "spot-b": 0}
    # A new scaler: what the first learnt is still known, and spot-b grows for a new job.
    second = scaler(cluster, board, clock)
    await on_job_queued(queued("job-1"), second)
    await reconcile(second)
    assert second.memory.knowledge["spot-a"].taken_back == 2
    assert [pool.name for pool, _ in cluster.launched.values()] == ["spot-b"]
