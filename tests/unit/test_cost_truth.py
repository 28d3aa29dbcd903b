"""The ledger against what the provider recorded, for any story of launches, releases,
losses, scaler restarts and stack stops: the real scaler handlers on an in-memory bus,
the cost ledger as `spotrain cost` computes it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.scaler.adapters.node_history import BusNodeHistory
from services.scaler.handlers import Deps, reconcile
from services.scaler.model import ScalerConfig
from shared.events import decode, new_event
from shared.events.data import (
    NodeEndSource,
    NodeLaunched,
    NodeLost,
    NodeReleased,
    NoticeSource,
    ReleaseReason,
)
from shared.messaging.memory import InMemoryBus
from shared.policy.cost import ledger
from shared.policy.cost.attribution import exact, seconds
from tests.events import NOW
from tests.fakes.clock import FixedClock
from tests.fakes.scaler import FakeCluster, FakeObserver, InMemoryDemandStore, RecordingStatusBoard
from tests.unit.test_cost_scaler_events import ON_DEMAND, SPOT


@dataclass(frozen=True)
class Launch:
    count: int


@dataclass(frozen=True)
class LaunchUnannounced:
    """The scaler launches, and dies before it announces the launch."""

    count: int


@dataclass(frozen=True)
class Stop:
    """A node stops unasked (preempted, deleted by hand); `recorded`: the provider kept when."""

    index: int
    recorded: bool
    stamp_back_s: int = 0
    """Unrecorded, the provider may still have a stamp of it alive this long before."""


@dataclass(frozen=True)
class Lost:
    """A node stops unasked, its end recorded, and the watcher publishes its loss."""

    index: int


@dataclass(frozen=True)
class Release:
    index: int


@dataclass(frozen=True)
class Wait:
    seconds: int


@dataclass(frozen=True)
class Pass:
    pass


@dataclass(frozen=True)
class KillScaler:
    pass


@dataclass(frozen=True)
class StartScaler:
    pass


@dataclass(frozen=True)
class StopStack:
    """Every node and the scaler stop at once; `recorded` as for `Stop`."""

    recorded: bool


Step = (
    Launch
    | LaunchUnannounced
    | Stop
    | Lost
    | Release
    | Wait
    | Pass
    | KillScaler
    | StartScaler
    | StopStack
)

steps = st.lists(
    st.one_of(
        st.builds(Launch, st.integers(1, 2)),
        st.builds(LaunchUnannounced, st.integers(1, 2)),
        st.builds(Stop, st.integers(0, 20), st.booleans(), st.integers(0, 600)),
        st.builds(Release, st.integers(0, 20)),
        st.builds(Lost, st.integers(0, 20)),
        st.builds(Wait, st.one_of(st.integers(1, 10), st.integers(1, 900))),
        st.just(Pass()),
        st.just(KillScaler()),
        st.just(StartScaler()),
        st.builds(StopStack, st.booleans()),
    ),
    max_size=30,
)


@dataclass
class World:
    """The provider, the bus and the scaler's bucket outlive the scaler; its memory does not."""

    clock: FixedClock = field(default_factory=lambda: FixedClock(NOW))
    bus: InMemoryBus = field(default_factory=InMemoryBus)
    board: RecordingStatusBoard = field(default_factory=RecordingStatusBoard)
    demand: InMemoryDemandStore = field(default_factory=InMemoryDemandStore)
    cluster: FakeCluster = field(init=False)
    scaler: Deps | None = None
    last_listed: dict[str, datetime] = field(default_factory=dict)
    """When a scaler pass last listed each node: where an unrecorded end is billed to."""
    truth_end: dict[str, datetime] = field(default_factory=dict)
    launched_at: dict[str, datetime] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cluster = FakeCluster(self.clock)

    def start_scaler(self) -> None:
        self.scaler = Deps(
            bus=self.bus,
            clock=self.clock,
            pools=(SPOT, ON_DEMAND),
            # No demand, and nodes never idle long enough: only the story moves nodes.
            config=ScalerConfig(budget_per_hour_usd=100, idle_timeout_s=10**6, settle_s=0),
            provider=self.cluster,
            observer=FakeObserver(self.cluster),
            demand=self.demand,
            status=self.board,
            history=BusNodeHistory(self.bus),
        )

    async def a_pass(self) -> None:
        if self.scaler is None:
            return
        for name in self.cluster.launched:
            self.last_listed[name] = self.clock.now()
        await reconcile(self.scaler)

    def running(self) -> list[str]:
        return sorted(self.cluster.launched)

    def stop(self, name: str, *, recorded: bool, stamp_back_s: int = 0) -> None:
        now = self.clock.now()
        self.truth_end[name] = now
        stamp = max(now - timedelta(seconds=stamp_back_s), self.launched_at[name])
        self.cluster.stop(name, recorded=recorded, stamped=stamp if stamp_back_s else None)

    def events(self) -> list[Any]:
        return [decode(m.data) for m in self.bus.messages]

    def billed_seconds(self, now: datetime) -> dict[str, Fraction]:
        """What `spotrain cost` bills each node: its open nodes up to their last sighting."""
        board = self.board.latest_sightings
        seen = dict(board.seen) if board is not None else None
        bills = ledger(self.events(), now=now, seen=seen).attribution.bills
        return {bill.node: bill.node_seconds for bill in bills}

    def expected_seconds(self, now: datetime) -> dict[str, Fraction]:
        """The provider's record: launch to recorded end; with no record of the end, to
        the last time a scaler pass listed the node (or its launch); still up: to `now`."""
        expected = {}
        for name, launched_at in self.launched_at.items():
            record = self.cluster.ends.get(name)
            if record is not None and record.source is NodeEndSource.RECORDED:
                end = record.at
            elif name in self.truth_end:
                # The latest sighting: the scaler's last listing or the provider's stamp.
                seen = [launched_at, self.last_listed.get(name, launched_at)]
                end = max(seen + ([record.at] if record is not None else []))
            else:
                end = now
            expected[name] = seconds(end - launched_at)
        return expected


