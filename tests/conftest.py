"""Fixtures shared by every tier: a real NATS server, buses over it, settings."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.localstack.nats_server import NatsServer
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def bus_settings(nats_server: NatsServer) -> BusSettings:
    """Settings for a test: its own server, its own prefix and stream."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    return BusSettings(
        nats_url=nats_server.url,
        subject_prefix=prefix,
        connect_timeout_s=5,
        publish_timeout_s=15,
        ack_wait_s=5,
    )


@pytest.fixture
async def jetstream_bus(bus_settings: BusSettings) -> AsyncIterator[JetStreamBus]:
    bus = await JetStreamBus.connect(bus_settings, name="test")
    await bus.ensure_stream()
    yield bus
    await bus.close()
