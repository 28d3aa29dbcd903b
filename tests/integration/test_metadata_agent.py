"""The metadata source against a fake GCE metadata server, and the agent process that relays
it onto a real NATS server."""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from structlog.testing import capture_logs

from services.preemption_watcher.adapters.gce_metadata import MetadataClient, MetadataNoticeSource
from services.preemption_watcher.model import NodeSignal
from services.preemption_watcher.policy import Backoff
from shared.events import decode, subject_for
from shared.events.data import NodePreempting, NoticeSource
from shared.localstack.ports import free_port
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.async_helpers import eventually
from tests.fakes.clock import FixedClock
from tests.fakes.metadata_server import FakeMetadataServer, etag_of, serve_fake_metadata

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NODE = "gke-train-gpu-spot-5c1e9a2b-x7kq"
KUBE_LABELS = "cloud.google.com/gke-nodepool=gpu-spot,cloud.google.com/gke-provisioning=spot"
PREEMPTED = "instance/preempted"


@pytest.fixture
def metadata_server() -> Iterator[FakeMetadataServer]:
    fake = FakeMetadataServer(instance_name=NODE, kube_labels=KUBE_LABELS)
    with serve_fake_metadata(fake):
        yield fake


def _source(fake: FakeMetadataServer, *, poll_timeout_s: int = 1) -> MetadataNoticeSource:
    return MetadataNoticeSource(
        MetadataClient(fake.url, connect_timeout_s=1),
        FixedClock(NOW),
        poll_timeout_s=poll_timeout_s,
        backoff=Backoff(first_s=0.05, cap_s=0.2),
    )


@asynccontextmanager
async def watching(source: MetadataNoticeSource) -> AsyncIterator[list[NodeSignal]]:
    """Collect the source's signals for the body of the `with`; stop it at the end."""
    stop = asyncio.Event()
    signals: list[NodeSignal] = []

    async def collect() -> None:
        async for one in source.signals(stop):
            signals.append(one)

    task = asyncio.create_task(collect())
    try:
        yield signals
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)


async def test_the_source_announces_one_notice_when_the_vm_is_preempted(
    metadata_server: FakeMetadataServer,
) -> None:
    """Nothing while FALSE (across poll timeouts), exactly one notice once TRUE."""
    async with watching(_source(metadata_server)) as signals:
        # With a 1 s poll timeout, two waits past FALSE mean one came back unchanged.
        await eventually(lambda: metadata_server.waits_past(PREEMPTED, "FALSE") >= 2)
        assert signals == []
        metadata_server.preempt()
        await eventually(lambda: len(signals) == 1)
        await eventually(lambda: metadata_server.waits_past(PREEMPTED, "TRUE") >= 2)

    assert signals == [
        NodeSignal(
            key=f"{NODE}@{etag_of('TRUE')}",
            data=NodePreempting(
                node=NODE,
                pool="gpu-spot",
                deadline=NOW + timedelta(seconds=30),
                source=NoticeSource.METADATA,
            ),
        )
    ]
    received = metadata_server.received()
    assert {r.key for r in received} == {
        "instance/name",
        "instance/attributes/kube-labels",
        PREEMPTED,
    }
    assert all(r.flavor == "Google" for r in received)
    assert all(r.query.get("timeout_sec") == "1" for r in received if r.waits)


async def test_a_configured_pool_is_used_without_reading_the_node_labels(
    metadata_server: FakeMetadataServer,
) -> None:
    """A VM already preempted when the agent starts is announced at once, with the set pool."""
    metadata_server.preempt()
    source = MetadataNoticeSource(MetadataClient(metadata_server.url), FixedClock(NOW), pool="p1")
    async with watching(source) as signals:
        await eventually(lambda: len(signals) == 1)
    assert signals[0].data.pool == "p1"
    assert not metadata_server.received("instance/attributes/kube-labels")


async def test_behind_gkes_metadata_server_the_source_never_polls_and_says_why() -> None:
    """Issue 20, 2: a pod outside the host network on a Workload Identity pool reaches GKE's
    metadata server: `instance/name` is a 404 for ever, so `preempted` is never polled.
    The source says what to do, and, given its node name, finds `preempted` missing too,
    which only the host network's own metadata server has."""
    fake = FakeMetadataServer(instance_name=NODE, kube_labels=KUBE_LABELS, gke_metadata_server=True)
    with serve_fake_metadata(fake), capture_logs() as logs:
        async with watching(_source(fake)) as signals:
            await eventually(lambda: len(fake.received("instance/name")) >= 3)
            fake.preempt()
            await eventually(lambda: len(fake.received("instance/name")) >= 5)
        assert signals == []
        assert not fake.received(PREEMPTED), "never polled"
        source = MetadataNoticeSource(
            MetadataClient(fake.url, connect_timeout_s=1),
            FixedClock(NOW),
            node=NODE,
            pool="gpu-spot",
            backoff=Backoff(first_s=0.05, cap_s=0.2),
        )
        async with watching(source) as signals:
            await eventually(lambda: len(fake.received(PREEMPTED)) >= 2)
        assert signals == []
    said = {log["path"]: log["error"] for log in logs if log["event"] == "metadata.unavailable"}
    assert "SPOTRAIN_METADATA_AGENT_NODE from the downward API" in said["instance/name"]
    assert "hostNetwork: true" in said[PREEMPTED]


