"""The scaler's handlers and reconcile loop through fakes of its ports."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from services.scaler.handlers import (
    Deps,
    on_job_move_requested,
    on_job_queued,
    on_job_resized,
    on_job_settled,
    reconcile,
)
from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.policy.decision import PLACED_GRACE_S
from services.scaler.policy.keepalive import MIN_PERIODS, IdleHistory
from shared.events import decode, new_event
from shared.events.data import (
    InterruptionCause,
    JobInterrupted,
    JobMoveRequested,
    JobQueued,
    JobResized,
    JobStarted,
    JobSucceeded,
    MoveReason,
    ResizeReason,
)
from shared.events.types import Bundle, CapacityClass
from shared.messaging.memory import InMemoryBus
from tests.events import NOW
from tests.fakes.clock import FixedClock
from tests.fakes.scaler import (
    FakeCluster,
    FakeObserver,
    InMemoryDemandStore,
    RecordingStatusBoard,
    scaler_deps,
)

SPOT = PoolSpec(
    name="gpu-spot", capacity=CapacityClass.SPOT, gpus=2, cpus=4, price_per_hour_usd=1.0
)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(NOW)


@pytest.fixture
def cluster(clock: FixedClock) -> FakeCluster:
    return FakeCluster(clock)


@pytest.fixture
def deps(clock: FixedClock, cluster: FakeCluster) -> Deps:
    config = ScalerConfig(budget_per_hour_usd=2.5, idle_timeout_s=60, settle_s=0)
    return scaler_deps(clock, cluster, (SPOT,), config)


def queued(job_id: str, gpus: int = 2, workers: int = 1) -> Any:
    data = JobQueued(
        job_id=job_id,
        attempt=1,
        bundles=(Bundle(gpus=gpus),) * workers,
        capacity=CapacityClass.SPOT,
        priority=5,
    )
    return new_event(data, source="submitter", time=NOW)


def published(deps: Deps) -> list[tuple[str, Any]]:
    assert isinstance(deps.bus, InMemoryBus)
    return [(decode(m.data).type, decode(m.data).data) for m in deps.bus.messages]


async def test_a_queued_job_grows_its_pool_by_one_node_and_only_once(
    deps: Deps, cluster: FakeCluster
) -> None:
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    await reconcile(deps)  # the node joined: the job is placed on it, nothing more launched
    await reconcile(deps)  # its room is held for it: placed once
    assert list(cluster.launched) == ["gpu-spot-1"]
    kinds = [kind for kind, _ in published(deps)]
    assert kinds == [
        "spotrain.pool.resize_requested.v1",
        "spotrain.node.launched.v1",
        "spotrain.pool.resized.v1",
        "spotrain.job.placed.v1",
    ], "one node, announced once for billing; the job placed on it once"
    placed = published(deps)[-1][1]
    assert (placed.job_id, placed.attempt, placed.nodes) == ("job-1", 1, ("gpu-spot-1",))
    assert isinstance(deps.status, RecordingStatusBoard)
    assert deps.status.latest is not None
    [spot] = deps.status.latest.pools
    assert (spot.nodes, spot.gpus_total, spot.pending_jobs, spot.pending_gpus) == (1, 2, 1, 2)


async def test_a_replica_that_no_longer_leads_does_not_act_on_its_pass(
    deps: Deps, cluster: FakeCluster
) -> None:
    """A pass decided by a replica whose lease ran out meanwhile (it stalled): no resize,
    no placement, nothing said; once it leads again, the same demand is acted on once."""
    leads = False
    deps.leading = lambda: leads
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    assert cluster.launched == {}
    assert published(deps) == []
    leads = True
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]


async def test_a_deposed_leader_is_fenced_off_at_the_resize_and_the_release(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """By its own clock it leads, but its write of the lease is refused (another took over
    unseen): the pass is decided and said, yet no pool is resized and no node released."""
    fenced = False
    confirmations = 0

    async def confirm() -> bool:
        nonlocal confirmations
        confirmations += 1
        return not fenced

    deps.fenced = confirm
    fenced = True
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    assert cluster.launched == {}
    assert confirmations == 1, "asked just before the resize"
    assert "spotrain.pool.resize_requested.v1" not in [kind for kind, _ in published(deps)]
    fenced = False
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]
    started = JobStarted(job_id="job-1", attempt=1, submission_id="job-1-1")
    await on_job_settled(new_event(started, source="submitter", time=NOW), deps)
    cluster.idle_s["gpu-spot-1"] = 61
    clock.advance(timedelta(minutes=2))
    fenced = True
    await reconcile(deps)
    assert cluster.released == [], "a deposed leader releases nothing"
    fenced = False
    await reconcile(deps)
    assert cluster.released == ["gpu-spot-1"]


async def test_an_idle_node_goes_after_the_timeout_once_its_job_started(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    started = JobStarted(job_id="job-1", attempt=1, submission_id="job-1-1")
    await on_job_settled(new_event(started, source="submitter", time=NOW), deps)
    cluster.idle_s["gpu-spot-1"] = 30
    await reconcile(deps)
    assert cluster.released == []
    cluster.idle_s["gpu-spot-1"] = 61
    clock.advance(timedelta(minutes=2))
    await reconcile(deps)
    assert cluster.released == ["gpu-spot-1"]
    assert isinstance(deps.observer, FakeObserver)
    assert deps.observer.drained == ["gpu-spot-1"], "drained in Ray before its VM goes"


async def test_the_pass_learns_its_pools_idle_timeout(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """The live scaler learns the keep-alive as the replay's does: a node seen idle and
    then busy is an idle period that ended in reuse; a pool whose idle nodes never see work
    come back within the configured timeout lets its next idle node go at once."""
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    started = JobStarted(job_id="job-1", attempt=1, submission_id="job-1-1")
    await on_job_settled(new_event(started, source="submitter", time=NOW), deps)
    cluster.idle_s["gpu-spot-1"] = 10
    await reconcile(deps)
    clock.advance(timedelta(seconds=20))
    cluster.idle_s["gpu-spot-1"] = 0
    await reconcile(deps)
    assert deps.memory.idle["gpu-spot"].periods == (30.0,), "idle 10 s when seen, 20 s more"
    assert cluster.released == []
    never_reused = IdleHistory(periods=(None,) * MIN_PERIODS)
    deps.memory = deps.memory.model_copy(update={"idle": {"gpu-spot": never_reused}})
    clock.advance(timedelta(seconds=2))
    cluster.idle_s["gpu-spot-1"] = 2
    await reconcile(deps)
    assert cluster.released == ["gpu-spot-1"], "idle 2 s of a 60 s timeout, learnt down to 0"


async def test_a_node_placed_on_is_kept_a_minute_though_its_pool_lets_idle_nodes_go_at_once(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """A Ray Train driver starts on the head (its job has started) and only then asks for
    its workers' room: the node its attempt was placed on looks idle to Ray meanwhile, and
    is not let go."""
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    await reconcile(deps)
    assert published(deps)[-1][0] == "spotrain.job.placed.v1"
    started = JobStarted(job_id="job-1", attempt=1, submission_id="job-1-1")
    await on_job_settled(new_event(started, source="submitter", time=NOW), deps)
    never_reused = IdleHistory(periods=(None,) * MIN_PERIODS)
    deps.memory = deps.memory.model_copy(update={"idle": {"gpu-spot": never_reused}})
    placed_at = clock.now()
    for after_s in (2, 30, PLACED_GRACE_S - 2):
        clock.advance(placed_at + timedelta(seconds=after_s) - clock.now())
        cluster.idle_s["gpu-spot-1"] = after_s
        await reconcile(deps)
        assert cluster.released == [], f"released {after_s} s after the placement"
    clock.advance(timedelta(seconds=2))
    cluster.idle_s["gpu-spot-1"] = PLACED_GRACE_S
    await reconcile(deps)
    assert cluster.released == ["gpu-spot-1"]


async def test_a_node_ray_will_not_drain_is_kept(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """Seen idle, but it took work before the release: Ray refuses the idle drain, and the
    node stays, billed and announced as before."""
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    started = JobStarted(job_id="job-1", attempt=1, submission_id="job-1-1")
    await on_job_settled(new_event(started, source="submitter", time=NOW), deps)
    cluster.idle_s["gpu-spot-1"] = 61
    assert isinstance(deps.observer, FakeObserver)
    deps.observer.took_work.add("gpu-spot-1")
    clock.advance(timedelta(minutes=2))
    await reconcile(deps)
    assert cluster.released == []
    assert not [kind for kind, _ in published(deps) if kind.endswith("node.released.v1")]
    deps.observer.took_work.clear()
    await reconcile(deps)
    assert cluster.released == ["gpu-spot-1"]


async def test_demand_over_the_budget_is_held_and_said_once(
    deps: Deps, cluster: FakeCluster
) -> None:
    await on_job_queued(queued("job-big", workers=3), deps)
    await reconcile(deps)
    await reconcile(deps)
    assert cluster.launched == {}
    failures = [data for kind, data in published(deps) if kind.endswith("resize_failed.v1")]
    assert len(failures) == 1
    assert failures[0].message.startswith("job-big: over-budget: 3 more gpu-spot node(s)")


async def test_when_spot_capacity_fails_an_any_job_gets_on_demand_on_the_next_pass(
    deps: Deps, cluster: FakeCluster
) -> None:
    on_demand = SPOT.model_copy(
        update={"name": "gpu-od", "capacity": CapacityClass.ON_DEMAND, "price_per_hour_usd": 2.0}
    )
    deps.pools = (SPOT, on_demand)
    cluster.out_of_capacity.add("gpu-spot")
    anyone = queued("job-any").model_copy(
        update={"data": queued("job-any").data.model_copy(update={"capacity": CapacityClass.ANY})}
    )
    await on_job_queued(anyone, deps)
    await reconcile(deps)
    assert "spotrain.pool.resize_failed.v1" in [kind for kind, _ in published(deps)]
    await reconcile(deps)
    assert [pool.name for pool, _ in cluster.launched.values()] == ["gpu-od"]


async def test_a_busy_provider_is_not_a_stock_out(deps: Deps, cluster: FakeCluster) -> None:
    """Another operation on the pool (GKE's, a rate limit) is "try again", not "no spot":
    the pool is not parked, nothing is learnt of its market, and the next pass grows it."""
    cluster.busy.add("gpu-spot")
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    failed = [data for kind, data in published(deps) if kind.endswith("resize_failed.v1")]
    assert [f.message for f in failed] == ["another operation is running on gpu-spot"]
    assert deps.memory.out_of_capacity_until == {}
    assert deps.memory.knowledge["gpu-spot"].stock_outs == 0
    cluster.busy.clear()
    await reconcile(deps)
    assert [pool.name for pool, _ in cluster.launched.values()] == ["gpu-spot"]


async def test_a_node_that_never_started_is_removed_unbilled_and_parks_its_pool(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """A spot VM whose create the zone cannot serve is a stock-out found after the launch:
    it is deleted, billed nothing (its end is its launch), and `any` jobs go on-demand."""
    on_demand = SPOT.model_copy(
        update={"name": "gpu-od", "capacity": CapacityClass.ON_DEMAND, "price_per_hour_usd": 2.0}
    )
    deps.pools = (SPOT, on_demand)
    anyone = queued("job-any").model_copy(
        update={"data": queued("job-any").data.model_copy(update={"capacity": CapacityClass.ANY})}
    )
    await on_job_queued(anyone, deps)
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]
    launched_at = cluster.launched["gpu-spot-1"][1]
    clock.advance(timedelta(minutes=5))
    cluster.unstarted["gpu-spot-1"] = "ZONE_RESOURCE_POOL_EXHAUSTED in europe-west4-a"
    await reconcile(deps)
    assert "gpu-spot-1" in cluster.released
    released = [data for kind, data in published(deps) if kind.endswith("node.released.v1")]
    assert [(r.node, r.reason.value, r.released_at) for r in released] == [
        ("gpu-spot-1", "never-started", launched_at)
    ]
    assert deps.memory.knowledge["gpu-spot"].stock_outs == 1
    assert [pool.name for pool, _ in cluster.launched.values()] == ["gpu-od"]


async def test_an_unstarted_node_whose_removal_fails_stays_billed_and_listed(
    deps: Deps, cluster: FakeCluster
) -> None:
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    cluster.unstarted["gpu-spot-1"] = "QUOTA_EXCEEDED"
    cluster.release_fails.add("gpu-spot-1")
    await reconcile(deps)
    assert not [kind for kind, _ in published(deps) if kind.endswith("node.released.v1")]
    assert "gpu-spot-1" in deps.billed_nodes


async def test_room_wanted_for_a_move_grows_spot_and_is_withdrawn_when_the_attempt_ends(
    deps: Deps, cluster: FakeCluster
) -> None:
    """Make before break: the checkpointer asks for spot room before it stops a running
    attempt; the scaler grows spot for it as for queued demand, apart from the job's own."""
    wanted = JobMoveRequested(
        job_id="job-1",
        attempt=1,
        capacity=CapacityClass.SPOT,
        bundles=(Bundle(gpus=2),),
        reason=MoveReason.SPOT_RETURNED,
    )
    await on_job_move_requested(new_event(wanted, source="checkpointer", time=NOW), deps)
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]
    assert isinstance(deps.demand, InMemoryDemandStore)
    assert [(d.job_id, d.attempt) for d in deps.demand.demands.values()] == [("job-1.move", 2)]
    interrupted = JobInterrupted(
        job_id="job-1", attempt=1, node="gpu-od-1", cause=InterruptionCause.MOVED
    )
    await on_job_settled(new_event(interrupted, source="submitter", time=NOW), deps)
    assert deps.demand.demands == {}


