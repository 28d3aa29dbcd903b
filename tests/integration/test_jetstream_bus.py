"""The JetStream bus against a real nats-server: provisioning, restarts, de-duplication."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.events import Event, subject_for
from shared.events.data import JobRequested
from shared.localstack.nats_server import NatsServer
from shared.localstack.ports import free_port
from shared.messaging import BusSettings, Subscription
from shared.messaging.jetstream import BusSettingsError, BusUnavailableError, JetStreamBus
from shared.messaging.settings import ClientBusSettings
from tests.async_helpers import consuming, eventually
from tests.events import job_requested

pytestmark = pytest.mark.integration


async def test_declaring_the_stream_twice_is_harmless(bus_settings: BusSettings) -> None:
    bus = await JetStreamBus.connect(bus_settings, name="test")
    try:
        await bus.ensure_stream()
        await bus.publish(job_requested("job-kept"))
        await bus.ensure_stream()
        info = await bus.client.jetstream().stream_info(bus_settings.stream)
    finally:
        await bus.close()
    assert info.config.subjects == [f"{bus_settings.subject_prefix}.>"]
    assert info.config.duplicate_window == bus_settings.duplicate_window_s
    assert info.config.max_age == bus_settings.stream_max_age_s
    assert info.state.messages == 1


async def test_changed_settings_update_the_existing_stream(bus_settings: BusSettings) -> None:
    longer = bus_settings.model_copy(update={"stream_max_age_s": 90 * 86_400.0})
    for settings in (bus_settings, longer):
        bus = await JetStreamBus.connect(settings, name="test")
        try:
            await bus.ensure_stream()
            info = await bus.client.jetstream().stream_info(settings.stream)
        finally:
            await bus.close()
    assert info.config.max_age == 90 * 86_400


async def test_more_replicas_than_servers_is_one_clear_error_naming_the_setting(
    bus_settings: BusSettings,
) -> None:
    """A single server asked for three copies: refused at once, not a hang."""
    bus = await JetStreamBus.connect(bus_settings.model_copy(update={"replicas": 3}), name="t")
    try:
        with pytest.raises(BusSettingsError, match=r"^SPOTRAIN_REPLICAS=3: the NATS cluster"):
            await asyncio.wait_for(bus.ensure_stream(), timeout=10)
    finally:
        await bus.close()


async def test_connecting_to_no_server_fails_with_a_clear_error() -> None:
    settings = BusSettings(nats_url=f"nats://127.0.0.1:{free_port()}", connect_timeout_s=1)
    with pytest.raises(BusUnavailableError, match="cannot reach NATS"):
        await JetStreamBus.connect(settings, name="test")


async def test_a_persons_client_gives_up_at_once_where_nothing_listens() -> None:
    """Refused is final for a person's client: it does not retry for its whole timeout;
    a service's keeps trying (above) for a server that may be starting."""
    settings = BusSettings(
        nats_url=f"nats://127.0.0.1:{free_port()}", connect_timeout_s=600, refused_is_final=True
    )
    with pytest.raises(BusUnavailableError, match=r"cannot reach NATS.*Connect call failed"):
        # Far inside the 600 s it would otherwise retry for.
        await asyncio.wait_for(JetStreamBus.connect(settings, name="test"), timeout=20)


def test_a_persons_settings_take_refused_as_final() -> None:
    assert ClientBusSettings().refused_is_final
    assert not BusSettings().refused_is_final


async def test_no_event_is_lost_when_the_server_is_killed_and_restarted(
    nats_server: NatsServer, bus_settings: BusSettings
) -> None:
    """Publishers and a consumer ride through a SIGKILL and restart on the same store."""
    total = 150
    handled: dict[str, int] = {}

    async def record(event: Event[Any]) -> None:
        handled[event.data.job_id] = handled.get(event.data.job_id, 0) + 1

    publisher = await JetStreamBus.connect(bus_settings, name="publisher")
    consumer = await JetStreamBus.connect(bus_settings, name="consumer")
    await publisher.ensure_stream()
    try:
        async with consuming(consumer, Subscription(service="svc", routes={JobRequested: record})):

            async def publish_all() -> None:
                for n in range(total):
                    await publisher.publish(job_requested(f"job-{n}"))
                    await asyncio.sleep(0.005)

            publishing = asyncio.create_task(publish_all())
            await eventually(lambda: len(handled) >= total // 3)
            nats_server.kill()
            await asyncio.sleep(0.5)
            nats_server.start()
            await asyncio.wait_for(publishing, timeout=60)
            await eventually(lambda: len(handled) == total, timeout_s=30)
        stored = await publisher.read(subject_for(JobRequested, publisher.prefix))
    finally:
        await publisher.close()
        await consumer.close()
    assert sorted(handled) == sorted(f"job-{n}" for n in range(total))
    # Re-published after the restart, but stored once each thanks to the message id.
    assert len(stored) == total