async def test_given_its_node_name_the_source_reads_only_preempted(
    metadata_server: FakeMetadataServer,
) -> None:
    """As the chart runs it (in the host's network, node name and pool from the pod): the
    VM's own metadata server is asked for `instance/preempted` only."""
    source = MetadataNoticeSource(
        MetadataClient(metadata_server.url), FixedClock(NOW), node="from-the-pod", pool="p1"
    )
    metadata_server.preempt()
    async with watching(source) as signals:
        await eventually(lambda: len(signals) == 1)
    assert signals[0].data.node == "from-the-pod"
    assert {r.key for r in metadata_server.received()} == {PREEMPTED}


async def test_the_source_stops_at_once_while_a_long_poll_waits(
    metadata_server: FakeMetadataServer,
) -> None:
    """Setting `stop` ends a 60 s long poll in flight, rather than outwaiting it."""
    stop = asyncio.Event()
    signals = _source(metadata_server, poll_timeout_s=60).signals(stop)
    task = asyncio.create_task(anext(signals, None))
    await eventually(lambda: metadata_server.waits_past(PREEMPTED, "FALSE") == 1)
    started = time.monotonic()
    stop.set()
    assert await asyncio.wait_for(task, timeout=5) is None
    assert time.monotonic() - started < 1


async def test_the_source_rides_out_the_server_being_away() -> None:
    """Down at startup, then gone while the VM is preempted: the notice still comes, once,
    from a wait past the FALSE it saw before (not a fresh read)."""
    fake = FakeMetadataServer(instance_name=NODE, port=free_port())
    async with watching(_source(fake, poll_timeout_s=30)) as signals:
        await asyncio.sleep(0.3)  # the source retries against a closed port
        with serve_fake_metadata(fake):
            await eventually(lambda: fake.waits_past(PREEMPTED, "FALSE") == 1)
            with fake.outage():
                fake.preempt()
                await asyncio.sleep(0.3)  # its long poll dropped, the source retries
                assert signals == []
            await eventually(lambda: len(signals) == 1)
            await eventually(lambda: fake.waits_past(PREEMPTED, "TRUE") == 1)

    assert signals[0].data.node == NODE
    assert signals[0].data.pool is None  # no kube-labels: not a GKE node
    assert signals[0].key == f"{NODE}@{etag_of('TRUE')}"
    assert sum(1 for r in fake.received(PREEMPTED) if not r.waits) == 1


def test_the_fake_refuses_requests_without_the_flavor_header(
    metadata_server: FakeMetadataServer,
) -> None:
    """Like the real server: 403 without `Metadata-Flavor: Google`."""

    def status(headers: dict[str, str]) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", metadata_server.port, timeout=5)
        try:
            connection.request("GET", "/computeMetadata/v1/instance/name", headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    assert status({}) == 403
    assert status({"Metadata-Flavor": "Nope"}) == 403
    assert status({"Metadata-Flavor": "Google"}) == 200


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310  # local test server
            return int(response.status)
    except OSError:
        return 0


async def test_the_agent_process_publishes_its_nodes_notice_and_stops_on_sigterm(
    bus_settings: BusSettings, jetstream_bus: JetStreamBus, metadata_server: FakeMetadataServer
) -> None:
    """`python -m services.preemption_watcher.metadata_agent`: one `node.preempting` on the
    bus for the VM it runs on, and a prompt stop though a long poll is in flight."""
    port = free_port()
    env = {
        **os.environ,
        "SPOTRAIN_NATS_URL": bus_settings.nats_url,
        "SPOTRAIN_SUBJECT_PREFIX": bus_settings.subject_prefix,
        "SPOTRAIN_METADATA_AGENT_HTTP_PORT": str(port),
        "SPOTRAIN_METADATA_AGENT_METADATA_URL": metadata_server.url,
        "SPOTRAIN_METADATA_AGENT_POLL_TIMEOUT_S": "60",
    }
    process = subprocess.Popen(  # noqa: ASYNC220  # started once; the loop never waits on it
        [sys.executable, "-m", "services.preemption_watcher.metadata_agent"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    subject = subject_for(NodePreempting, bus_settings.subject_prefix)
    try:
        await eventually(lambda: _get(f"http://127.0.0.1:{port}/healthz") == 200, timeout_s=20)
        await eventually(lambda: metadata_server.waits_past(PREEMPTED, "FALSE") == 1)
        assert await jetstream_bus.read(subject) == []
        metadata_server.preempt()
        # Once it waits past TRUE, the relay has published and asked for more.
        await eventually(lambda: metadata_server.waits_past(PREEMPTED, "TRUE") == 1)
        stored = await jetstream_bus.read(subject)

        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.to_thread(process.communicate, timeout=15)
        stop_s = time.monotonic() - started
    finally:
        process.kill()
        process.wait()

    assert process.returncode == 0, output.decode()
    assert stop_s < 5, "a 60 s long poll must not hold up the exit"
    assert subject.endswith(".node.preempting")
    assert len(stored) == 1
    event = decode(stored[0].data)
    assert isinstance(event.data, NodePreempting)
    assert (event.data.node, event.data.pool, event.data.source) == (
        NODE,
        "gpu-spot",
        NoticeSource.METADATA,
    )
    assert event.source == "preemption_watcher/metadata"
    assert timedelta(seconds=25) < event.data.deadline - event.time <= timedelta(seconds=30)
    assert '"event": "service.stopped"' in output.decode()
