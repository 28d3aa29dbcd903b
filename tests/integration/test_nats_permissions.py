"""Each role against a real nats-server started with `spotrain nats-config`'s configuration:
it does its work through the real adapters, and is refused the rest at once, with an error
that names the user and the subject."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import ConsumerConfig

from services.scaler.adapters.kv_demand import KvDemandStore
from services.submitter.adapters.kv_job_store import KvJobStore
from services.submitter.adapters.workspaces import ObjectStoreWorkspaces
from shared.client import SpotrainClient
from shared.clock import SystemClock
from shared.events import Event, EventData, encode, new_event
from shared.events.data import (
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobRequested,
    JobResumed,
    NodeLost,
    NodePreempting,
    NoticeSource,
    PoolResized,
)
from shared.events.types import CapacityClass
from shared.jobs import JobRecord, JobsBucket, JobState, jobs_bucket
from shared.localstack.nats_server import NatsServer
from shared.messaging import BusSettings, Handler, Subscription
from shared.messaging.jetstream import (
    BusAuthenticationError,
    BusPermissionError,
    BusUnavailableError,
    JetStreamBus,
)
from shared.natsauth import NatsConfig, Role, TlsFiles, write_nats_config
from shared.pools import PoolsBucket, PoolsStatus, pools_bucket
from shared.workspace import declare_stores, workspaces_bucket
from tests.async_helpers import consuming, eventually
from tests.events import NOW, job_requested

pytestmark = pytest.mark.integration

PREFIX = "spotrain"
STREAM = "SPOTRAIN"


@dataclass
class Platform:
    """A server with the generated configuration, and buses that connect as a role."""

    config: NatsConfig
    url: str
    stack: AsyncExitStack

    def settings(self, role: Role, **overrides: Any) -> BusSettings:
        # The role's environment file, as BusSettings reads it (`SPOTRAIN_<FIELD>`).
        fields = {k.removeprefix("SPOTRAIN_").lower(): v for k, v in self.config.env(role).items()}
        timeouts = {"connect_timeout_s": 10, "publish_timeout_s": 10, "ack_wait_s": 5}
        return BusSettings.model_validate({**fields, "nats_url": self.url, **timeouts, **overrides})

    async def bus(self, role: Role) -> JetStreamBus:
        bus = await JetStreamBus.connect(self.settings(role), name=role.value)
        self.stack.push_async_callback(bus.close)
        return bus


@pytest.fixture
async def platform(tmp_path: Path) -> AsyncIterator[Platform]:
    """The stream and the jobs bucket exist, as once the submitter has started."""
    config = write_nats_config(tmp_path / "auth", prefix=PREFIX)
    server = NatsServer(tmp_path / "store", config_file=config.server_config)
    server.start()
    try:
        async with AsyncExitStack() as stack:
            platform = Platform(config, server.url, stack)
            submitter = await platform.bus(Role.SUBMITTER)
            await submitter.ensure_stream()
            await KvJobStore.open(submitter, jobs_bucket(PREFIX))
            await declare_stores(submitter, PREFIX)
            yield platform
    finally:
        server.stop()


def _event(data: EventData, job_id: str | None = None) -> Event[Any]:
    return new_event(data, source="tests", time=NOW, subject=job_id)


def _record(event: Event[JobRequested]) -> JobRecord:
    return JobRecord(
        request=event.data,
        request_event_id=event.id,
        state=JobState.QUEUED,
        accepted_at=NOW,
        updated_at=NOW,
    )


async def test_a_job_goes_from_the_cli_through_the_submitter(
    platform: Platform, tmp_path: Path
) -> None:
    """Upload, request, admit (workspace download, jobs bucket), answer, list, history,
    cancel: the CLI and the submitter each under their own user."""
    submitter = await platform.bus(Role.SUBMITTER)
    store = await KvJobStore.open(submitter, jobs_bucket(PREFIX))
    workspaces = ObjectStoreWorkspaces(submitter, tmp_path / "cache")

    async def on_job_requested(event: Event[Any]) -> None:
        assert isinstance(event.data, JobRequested)
        assert event.data.working_dir is not None
        unpacked = await workspaces.unpack(event.data.working_dir)
        assert (unpacked / "train.py").read_text() == "print('hi')\n"
        await store.create(_record(event))
        accepted = JobAccepted(job_id=event.data.job_id, owner=event.data.owner)
        await submitter.publish(_event(accepted, event.data.job_id))

    cli = await platform.bus(Role.CLI)
    client = SpotrainClient(cli, SystemClock())
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "train.py").write_text("print('hi')\n")
    ref = await client.upload_workspace(tmp_path / "ws")
    request = job_requested("job-7", working_dir=ref).data
    routes: dict[type[EventData], Handler] = {
        JobRequested: on_job_requested,
        JobCancelRequested: _ignore,
    }
    async with consuming(submitter, Subscription(service="submitter", routes=routes)):
        answer = await client.submit(request, answer_timeout_s=10)
        assert answer is not None
        assert isinstance(answer.data, JobAccepted)
        await client.cancel("job-7", requested_by="alice")

        ops = (await platform.bus(Role.OPS)).client.jetstream()

        async def all_acked() -> bool:
            info = await ops.consumer_info(STREAM, "submitter")
            return bool(info.delivered.consumer_seq == 2 and info.num_ack_pending == 0)

        await eventually(all_acked, timeout_s=5)

    assert [r.job_id for r in await client.jobs()] == ["job-7"]
    history = await client.history("job-7")
    assert [type(e.data) for e in history] == [JobRequested, JobAccepted, JobCancelRequested]
    # What a content-addressed upload needs to skip storing the same tree twice.
    stored = await cli.client.jetstream().object_store(workspaces_bucket(PREFIX))
    assert (await stored.get_info(ref.name)).size == ref.size_bytes


async def test_the_scaler_writes_the_pools_and_publishes_pool_events(platform: Platform) -> None:
    scaler = await platform.bus(Role.SCALER)
    await scaler.ensure_stream()
    board = await KvDemandStore.open(scaler, pools_bucket(PREFIX))
    status = PoolsStatus(
        updated_at=NOW, budget_per_hour_usd=50, cost_per_hour_usd=0, pools=(), blocked_jobs=0
    )
    await board.publish_status(status)
    await scaler.publish(_event(PoolResized(pool="gpu-spot", size=2)))
    heard: list[str] = []

    async def on_job_cancelled(event: Event[Any]) -> None:
        heard.append(event.data.job_id)

    submitter = await platform.bus(Role.SUBMITTER)
    await submitter.publish(_event(JobCancelled(job_id="job-1"), "job-1"))
    routes: dict[type[EventData], Handler] = {JobCancelled: on_job_cancelled}
    async with consuming(scaler, Subscription(service="scaler", routes=routes)):
        await eventually(lambda: heard == ["job-1"], timeout_s=5)

    client = SpotrainClient(await platform.bus(Role.CLI), SystemClock())
    assert await client.pools() == status


async def test_the_watcher_the_agent_and_the_checkpointer_do_their_part(
    platform: Platform,
) -> None:
    submitter = await platform.bus(Role.SUBMITTER)
    store = await KvJobStore.open(submitter, jobs_bucket(PREFIX))
    await store.create(_record(job_requested("job-3")))
    scaler = await platform.bus(Role.SCALER)
    board = await KvDemandStore.open(scaler, pools_bucket(PREFIX))
    status = PoolsStatus(
        updated_at=NOW, budget_per_hour_usd=50, cost_per_hour_usd=0, pools=(), blocked_jobs=0
    )
    await board.publish_status(status)

    agent = await platform.bus(Role.METADATA_AGENT)
    await agent.ensure_stream()
    deadline = NOW + dt.timedelta(seconds=30)
    notice = NodePreempting(node="n-1", deadline=deadline, source=NoticeSource.METADATA)
    await agent.publish(_event(notice))
    watcher = await platform.bus(Role.PREEMPTION_WATCHER)
    await watcher.ensure_stream()
    await watcher.publish(_event(NodeLost(node="n-1", source=NoticeSource.LOCAL)))

    checkpointer = await platform.bus(Role.CHECKPOINTER)
    jobs = JobsBucket(checkpointer.bucket(jobs_bucket(PREFIX)))
    pools = PoolsBucket(checkpointer.bucket(pools_bucket(PREFIX)))
    resumed: list[str] = []

    async def on_node_lost(event: Event[Any]) -> None:
        # What a loss and each review of moves read: every active job, the pools' status.
        assert [r.job_id for r in await jobs.active()] == ["job-3"]
        assert await pools.status() == status
        record = await jobs.get("job-3")
        assert record is not None
        data = JobResumed(job_id=record.job_id, attempt=2, capacity=CapacityClass.SPOT)
        await checkpointer.publish(_event(data, record.job_id))
        resumed.append(record.job_id)

    routes: dict[type[EventData], Handler] = {NodeLost: on_node_lost, NodePreempting: _ignore}
    async with consuming(checkpointer, Subscription(service="checkpointer", routes=routes)):
        await eventually(lambda: resumed == ["job-3"], timeout_s=5)


async def test_the_slack_bot_requests_reads_and_follows_its_jobs(platform: Platform) -> None:
    slack = await platform.bus(Role.SLACK)
    await slack.ensure_stream()
    await slack.publish(job_requested("job-s"))
    data = JobCancelRequested(job_id="job-s", requested_by="bob")
    await slack.publish(_event(data, "job-s"))
    client = SpotrainClient(slack, SystemClock())
    assert await client.jobs() == []
    assert await client.pools() is None  # no pools bucket yet
    # What its handlers read besides: a job that is not there (nor among the refusals),
    # and the ledger (`/train cost`), from the job and node events.
    assert await client.job("no-such-job") is None
    ledger = await client.costs()
    assert ledger.attribution.charges == ()

    submitter = await platform.bus(Role.SUBMITTER)
    await submitter.publish(_event(JobAccepted(job_id="job-s", owner="bob"), "job-s"))
    posted: list[str] = []

    async def on_job_accepted(event: Event[Any]) -> None:
        posted.append(event.data.job_id)

    routes: dict[type[EventData], Handler] = {JobAccepted: on_job_accepted}
    async with consuming(slack, Subscription(service="slack", routes=routes)):
        await eventually(lambda: posted == ["job-s"], timeout_s=5)


async def test_ops_replays_and_reads_everything(platform: Platform) -> None:
    ops = await platform.bus(Role.OPS)
    replayed = encode(job_requested("job-r"))
    await ops.publish_raw(f"{PREFIX}.replay.submitter", replayed)
    stored = await ops.read(f"{PREFIX}.>")
    assert [(m.subject, m.data) for m in stored] == [(f"{PREFIX}.replay.submitter", replayed)]
    js = ops.client.jetstream()
    await js.add_consumer(STREAM, ConsumerConfig(durable_name="ops-probe"))
    assert await js.delete_consumer(STREAM, "ops-probe")


async def _ignore(event: Event[Any]) -> None:
    del event


Action = Callable[[JetStreamBus], Awaitable[object]]


async def _write_jobs_bucket(bus: JetStreamBus) -> None:
    async with bus.permission_checked("write the jobs bucket"):
        kv = await bus.client.jetstream().key_value(jobs_bucket(PREFIX))
        await kv.put("job-1", b"{}")


async def _delete_stream(bus: JetStreamBus) -> None:
    async with bus.permission_checked("delete the stream"):
        await bus.client.jetstream().delete_stream(STREAM)


async def _take_submitters_messages(bus: JetStreamBus) -> None:
    async with bus.permission_checked("pull from the submitter's consumer"):
        psub = await bus.client.jetstream().pull_subscribe_bind(durable="submitter", stream=STREAM)
        await psub.fetch(1, timeout=5)


async def _listen_to_pools(bus: JetStreamBus) -> None:
    async with bus.permission_checked("listen to pool events"):
        await bus.client.subscribe(f"{PREFIX}.pool.>")
        await bus.client.flush()
        # A loaded server may answer the flush before it reports the refused subscription.
        await asyncio.sleep(0.5)


async def _consume(bus: JetStreamBus) -> None:
    subscription = Subscription(service="metadata_agent", routes={NodeLost: _ignore})
    await bus.consume(subscription, asyncio.Event())


async def _upload(bus: JetStreamBus) -> None:
    async with bus.permission_checked("upload a workspace"):
        await bus.client.jetstream().create_object_store(workspaces_bucket(PREFIX))


def _publish(data: EventData) -> Action:
    return lambda bus: bus.publish(_event(data))


def _publish_raw(subject: str) -> Action:
    return lambda bus: bus.publish_raw(subject, encode(job_requested("job-x")))


def _read(subject: str) -> Action:
    return lambda bus: bus.read(subject)


RESIZED = PoolResized(pool="gpu-spot", size=100)


@pytest.mark.parametrize(
    ("role", "action", "refused"),
    [
        pytest.param(
            Role.CLI, _publish(RESIZED), 'publish to "spotrain.pool.resized"', id="cli-resizes"
        ),
        pytest.param(
            Role.CLI, _write_jobs_bucket, 'publish to "$kv.spotrain-jobs.job-1"', id="cli-kv"
        ),
        pytest.param(
            Role.SLACK,
            _publish_raw("spotrain.replay.submitter"),
            'publish to "spotrain.replay.submitter"',
            id="slack-replays",
        ),
        pytest.param(
            Role.CLI,
            _publish_raw("spotrain.replay.scaler"),
            'publish to "spotrain.replay.scaler"',
            id="cli-replays",
        ),
        pytest.param(
            Role.SCALER,
            _delete_stream,
            'publish to "$js.api.stream.delete.spotrain"',
            id="scaler-deletes-the-stream",
        ),
        pytest.param(
            Role.SUBMITTER,
            _publish(RESIZED),
            'publish to "spotrain.pool.resized"',
            id="submitter-resizes",
        ),
        pytest.param(
            Role.CHECKPOINTER,
            _write_jobs_bucket,
            'publish to "$kv.spotrain-jobs.job-1"',
            id="checkpointer-writes-jobs",
        ),
        pytest.param(
            Role.CLI,
            _take_submitters_messages,
            'publish to "$js.api.consumer.msg.next.spotrain.submitter"',
            id="cli-takes-the-submitters-messages",
        ),
        pytest.param(
            Role.CLI,
            _read("spotrain.pool.>"),
            'publish to "$js.api.consumer.create.spotrain.read-',
            id="cli-reads-pool-history",
        ),
        pytest.param(
            Role.CLI,
            _listen_to_pools,
            'subscribe to "spotrain.pool.>"',
            id="cli-listens-to-pools",
        ),
        pytest.param(
            Role.METADATA_AGENT,
            _consume,
            'publish to "$js.api.consumer.durable.create.spotrain.metadata_agent"',
            id="agent-consumes",
        ),
        pytest.param(
            Role.SLACK,
            _upload,
            'publish to "$js.api.stream.create.obj_spotrain-workspaces"',
            id="slack-uploads",
        ),
        # Every store is declared by its writer at start, never on first use.
        pytest.param(
            Role.CLI,
            _upload,
            'publish to "$js.api.stream.create.obj_spotrain-workspaces"',
            id="cli-declares-the-workspace-store",
        ),
    ],
)
async def test_a_role_is_refused_what_it_must_not_do_at_once(
    platform: Platform, role: Role, action: Action, refused: str
) -> None:
    bus = await platform.bus(role)
    started = time.monotonic()
    with pytest.raises(BusPermissionError) as caught:
        await asyncio.wait_for(action(bus), timeout=10)
    assert time.monotonic() - started < 2, "refused at once, not after a timeout"
    assert caught.value.user == role.value
    assert str(caught.value).startswith(f"NATS user {role.value!r} may not ")
    assert refused.lower() in str(caught.value).lower().replace("'", '"')
    # The connection is still good for what the role may do.
    assert bus.is_connected


async def test_a_handlers_refused_publish_is_its_own_error_not_the_consumers(
    platform: Platform,
) -> None:
    """The refusal fails the handler (so the message is retried, then dead-lettered); the
    consumer beside it on the same connection keeps pulling."""
    submitter = await platform.bus(Role.SUBMITTER)
    errors: list[BaseException] = []

    async def on_job_requested(event: Event[Any]) -> None:
        try:
            await submitter.publish(_event(RESIZED))
        except BusPermissionError as error:
            errors.append(error)
            raise

    cli = await platform.bus(Role.CLI)
    await cli.publish(job_requested("job-9"))
    routes: dict[type[EventData], Handler] = {JobRequested: on_job_requested}
    stop = asyncio.Event()
    consumer = asyncio.create_task(
        submitter.consume(Subscription(service="submitter", routes=routes), stop)
    )
    try:
        await eventually(lambda: bool(errors), timeout_s=5)
        await asyncio.sleep(0.7)  # more than one round of pulling
        assert not consumer.done()
    finally:
        stop.set()
        await asyncio.wait_for(consumer, timeout=10)
    assert "may not publish to 'spotrain.pool.resized'" in str(errors[0])


async def test_a_client_without_its_roles_inbox_is_told_which_setting_to_change(
    platform: Platform,
) -> None:
    settings = platform.settings(Role.CLI, nats_inbox_prefix="_INBOX")
    bus = await JetStreamBus.connect(settings, name="cli")
    platform.stack.push_async_callback(bus.close)
    with pytest.raises(BusPermissionError, match="SPOTRAIN_NATS_INBOX_PREFIX=_INBOX"):
        await bus.publish(job_requested("job-i"))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"nats_password": "not-the-password"}, id="wrong-password"),
        pytest.param({"nats_user": "mallory"}, id="unknown-user"),
        pytest.param({"nats_user": None, "nats_password": None}, id="no-user"),
    ],
)
async def test_a_bad_identity_is_refused_at_once(
    platform: Platform, overrides: dict[str, Any]
) -> None:
    started = time.monotonic()
    with pytest.raises(BusAuthenticationError, match="refused"):
        await JetStreamBus.connect(platform.settings(Role.CLI, **overrides), name="intruder")
    assert time.monotonic() - started < 3, "refused at once, not after the connect timeout"


async def test_clients_connect_over_tls_with_the_ca_in_their_environment(tmp_path: Path) -> None:
    tls = _certificates(tmp_path / "tls")
    config = write_nats_config(tmp_path / "auth", prefix=PREFIX, tls=tls)
    server = NatsServer(tmp_path / "store", config_file=config.server_config)
    server.start()
    try:
        async with AsyncExitStack() as stack:
            platform = Platform(config, f"tls://localhost:{server.port}", stack)
            submitter = await platform.bus(Role.SUBMITTER)
            await submitter.ensure_stream()
            cli = await platform.bus(Role.CLI)
            ack = await cli.publish(job_requested("job-tls"))
            assert ack.seq == 1
            untrusting = platform.settings(Role.CLI, nats_tls_ca_file=None, connect_timeout_s=1)
            with pytest.raises(BusUnavailableError, match="certificate verify failed"):
                await JetStreamBus.connect(untrusting, name="untrusting")
    finally:
        server.stop()


def _certificates(directory: Path) -> TlsFiles:
    """A CA, and a certificate it signed for localhost and 127.0.0.1."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    directory.mkdir()
    now = dt.datetime.now(dt.UTC)

    def certificate(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: Any, signer: Any, *, ca: bool
    ) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spotrain test CA")])
    ca_cert = certificate("spotrain test CA", ca_key, ca_name, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = certificate("localhost", server_key, ca_name, ca_key, ca=False)

    pem = serialization.Encoding.PEM
    files = TlsFiles(
        cert_file=directory / "server.pem",
        key_file=directory / "server-key.pem",
        ca_file=directory / "ca.pem",
    )
    files.cert_file.write_bytes(server_cert.public_bytes(pem))
    files.key_file.write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    assert files.ca_file is not None
    files.ca_file.write_bytes(ca_cert.public_bytes(pem))
    return files