async def play(story: list[Step]) -> World:  # noqa: PLR0912  # one branch per step
    world = World()
    world.start_scaler()
    for step in story:
        match step:
            case Launch(count) if world.scaler is not None:
                # The scaler is the only one that launches, and announces at once.
                for name in await world.cluster.launch(SPOT, count):
                    world.launched_at[name] = world.clock.now()
                await world.a_pass()
            case LaunchUnannounced(count) if world.scaler is not None:
                for name in await world.cluster.launch(SPOT, count):
                    world.launched_at[name] = world.clock.now()
                world.scaler = None
            case Stop(index, recorded, back_s) if world.running():
                running = world.running()
                world.stop(running[index % len(running)], recorded=recorded, stamp_back_s=back_s)
            case Lost(index) if world.running():
                running = world.running()
                name = running[index % len(running)]
                world.stop(name, recorded=True)
                lost = NodeLost(
                    node=name, pool=SPOT.name, source=NoticeSource.LOCAL, lost_at=world.clock.now()
                )
                await world.bus.publish(new_event(lost, source="watcher", time=world.clock.now()))
            case Release(index) if world.running():
                running = world.running()
                name = running[index % len(running)]
                world.truth_end[name] = world.clock.now()
                await world.cluster.release(name)
            case Wait(s):
                world.clock.advance(timedelta(seconds=s))
            case Pass():
                await world.a_pass()
            case KillScaler():
                world.scaler = None
            case StartScaler() if world.scaler is None:
                world.start_scaler()
                await world.a_pass()
            case StopStack(recorded):
                world.scaler = None
                for name in world.running():
                    world.stop(name, recorded=recorded)
                stopped_at = world.clock.now()
                before = world.billed_seconds(stopped_at)
                world.clock.advance(timedelta(hours=5))
                assert world.billed_seconds(world.clock.now()) == before, "a stopped stack grew"
            case _:
                pass
    # Whatever happened, a scaler that starts and looks once settles the ledger.
    if world.scaler is None:
        world.start_scaler()
    await world.a_pass()
    return world


@given(steps)
@settings(max_examples=150, deadline=None)
def test_the_ledger_bills_each_node_exactly_what_the_provider_recorded(story: list[Step]) -> None:
    """To the microsecond: recorded ends where the provider kept them, the last sighting
    where it did not; never a second past either, whoever was watching."""
    world = asyncio.run(play(story))
    now = world.clock.now()
    billed = world.billed_seconds(now)
    expected = world.expected_seconds(now)
    assert billed == {name: s for name, s in expected.items() if s > 0}
    total = sum(
        (bill.cost_usd for bill in ledger(world.events(), now=now).attribution.bills), Fraction(0)
    )
    assert total == sum(expected.values(), Fraction(0)) * exact(SPOT.price_per_hour_usd) / 3600


