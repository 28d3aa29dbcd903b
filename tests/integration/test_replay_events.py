"""`spotrain events` against a real NATS JetStream: export reads only its window, import
stores each event once, tail follows until Ctrl-C, replay reaches one consumer only."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.events import Event, encode, new_event, subject_of
from shared.events.data import JobQueued, JobRequested, JobStarted, NodeLost, NoticeSource
from shared.events.types import Bundle, CapacityClass
from shared.messaging import BusSettings, Subscription
from shared.messaging.jetstream import JetStreamBus
from tests.async_helpers import consuming, eventually
from tests.cli import ENTRY as SPOTRAIN
from tests.events import NOW, job_requested

pytestmark = pytest.mark.integration


def cli_env(settings: BusSettings) -> dict[str, str]:
    return {
        **os.environ,
        "COLUMNS": "200",
        "SPOTRAIN_NATS_URL": settings.nats_url,
        "SPOTRAIN_SUBJECT_PREFIX": settings.subject_prefix,
    }


def events_cli(
    settings: BusSettings, *args: str, input_bytes: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`spotrain events ARGS` on the test's bus; run it in a thread from async tests, so
    that consumers in the test's loop keep running."""
    return subprocess.run(
        [sys.executable, "-c", SPOTRAIN, "events", *args],
        capture_output=True,
        input=input_bytes,
        env=cli_env(settings),
        timeout=60,
        check=False,
    )


def node_lost(node: str) -> Event[Any]:
    return new_event(
        NodeLost(node=node, source=NoticeSource.LOCAL), source="tests", time=NOW, subject=node
    )


async def instant(bus: JetStreamBus) -> str:
    """A moment between two publishes, as an ISO time the CLI takes."""
    await bus.client.flush()
    await asyncio.sleep(0.05)
    at = datetime.now(UTC).isoformat()
    await asyncio.sleep(0.05)
    return at


