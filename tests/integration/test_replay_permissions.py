"""Replay under least privilege (`spotrain nats-config`): the ops role reads a window and
re-delivers it to the submitter, whose own user consumes the copies; the CLI role may do
neither."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.events import Event, subjects_for
from shared.events.data import JobRequested
from shared.localstack.nats_server import NatsServer
from shared.messaging import BusSettings, Subscription
from shared.messaging.jetstream import BusPermissionError, JetStreamBus
from shared.natsauth import NatsConfig, Role, write_nats_config
from shared.replay import plan_replay, publish_copies
from tests.async_helpers import consuming, eventually
from tests.events import job_requested

pytestmark = pytest.mark.integration

PREFIX = "spotrain"


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[tuple[NatsConfig, str]]:
    config = write_nats_config(tmp_path / "auth", prefix=PREFIX)
    server = NatsServer(tmp_path / "store", config_file=config.server_config)
    server.start()
    try:
        yield config, server.url
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def connected(secured: tuple[NatsConfig, str], role: Role) -> AsyncIterator[JetStreamBus]:
    config, url = secured
    fields = {k.removeprefix("SPOTRAIN_").lower(): v for k, v in config.env(role).items()}
    settings = BusSettings.model_validate(
        {**fields, "nats_url": url, "connect_timeout_s": 10, "publish_timeout_s": 5}
    )
    bus = await JetStreamBus.connect(settings, name=role.value)
    try:
        yield bus
    finally:
        await bus.close()


async def test_ops_replays_a_window_to_the_submitter_and_the_cli_may_not(
    secured: tuple[NatsConfig, str],
) -> None:
    heard: list[str] = []

    async def on_requested(event: Event[Any]) -> None:
        heard.append(event.id)

    request = job_requested("job-1")
    since = datetime.now(UTC) - timedelta(seconds=1)
    subscription = Subscription(service="submitter", routes={JobRequested: on_requested})
    async with (
        connected(secured, Role.SUBMITTER) as submitter,
        connected(secured, Role.OPS) as ops,
        connected(secured, Role.CLI) as cli,
    ):
        await submitter.ensure_stream()
        async with consuming(submitter, subscription):
            await cli.publish(request)
            await eventually(lambda: heard == [request.id])

            subjects = subjects_for([JobRequested], PREFIX)
            records = [r async for r in ops.read_window(subjects, since=since)]
            plan = plan_replay(records, service="submitter", run="r1", prefix=PREFIX)
            assert await ops.consumer_filter("submitter") == (
                f"{PREFIX}.job.requested",
                f"{PREFIX}.job.requested.>",
                f"{PREFIX}.replay.submitter.job.requested",
            )
            assert await publish_copies(ops, plan) == 1
            await eventually(lambda: heard == [request.id, request.id])

            with pytest.raises(BusPermissionError, match=f"may not publish to '{PREFIX}.replay"):
                await publish_copies(cli, plan)
            several = [*subjects, f"{PREFIX}.node.lost"]
            with pytest.raises(BusPermissionError, match="'cli' may not publish to"):
                [r async for r in cli.read_window(several, since=since)]