@given(steps)
@settings(max_examples=100, deadline=None)
def test_every_stopped_node_ends_on_the_bus_once_a_scaler_has_looked(story: list[Step]) -> None:
    """After a final look, no node the provider no longer runs is open on the ledger, and
    those that stopped while no scaler watched say so."""
    world = asyncio.run(play(story))
    events = world.events()
    released = {e.data.node: e.data for e in events if isinstance(e.data, NodeReleased)}
    lost = {e.data.node for e in events if isinstance(e.data, NodeLost)}
    for name in world.truth_end:
        assert name in released or name in lost, f"{name} stopped but is still billed"
    for data in released.values():
        if data.reason is ReleaseReason.GONE_WHILE_UNWATCHED or data.reason is ReleaseReason.GONE:
            record = world.cluster.ends.get(data.node)
            recorded = record is not None and record.source is NodeEndSource.RECORDED
            assert data.end_source is (
                NodeEndSource.RECORDED if recorded else NodeEndSource.LAST_SEEN
            )


def test_a_node_stopped_while_the_scaler_was_down_is_closed_at_its_recorded_end() -> None:
    """The table case behind the properties: the scaler restarts, finds it gone, and
    closes it where the provider recorded its end, an hour before the restart."""
    story: list[Step] = [Launch(1), Wait(600), KillScaler(), Wait(60), Stop(0, True)]
    story += [Wait(3600), StartScaler()]
    world = asyncio.run(play(story))
    [released] = [e.data for e in world.events() if isinstance(e.data, NodeReleased)]
    assert released.reason is ReleaseReason.GONE_WHILE_UNWATCHED
    assert released.end_source is NodeEndSource.RECORDED
    assert released.released_at == NOW + timedelta(seconds=660)


def test_an_unrecorded_end_is_billed_to_the_last_sighting_never_to_the_restart() -> None:
    story: list[Step] = [Launch(1), Wait(300), Pass(), Wait(300), KillScaler()]
    story += [Wait(60), Stop(0, False), Wait(7200), StartScaler()]
    world = asyncio.run(play(story))
    [released] = [e.data for e in world.events() if isinstance(e.data, NodeReleased)]
    assert released.reason is ReleaseReason.GONE_WHILE_UNWATCHED
    assert released.end_source is NodeEndSource.LAST_SEEN
    assert released.released_at == NOW + timedelta(seconds=300)


def test_a_providers_stale_stamp_never_ends_a_node_before_the_scalers_own_sighting() -> None:
    """The provider's last stamp of a node alive (a local keeper's heartbeat) is a sighting,
    not a record of its end: a later sighting by the scaler wins (found in CI: the ledger
    ended a preempted node at its heartbeat, before the last pass that listed it)."""
    story: list[Step] = [Launch(1), Wait(300), Pass(), Wait(5), Stop(0, False, 100), Pass()]
    world = asyncio.run(play(story))
    [released] = [e.data for e in world.events() if isinstance(e.data, NodeReleased)]
    assert released.end_source is NodeEndSource.LAST_SEEN
    assert released.released_at == NOW + timedelta(seconds=300)


def test_a_node_never_announced_and_gone_before_the_next_scaler_is_billed_from_its_record() -> None:
    """Found in CI (chaos): the scaler was killed between a launch and its announcement,
    the node was preempted before a new scaler listed it, and no event ever named it."""
    story: list[Step] = [LaunchUnannounced(1), Wait(120), Stop(0, True), Wait(600)]
    story += [StartScaler()]
    world = asyncio.run(play(story))
    [launched] = [e.data for e in world.events() if isinstance(e.data, NodeLaunched)]
    [released] = [e.data for e in world.events() if isinstance(e.data, NodeReleased)]
    assert launched.launched_at == NOW
    assert released.reason is ReleaseReason.GONE_WHILE_UNWATCHED
    assert released.released_at == NOW + timedelta(seconds=120)


def test_a_node_never_announced_whose_loss_the_watcher_saw_is_still_billed() -> None:
    """Found in CI (chaos): the watcher published the node's loss while no scaler ran, and
    the next scaler took that loss for the node's launch being on record."""
    story: list[Step] = [LaunchUnannounced(1), Wait(90), Lost(0), Wait(600), StartScaler()]
    world = asyncio.run(play(story))
    [launched] = [e.data for e in world.events() if isinstance(e.data, NodeLaunched)]
    assert launched.launched_at == NOW
    billed = world.billed_seconds(world.clock.now())
    assert billed == {launched.node: 90}