def resized(workers: int, previous: int | None = None, **fields: Any) -> Any:
    data = JobResized(
        job_id="job-e",
        attempt=1,
        workers=workers,
        previous=previous,
        min_workers=fields.pop("min_workers", 2),
        max_workers=fields.pop("max_workers", 4),
        reason=ResizeReason.SHRANK if previous else ResizeReason.COUNTED,
        worker=Bundle(gpus=1),
        capacity=fields.pop("capacity", CapacityClass.SPOT),
        **fields,
    )
    return new_event(data, source="submitter", time=NOW)


async def test_a_shrunk_elastic_job_gets_spot_room_worker_by_worker_until_it_ends(
    deps: Deps, cluster: FakeCluster
) -> None:
    """Issue 18: a running 2..4 job on 2 workers misses 2, each a demand of its own at the
    lowest priority; one node of 2 GPUs holds both; back to 4, the room is withdrawn."""
    assert isinstance(deps.demand, InMemoryDemandStore)
    await on_job_resized(resized(2), deps)
    assert sorted((d.job_id, d.priority) for d in deps.demand.demands.values()) == [
        ("job-e.grow-0", 0),
        ("job-e.grow-1", 0),
    ]
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]
    await on_job_resized(resized(3, previous=2), deps)
    assert [d.job_id for d in deps.demand.demands.values()] == ["job-e.grow-0"]
    await on_job_resized(resized(2, previous=3), deps)
    assert len(deps.demand.demands) == 2
    succeeded = JobSucceeded(job_id="job-e", attempt=1)
    await on_job_settled(new_event(succeeded, source="submitter", time=NOW), deps)
    assert deps.demand.demands == {}


