"""The scaler's cost feed on a real JetStream: every stored cost event, then new ones, and
nothing else; the figures it folds are `spotrain cost`'s."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.scaler.adapters.cost_feed import StreamCostFeed
from shared.events import Event, new_event
from shared.events.data import JobProgress, NodeLaunched
from shared.messaging.jetstream import JetStreamBus
from shared.policy.cost import ledger
from tests.async_helpers import eventually
from tests.unit.test_cost_ledger import Story

pytestmark = pytest.mark.integration


async def test_the_feed_reads_the_stored_cost_events_then_new_ones(
    jetstream_bus: JetStreamBus,
) -> None:
    story = Story(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1))
    stored = story.events()
    await jetstream_bus.publish_many(stored)
    progress = JobProgress(job_id="job-a", attempt=1, step=3)
    await jetstream_bus.publish(new_event(progress, source="submitter", time=story.t(1500)))

    seen: list[Event[Any]] = []
    stop = asyncio.Event()
    following = asyncio.create_task(StreamCostFeed(jetstream_bus).follow(stop, seen.append))
    await eventually(lambda: len(seen) >= len(stored), timeout_s=10)
    later = story.launched("spot-9", 1700)
    await jetstream_bus.publish(later)
    await eventually(lambda: len(seen) > len(stored), timeout_s=10)
    stop.set()
    await asyncio.wait_for(following, timeout=10)

    assert {e.id for e in seen} == {e.id for e in [*stored, later]}, "cost events only"
    assert isinstance(seen[-1].data, NodeLaunched)
    now = story.t(1800)
    assert ledger(seen, now=now).attribution == ledger([*stored, later], now=now).attribution