async def test_export_writes_the_stored_bytes_of_its_window_only(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    before = [job_requested("job-early"), node_lost("node-early")]
    inside = [job_requested("job-1"), node_lost("node-1"), job_requested("job-2")]
    after = [job_requested("job-late")]
    await jetstream_bus.publish_many(before)
    since = await instant(jetstream_bus)
    await jetstream_bus.publish_many(inside)
    until = await instant(jetstream_bus)
    await jetstream_bus.publish_many(after)

    result = await asyncio.to_thread(
        events_cli, bus_settings, "export", "--since", since, "--until", until
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"".join(encode(e) + b"\n" for e in inside)
    assert result.stderr.decode().startswith("exported 3 events stored from ")

    only = await asyncio.to_thread(
        events_cli, bus_settings, "export", "--since", since, "--type", "job.requested"
    )
    assert only.stdout.splitlines() == [encode(e) for e in (*inside[::2], *after)]

    consumers = await jetstream_bus.client.jetstream().consumers_info(bus_settings.stream)
    assert consumers == [], "the reading consumers are gone"


def queued(job_id: str) -> Event[Any]:
    data = JobQueued(
        job_id=job_id, attempt=1, bundles=(Bundle(gpus=1),), capacity=CapacityClass.ANY, priority=5
    )
    return new_event(data, source="tests", time=NOW, subject=job_id)


def started(job_id: str) -> Event[Any]:
    data = JobStarted(job_id=job_id, attempt=1, submission_id=f"{job_id}-1")
    return new_event(data, source="tests", time=NOW, subject=job_id)


async def test_a_window_of_several_types_starts_at_its_first_event_of_them(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    """nats-server 2.15 starts a consumer of several subjects by time past the window's
    first message of them when the window opens on another subject and that first
    message's subject was also stored before the window."""
    await jetstream_bus.publish(queued("job-early"))
    since = await instant(jetstream_bus)
    inside = [node_lost("node-1"), queued("job-1"), started("job-1"), queued("job-2")]
    for event in inside:
        await jetstream_bus.publish(event)
        await asyncio.sleep(0.05)
    result = await asyncio.to_thread(
        events_cli,
        bus_settings,
        "export",
        "--since",
        since,
        "--type",
        "job.queued",
        "--type",
        "job.started",
    )
    assert result.stdout.splitlines() == [encode(e) for e in inside[1:]]


async def test_an_import_stores_each_event_once_and_rejects_bad_lines_by_number(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, tmp_path: Any
) -> None:
    events = [job_requested("job-1"), node_lost("node-1"), job_requested("job-2")]
    lines = [encode(events[0]), b'{"specversion": "1.0", "type": "nope"}', *map(encode, events[1:])]
    file = tmp_path / "incident.jsonl"
    file.write_bytes(b"\n".join(lines) + b"\n")

    first = await asyncio.to_thread(events_cli, bus_settings, "import", str(file))
    assert first.returncode == 1
    assert first.stdout.decode().splitlines() == [
        "imported 3 events: 3 stored, 0 already on the stream; 1 lines rejected"
    ]
    assert first.stderr.decode().splitlines() == [
        f"{file}: line 2: unknown-type: unknown event type 'nope'"
    ]
    again = await asyncio.to_thread(events_cli, bus_settings, "import", str(file))
    assert again.stdout.decode().splitlines() == [
        "imported 3 events: 0 stored, 3 already on the stream; 1 lines rejected"
    ]

    stored = await jetstream_bus.read(f"{jetstream_bus.prefix}.>")
    assert [(m.subject, m.data) for m in stored] == [
        (subject_of(e.data, jetstream_bus.prefix), encode(e)) for e in events
    ]


async def test_an_export_imports_into_another_stack_as_it_was(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, tmp_path: Any
) -> None:
    """Reproducing an incident: the window of one stack, exported and imported elsewhere."""
    since = await instant(jetstream_bus)
    events = [job_requested("job-1"), node_lost("node-1")]
    await jetstream_bus.publish_many(events)
    exported = await asyncio.to_thread(events_cli, bus_settings, "export", "--since", since)
    file = tmp_path / "window.jsonl"
    file.write_bytes(exported.stdout)

    other = bus_settings.model_copy(update={"subject_prefix": f"{bus_settings.subject_prefix}x"})
    elsewhere = await JetStreamBus.connect(other, name="test-other")
    try:
        await elsewhere.ensure_stream()
        result = await asyncio.to_thread(events_cli, other, "import", str(file))
        assert result.returncode == 0, result.stderr
        stored = await elsewhere.read(f"{other.subject_prefix}.>")
    finally:
        await elsewhere.close()
    assert [m.data for m in stored] == [encode(e) for e in events]


async def _line(stream: asyncio.StreamReader) -> str:
    return (await asyncio.wait_for(stream.readline(), timeout=15)).decode().rstrip("\n")


async def test_tail_follows_the_chosen_events_until_ctrl_c(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    since = await instant(jetstream_bus)
    await jetstream_bus.publish_many(
        [job_requested("job-other"), node_lost("node-1"), job_requested("job-t")]
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SPOTRAIN,
        "events",
        "tail",
        "--type",
        "job.requested",
        "--job",
        "job-t",
        "--since",
        since,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(bus_settings),
    )
    try:
        assert process.stdout is not None
        stored = await _line(process.stdout)
        assert "  job.requested  job-t  " in stored
        assert 'owner="alice"' in stored
        await jetstream_bus.publish(job_requested("job-t", owner="bob"))
        live = await _line(process.stdout)
        assert "  job.requested  job-t  " in live
        assert 'owner="bob"' in live
        process.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr
    assert stderr == b""
    assert time.monotonic() - started < 5


class Heard:
    """Which event ids each consumer's handler saw, in order."""

    def __init__(self) -> None:
        self.ids: dict[str, list[str]] = defaultdict(list)

    def subscription(self, service: str) -> Subscription:
        async def handle(event: Event[Any]) -> None:
            self.ids[service].append(event.id)

        return Subscription(service=service, routes={JobRequested: handle})


async def test_a_replay_reaches_the_one_service_named_and_a_dry_run_publishes_nothing(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    heard = Heard()
    requests = [job_requested("job-1"), job_requested("job-2")]
    ids = [e.id for e in requests]
    async with (
        consuming(jetstream_bus, heard.subscription("alpha")),
        consuming(jetstream_bus, heard.subscription("beta")),
    ):
        since = await instant(jetstream_bus)
        await jetstream_bus.publish_many(requests)
        await eventually(lambda: heard.ids["alpha"] == ids and heard.ids["beta"] == ids)

        dry = await asyncio.to_thread(
            events_cli, bus_settings, "replay", "--since", since, "--to", "alpha", "--dry-run"
        )
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.decode().splitlines()[1:] == [
            "       2  spotrain.job.requested.v1",
            *(f"  spotrain.job.requested.v1  {i}" for i in ids),
        ]
        replayed = f"{jetstream_bus.prefix}.replay.>"
        assert await jetstream_bus.read(replayed) == []

        done = await asyncio.to_thread(
            events_cli, bus_settings, "replay", "--since", since, "--to", "alpha"
        )
        assert done.returncode == 0, done.stderr
        assert "re-delivered 2 events stored from " in done.stdout.decode()
        await eventually(lambda: heard.ids["alpha"] == ids + ids)
        await asyncio.sleep(0.3)
    assert heard.ids["beta"] == ids, "the other consumer heard nothing again"
    stored = await jetstream_bus.read(replayed)
    assert [m.subject for m in stored] == [f"{jetstream_bus.prefix}.replay.alpha.job.requested"] * 2
    assert [m.data for m in stored] == [encode(e) for e in requests]


async def test_a_replay_to_no_consumer_or_of_types_it_does_not_take_is_refused(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    heard = Heard()
    async with consuming(jetstream_bus, heard.subscription("alpha")):

        async def created() -> bool:
            return await jetstream_bus.consumer_filter("alpha") is not None

        await eventually(created)
    nobody = await asyncio.to_thread(
        events_cli, bus_settings, "replay", "--since", "1h", "--to", "nobody"
    )
    assert nobody.returncode == 2
    assert nobody.stderr.decode().splitlines() == [
        "spotrain: error: no service consumes as 'nobody' (consumers: alpha)"
    ]
    other = await asyncio.to_thread(
        events_cli, bus_settings, "replay", "--since", "1h", "--to", "alpha", "--type", "node"
    )
    assert other.returncode == 2
    message = other.stderr.decode().strip()
    assert message.startswith("spotrain: error: alpha consumes none of node.")
    assert message.endswith("(it consumes job.requested)")


async def test_reading_a_bus_with_no_stream_is_one_line(bus_settings: BusSettings) -> None:
    result = await asyncio.to_thread(events_cli, bus_settings, "export", "--since", "1h")
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        f"spotrain: error: nothing recorded: NATS at {bus_settings.nats_url} has no stream "
        f"{bus_settings.stream}"
    ]


@pytest.mark.parametrize("output", ["json", "table", "wide"])
async def test_tail_gives_each_event_as_stored_or_one_line_that_fits(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, output: str
) -> None:
    columns = 80
    since = await instant(jetstream_bus)
    event = job_requested("job-t", owner="alice")
    await jetstream_bus.publish(event)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SPOTRAIN,
        "events",
        "tail",
        "-o",
        output,
        "--since",
        since,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**cli_env(bus_settings), "COLUMNS": str(columns)},
    )
    try:
        assert process.stdout is not None
        line = await _line(process.stdout)
        process.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr
    if output == "json":
        assert line.encode() == encode(event)
        return
    assert "  job.requested  job-t" in line
    if output == "table":
        assert len(line) <= columns
        assert line.endswith("...")
    else:
        assert 'owner="alice"' in line
        assert len(line) > columns