async def test_growth_the_nodes_have_room_for_is_done_with_and_buys_no_node(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """Once a node with room for the missing workers is up, Ray Train takes it when it next
    resizes; the demand goes, so that the room its workers take meanwhile buys no other."""
    assert isinstance(deps.demand, InMemoryDemandStore)
    await on_job_resized(resized(2), deps)
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]
    assert len(deps.demand.demands) == 2, "a node bought for it is not yet room it has"
    clock.advance(timedelta(seconds=30))  # booted, and past the pool's settle time
    await reconcile(deps)
    assert deps.demand.demands == {}
    clock.advance(timedelta(seconds=30))
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]


def started_event(job_id: str) -> Any:
    started = JobStarted(job_id=job_id, attempt=1, submission_id=f"{job_id}-1")
    return new_event(started, source="submitter", time=NOW)


async def test_a_gang_started_before_any_pass_keeps_its_demand_until_a_node_has_room(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """A multi-node driver asks for nothing and starts on the head at once, maybe before
    any pass saw its demand: dropped then, nothing would ever buy its workers' nodes."""
    assert isinstance(deps.demand, InMemoryDemandStore)
    await on_job_queued(queued("job-g", gpus=1, workers=2), deps)
    await on_job_settled(started_event("job-g"), deps)
    assert deps.demand.demands["job-g"].started
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]
    assert "job-g" in deps.demand.demands, "a node bought for it may yet fail to come"
    clock.advance(timedelta(seconds=30))
    await reconcile(deps)
    assert deps.demand.demands == {}, "the node has its room: Ray Train takes it"
    clock.advance(timedelta(seconds=30))
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]


