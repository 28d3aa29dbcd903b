"""`spotrain events what-if` on a synthetic recorded window published to a real NATS: the
recorded figures from the events, the other pools' from the scaler's simulator."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from services.scaler.simulation.replay import load_pools
from services.scaler.simulation.whatif import compare
from shared.events import Event, new_event
from shared.events.data import (
    EventData,
    JobQueued,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
    NodeReleased,
    ReleaseReason,
)
from shared.events.types import Bundle, CapacityClass
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.integration.test_replay_events import events_cli, instant
from tests.unit.test_replay_whatif import BIG_POOL, Story

pytestmark = pytest.mark.integration

PRICE_PER_HOUR_USD = 3600.0
"""A dollar a second, so that a story told in seconds costs dollars."""


class LiveStory:
    """Events published as they happen, each with the time it happened."""

    def __init__(self, bus: JetStreamBus) -> None:
        self.bus = bus
        self.events: list[Event[Any]] = []

    async def tell(self, data: EventData, pause_s: float = 0.0) -> datetime:
        await asyncio.sleep(pause_s)
        at = datetime.now(UTC)
        event = new_event(data, source="tests", time=at)
        await self.bus.publish(event)
        self.events.append(event)
        return at


def _launched(node: str, at: datetime) -> NodeLaunched:
    return NodeLaunched(
        node=node,
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        gpus=2,
        cpus=2,
        price_per_hour_usd=PRICE_PER_HOUR_USD,
        launched_at=at,
    )


def _released(node: str, at: datetime) -> NodeReleased:
    return NodeReleased(
        node=node, pool="gpu-spot", reason=ReleaseReason.SCALED_DOWN, released_at=at
    )


def _queued(job: str, gpus: int) -> JobQueued:
    return JobQueued(
        job_id=job,
        attempt=1,
        bundles=(Bundle(gpus=gpus),),
        capacity=CapacityClass.ANY,
        priority=5,
    )


async def test_what_if_compares_a_recorded_window_with_other_pools(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, tmp_path: Path
) -> None:
    """Two jobs on two nodes over about two seconds, told as they happen."""
    earlier = LiveStory(jetstream_bus)
    await earlier.tell(_queued("job-before", 2))  # queued before the window: not its demand
    since = await instant(jetstream_bus)
    story = LiveStory(jetstream_bus)
    n1_at = datetime.now(UTC)
    await story.tell(_launched("n1", n1_at))
    a_queued = await story.tell(_queued("job-a", 2))
    a_started = await story.tell(JobStarted(job_id="job-a", attempt=1, submission_id="a-1"), 0.3)
    b_queued = await story.tell(_queued("job-b", 1))
    b_started = await story.tell(JobStarted(job_id="job-b", attempt=1, submission_id="b-1"), 0.2)
    await story.tell(JobSucceeded(job_id="job-b", attempt=1), 0.5)
    await story.tell(JobSucceeded(job_id="job-a", attempt=1), 0.3)
    n1_end = datetime.now(UTC)
    await story.tell(_released("n1", n1_end))
    pools = tmp_path / "pools.toml"
    pools.write_text(BIG_POOL)

    result = await asyncio.to_thread(
        events_cli, bus_settings, "what-if", "--since", since, "--pools", str(pools), "--json"
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    waits = sorted([(a_started - a_queued).total_seconds(), (b_started - b_queued).total_seconds()])
    assert figures["jobs"] == 2
    assert figures["recorded"] == {
        "cost_usd": round((n1_end - n1_at).total_seconds(), 2),
        "wait_p50_s": waits[0],
        "wait_p95_s": waits[1],
        "wait_max_s": waits[1],
        "nodes_launched": 1,
    }
    # The other pools' figures are the simulator's on the recorded demand.
    expected = compare(
        story.events,
        *load_pools(pools),
        since=datetime.fromisoformat(since),
        until=datetime.fromisoformat(figures["until"]),
    )
    assert figures["what_if"] == expected.as_json()["what_if"]
    assert figures["what_if"]["nodes_launched"] == 1
    assert figures["difference"]["cost_usd"] == pytest.approx(
        figures["what_if"]["cost_usd"] - figures["recorded"]["cost_usd"], abs=0.01
    )


async def test_what_if_of_an_imported_window_compares_over_the_events_own_times(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, tmp_path: Path
) -> None:
    """Events that happened hours before they were stored (an import of an incident): the
    figures worked out by hand in the story."""
    story = Story(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3))
    await jetstream_bus.publish_many(story.events())
    pools = tmp_path / "pools.toml"
    pools.write_text(BIG_POOL)

    result = await asyncio.to_thread(
        events_cli, bus_settings, "what-if", "--since", "5m", "--pools", str(pools), "--json"
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["since"] == story.t(0).isoformat()
    assert figures["until"] == story.t(4000).isoformat()
    assert figures["recorded"]["cost_usd"] == 1.61
    assert figures["recorded"]["wait_max_s"] == 100.0
    assert figures["what_if"]["cost_usd"] == pytest.approx(1.525, abs=0.01)
    assert figures["notes"] == ["compared over the events' own times (stored later: an import?)"]

    table = await asyncio.to_thread(
        events_cli, bus_settings, "what-if", "--since", "5m", "--pools", str(pools)
    )
    assert table.returncode == 0, table.stderr
    assert "cost $" in table.stdout.decode()


async def test_what_if_with_a_bad_pools_file_is_one_line_and_exit_2(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, tmp_path: Path
) -> None:
    pools = tmp_path / "pools.toml"
    pools.write_text("[[pool]\n")
    result = await asyncio.to_thread(
        events_cli, bus_settings, "what-if", "--since", "5m", "--pools", str(pools)
    )
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("spotrain events what-if: error: ")