async def test_a_gang_the_last_pass_found_room_for_drops_its_demand_at_start(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    assert isinstance(deps.demand, InMemoryDemandStore)
    await on_job_queued(queued("job-g", gpus=1, workers=2), deps)
    await reconcile(deps)
    clock.advance(timedelta(seconds=30))
    await reconcile(deps)
    assert "job-g" in deps.demand.demands, "queued: it stays until it starts"
    await on_job_settled(started_event("job-g"), deps)
    assert deps.demand.demands == {}
    await reconcile(deps)
    assert list(cluster.launched) == ["gpu-spot-1"]


async def test_a_single_node_attempt_drops_its_demand_at_start_before_any_pass(
    deps: Deps, cluster: FakeCluster
) -> None:
    assert isinstance(deps.demand, InMemoryDemandStore)
    await on_job_queued(queued("job-1"), deps)
    await on_job_settled(started_event("job-1"), deps)
    assert deps.demand.demands == {}
    await reconcile(deps)
    assert list(cluster.launched) == []


async def test_a_placed_attempt_keeps_its_room_and_the_next_job_gets_a_node_of_its_own(
    deps: Deps, cluster: FakeCluster
) -> None:
    """Ray has not started the first job yet (its node still looks empty): its room is
    held, so the second is neither placed there nor left without a node."""
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    await reconcile(deps)
    await on_job_queued(queued("job-2"), deps)
    await reconcile(deps)
    await reconcile(deps)
    placements = {data.job_id: data.nodes for kind, data in published(deps) if "placed" in kind}
    assert placements == {"job-1": ("gpu-spot-1",), "job-2": ("gpu-spot-2",)}


async def test_an_attempt_is_never_placed_on_a_node_it_must_avoid(
    deps: Deps, cluster: FakeCluster
) -> None:
    """The node its job lost is still in Ray's view, with room: the attempt gets another
    node rather than waiting beside room it cannot use (issue 30's deadlock)."""
    await on_job_queued(queued("job-0"), deps)
    await reconcile(deps)
    cluster.idle_s["gpu-spot-1"] = 0
    data = JobQueued(
        job_id="job-1",
        attempt=2,
        bundles=(Bundle(gpus=2),),
        capacity=CapacityClass.SPOT,
        priority=5,
        avoid_nodes=("gpu-spot-1",),
    )
    await on_job_settled(
        new_event(JobStarted(job_id="job-0", attempt=1, submission_id="x"), source="s", time=NOW),
        deps,
    )
    await on_job_queued(new_event(data, source="submitter", time=NOW), deps)
    await reconcile(deps)
    await reconcile(deps)
    placements = [data for kind, data in published(deps) if "placed" in kind]
    # gpu-spot-1 is empty in Ray's view (the fake's nodes are): only the rule keeps it off.
    assert [(p.job_id, p.nodes) for p in placements] == [("job-1", ("gpu-spot-2",))]


async def test_an_attempt_placed_on_a_node_that_went_is_placed_again(
    deps: Deps, cluster: FakeCluster
) -> None:
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    await reconcile(deps)
    await on_job_queued(queued("job-2"), deps)
    await reconcile(deps)
    await reconcile(deps)
    del cluster.launched["gpu-spot-1"]  # preempted before Ray started job-1 there
    await reconcile(deps)
    await reconcile(deps)
    placements = [(d.job_id, d.nodes) for kind, d in published(deps) if "placed" in kind]
    assert placements[-1] == ("job-1", ("gpu-spot-3",))


async def test_with_the_head_away_nothing_is_released_placed_or_grown(
    deps: Deps, cluster: FakeCluster, clock: FixedClock
) -> None:
    """A node Ray's head cannot vouch for is not idle, and a queued job is not placed on a
    cluster that cannot run it: the status says since when the head is away."""
    await on_job_queued(queued("job-1"), deps)
    await reconcile(deps)
    started = JobStarted(job_id="job-1", attempt=1, submission_id="job-1-1")
    await on_job_settled(new_event(started, source="submitter", time=NOW), deps)
    cluster.idle_s["gpu-spot-1"] = 61
    assert isinstance(deps.observer, FakeObserver)
    deps.observer.away = True
    clock.advance(timedelta(minutes=2))
    before = list(published(deps))
    await on_job_queued(queued("job-2"), deps)
    await reconcile(deps)
    await reconcile(deps)
    assert cluster.released == []
    assert list(cluster.launched) == ["gpu-spot-1"]
    assert published(deps) == before
    assert isinstance(deps.status, RecordingStatusBoard)
    assert deps.status.latest is not None
    assert deps.status.latest.ray_head_away_since == clock.now()
    deps.observer.away = False
    await reconcile(deps)
    assert deps.status.latest.ray_head_away_since is None
    placed = published(deps)[-1][1]
    assert (placed.job_id, placed.nodes) == ("job-2", ("gpu-spot-1",)), "placed once it is back"
