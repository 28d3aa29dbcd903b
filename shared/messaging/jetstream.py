"""The bus on NATS JetStream: one stream, durable pull consumers, explicit acks."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import ssl
import time
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Any, Self

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from shared.events import Event, all_subjects, dlq_subject, encode, subject_of
from shared.logs import deferred_logger
from shared.messaging.dead_letters import MSG_ID, dead_letter_headers
from shared.messaging.delivery import (
    Ack,
    DeadLetter,
    Delivery,
    HandlerTasks,
    Nak,
    Subscription,
    settle,
)
from shared.messaging.failover import cluster_busy, through_failover
from shared.messaging.kv_store import JetStreamKeyValue
from shared.messaging.object_store import JetStreamObjectStore
from shared.messaging.ports import (
    Asked,
    KeyValue,
    Listening,
    NoAnswerError,
    ObjectStore,
    OnAsk,
    OnMessage,
    PublishAck,
    StoredMessage,
    StreamRecord,
)
from shared.messaging.settings import BusSettings

log = deferred_logger()

# Errors that mean "the server is not reachable right now", which a retry can outlive.
_TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    asyncio.TimeoutError,
    OSError,
)


class BusUnavailableError(RuntimeError):
    """The NATS server could not be reached within the configured time."""


class BusAuthenticationError(RuntimeError):
    """The NATS server refused the connection's user, password or credentials."""


READ_UNAVAILABLE_TRIES = 25
"""Fetches a read retries while its consumer has no responder (about 5 s)."""


class BusSettingsError(RuntimeError):
    """The cluster cannot do what the settings ask (more replicas than servers): the
    message names the setting to change."""


TOO_FEW_SERVERS = (10023, 10074)
"""JetStream's error codes when no set of servers can hold the copies asked for: a
cluster's "insufficient resources", a single server's "replicas > 1 not supported"."""


def _too_many_replicas(replicas: int, error: nats.js.errors.APIError) -> str:
    return (
        f"SPOTRAIN_REPLICAS={replicas}: the NATS cluster cannot keep that many copies "
        f"({error.description}); set it to the number of JetStream servers or fewer"
    )


class Refused(StrEnum):
    PUBLISH = "publish to"
    SUBSCRIBE = "subscribe to"


class BusPermissionError(RuntimeError):
    """The server's permissions do not let this connection's user publish or subscribe to a
    subject. Not an `OSError`: retrying cannot help, the configuration must change."""

    def __init__(self, user: str, refused: Refused, subject: str, doing: str | None) -> None:
        needed = f", needed to {doing}" if doing else ""
        super().__init__(f"NATS user {user!r} may not {refused} {subject!r}{needed}")
        self.user = user
        self.refused = refused
        self.subject = subject


@dataclass(frozen=True)
class _Refusal:
    refused: Refused
    subject: str
    """As the server reported it; nats-py lower-cases the whole message."""


_PERMISSIONS_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription) to "([^"]+)"'
)


def _refusal(error: Exception) -> _Refusal | None:
    match = _PERMISSIONS_VIOLATION.search(str(error).lower())
    if match is None:
        return None
    refused = Refused.PUBLISH if match.group(1) == "publish" else Refused.SUBSCRIBE
    return _Refusal(refused, match.group(2))


def _is_authentication_failure(error: Exception) -> bool:
    return isinstance(error, nats.errors.AuthorizationError) or (
        "authorization violation" in str(error).lower()
    )


class PermissionChecked:
    """Ends the operation inside it with `BusPermissionError` as soon as the server refuses
    one of its subjects, instead of letting it wait for an answer that never comes.

    Works like `asyncio.timeout`: the refusal, reported on the connection, cancels the task
    inside the block, and the cancellation becomes the error. The server does not say which
    request a refusal answers, so a block takes every refusal reported while it runs, or,
    given a subject (a prefix if it ends in `>`), the refusals of that subject and of any
    subscription (a refused reply inbox fails every request). The subject in the error is
    as the server reported it, which nats-py lower-cases.
    """

    def __init__(self, bus: JetStreamBus, doing: str | None, subject: str | None) -> None:
        self._bus = bus
        self._doing = doing
        self._subject = subject
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._refusal: _Refusal | None = None

    def concerns(self, refusal: _Refusal) -> bool:
        if self._subject is None or refusal.refused is Refused.SUBSCRIBE:
            return True
        subject = self._subject.lower()
        if subject.endswith(">"):
            return refusal.subject.startswith(subject[:-1])
        return refusal.subject == subject

    def refuse(self, refusal: _Refusal) -> None:
        if self._refusal is None and self._task is not None:
            self._refusal = refusal
            self._task.cancel()

    async def __aenter__(self) -> Self:
        self._task = asyncio.current_task()
        if self._task is None:
            msg = "PermissionChecked must be used inside a task"
            raise RuntimeError(msg)
        self._cancelling = self._task.cancelling()
        self._bus._checks.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bus._checks.discard(self)
        refusal = self._refusal
        if refusal is None or self._task is None:
            return
        if self._task.uncancel() > self._cancelling and exc_type is asyncio.CancelledError:
            return  # cancelled from outside as well: that cancellation wins
        subject = self._subject if refusal.subject == (self._subject or "").lower() else None
        doing = self._doing
        inbox = self._bus.inbox_prefix
        if refusal.refused is Refused.SUBSCRIBE and refusal.subject.startswith(f"{inbox}.".lower()):
            doing = (
                f"hear replies under SPOTRAIN_NATS_INBOX_PREFIX={inbox}; "
                "a role's replies come under its own prefix (_INBOX_<role>)"
            )
        raise BusPermissionError(
            self._bus.user, refusal.refused, subject or refusal.subject, doing
        ) from None


@dataclass(frozen=True)
class _From:
    """Where a reading consumer starts: a stored time, a stream sequence, the first message
    (neither), or only what is stored from now on (`new`)."""

    time: datetime | None = None
    seq: int | None = None
    new: bool = False

    def config(self) -> dict[str, Any]:
        if self.seq is not None:
            return {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": self.seq}
        if self.time is not None:
            return {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": self.time}
        return {"deliver_policy": DeliverPolicy.NEW if self.new else DeliverPolicy.ALL}


_READ_BATCH = 500


class JetStreamBus:
    """`EventBus` on a NATS JetStream stream that captures `<prefix>.>`."""

    def __init__(self, settings: BusSettings) -> None:
        self._nc = Client()
        self._js: JetStreamContext = self._nc.jetstream(timeout=5)
        self._settings = settings
        self._closing = False
        self._checks: set[PermissionChecked] = set()
        self._authentication_failed: asyncio.Future[Any] | None = None
        self._connect_error: Exception | None = None
        """The last error while connecting the first time: says why it is taking so long."""
        self._refused: asyncio.Future[Any] | None = None
        """Set when the first connection is refused and `refused_is_final` says to stop."""
        self._refusals = 0

    @classmethod
    async def connect(cls, settings: BusSettings, *, name: str) -> Self:
        """Connect, retrying until `connect_timeout_s`; later reconnects are automatic.

        Raises `BusUnavailableError` when no server answers in time, and
        `BusAuthenticationError` at once when the server refuses the credentials."""
        bus = cls(settings)
        password = settings.nats_password
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        bus._authentication_failed = failed
        refused: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if settings.refused_is_final:
            bus._refused = refused
        # nats-py retries the first connection as it retries reconnects: forever, with
        # max_reconnect_attempts=-1; the deadline bounds it.
        connecting: asyncio.Future[Any] = asyncio.ensure_future(
            bus._nc.connect(
                # Every server of a cluster: the client moves to another when one goes.
                settings.nats_servers,
                name=name,
                user_credentials=settings.nats_creds_file,
                user=settings.nats_user,
                password=password.get_secret_value() if password else None,
                inbox_prefix=settings.nats_inbox_prefix,
                tls=_tls_context(settings),
                tls_hostname=settings.nats_tls_hostname,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=1,
                connect_timeout=2,
                drain_timeout=5,
                error_cb=bus._on_error,
                disconnected_cb=bus._on_disconnected,
                reconnected_cb=bus._on_reconnected,
            )
        )
        try:
            done, _ = await asyncio.wait(
                {connecting, failed, refused},
                timeout=settings.connect_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if failed in done:
                who = f"user {settings.nats_user!r}" if settings.nats_user else "this client"
                msg = (
                    f"NATS at {settings.nats_url} refused {who}: "
                    f"{failed.result()} (check the user and password, "
                    "or the credentials file)"
                )
                raise BusAuthenticationError(msg)
            if refused in done:
                raise refused.result()
            if connecting not in done:
                raise TimeoutError
            connecting.result()
        except (*_TRANSIENT, nats.errors.NoServersError, BusAuthenticationError) as error:
            bus._closing = True
            connecting.cancel()
            with contextlib.suppress(*_TRANSIENT, asyncio.CancelledError):
                await connecting
            with contextlib.suppress(*_TRANSIENT):
                await bus._nc.close()
            if isinstance(error, BusAuthenticationError):
                raise
            msg = f"cannot reach NATS at {settings.nats_url}: {str(error) or type(error).__name__}"
            if bus._connect_error is not None and bus._connect_error is not error:
                msg += f" (last error: {bus._connect_error})"
            raise BusUnavailableError(msg) from error
        finally:
            bus._authentication_failed = None
            bus._refused = None
        return bus

    @property
    def inbox_prefix(self) -> str:
        return self._settings.nats_inbox_prefix

    @property
    def user(self) -> str:
        """Who this connection is, as far as the client knows: for error messages."""
        s = self._settings
        if s.nats_user:
            return s.nats_user
        return f"(credentials {s.nats_creds_file})" if s.nats_creds_file else "(no user)"

    def permission_checked(
        self, doing: str | None = None, *, subject: str | None = None
    ) -> PermissionChecked:
        """`async with bus.permission_checked("read the jobs bucket"): ...` turns a refusal
        by the server's permissions into `BusPermissionError` at once; without it, a refused
        request waits for its timeout and a refused subscription just stays silent. To see
        a subscription's refusal, `await bus.client.flush()` inside the block. With
        `subject` (a prefix if it ends in `>`), only refusals of those subjects and of
        subscriptions count, so that other work on the connection cannot fail this one."""
        return PermissionChecked(self, doing, subject)

    @property
    def prefix(self) -> str:
        return self._settings.subject_prefix

    @property
    def replicas(self) -> int:
        """Copies of the stream and of each bucket and store (`BusSettings.replicas`)."""
        return self._settings.replicas

    @property
    def is_connected(self) -> bool:
        return self._nc.is_connected

    @property
    def client(self) -> Client:
        """The NATS connection, for key-value and object stores built on the same link."""
        return self._nc

    async def ensure_stream(self) -> None:
        """Declare the stream, or bring an existing one to these settings; safe to repeat."""
        s = self._settings
        config = StreamConfig(
            name=s.stream,
            subjects=[all_subjects(s.subject_prefix)],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=s.stream_max_age_s,
            max_bytes=s.stream_max_bytes,
            max_msg_size=s.stream_max_msg_bytes,
            discard=DiscardPolicy.OLD,
            duplicate_window=s.duplicate_window_s,
            num_replicas=s.replicas,
        )
        doing = f"declare the stream {s.stream}"
        deadline = time.monotonic() + s.connect_timeout_s
        async with self.permission_checked(doing, subject="$JS.API.STREAM.>"):
            while True:
                try:
                    await self._declare(config)
                except nats.js.errors.APIError as error:
                    if error.err_code in TOO_FEW_SERVERS:
                        raise BusSettingsError(_too_many_replicas(s.replicas, error)) from None
                    if not cluster_busy(error) or time.monotonic() > deadline:
                        raise
                except nats.errors.TimeoutError:
                    # A cluster electing its JetStream leader answers nothing meanwhile;
                    # an answer lost on the way leaves the stream made: looked up again.
                    if time.monotonic() > deadline:
                        raise
                else:
                    return
                await asyncio.sleep(0.5)

    async def _declare(self, config: StreamConfig) -> None:
        name = self._settings.stream
        try:
            await self._js.stream_info(name)
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(config)
            log.info("stream.created", stream=name, replicas=config.num_replicas)
        else:
            await self._js.update_stream(config)

    @contextlib.contextmanager
    def _copies_checked(self) -> Iterator[None]:
        """A bucket or store asked for with more copies than the cluster has servers: one
        line naming the setting, not JetStream's error."""
        try:
            yield
        except nats.js.errors.APIError as error:
            if error.err_code in TOO_FEW_SERVERS:
                raise BusSettingsError(_too_many_replicas(self.replicas, error)) from None
            raise

    async def has_stream(self) -> bool:
        """Whether the event stream exists (a stack that never started has none)."""
        try:
            await self._js.stream_info(self._settings.stream)
        except nats.js.errors.NotFoundError:
            return False
        return True

    async def declare_bucket(
        self, bucket: str, *, history: int = 1, ttl_s: float | None = None
    ) -> KeyValue:
        with self._copies_checked():
            return await JetStreamKeyValue.declare(
                self._js,
                bucket,
                replicas=self.replicas,
                history=history,
                ttl_s=ttl_s,
                failover_s=self._settings.publish_timeout_s,
            )

    def bucket(self, bucket: str) -> KeyValue:
        return JetStreamKeyValue.of(self._js, bucket, failover_s=self._settings.publish_timeout_s)

    async def declare_store(self, store: str, *, ttl_s: float | None = None) -> ObjectStore:
        with self._copies_checked():
            return await JetStreamObjectStore.declare(
                self._js,
                store,
                replicas=self.replicas,
                ttl_s=ttl_s,
                failover_s=self._settings.publish_timeout_s,
            )

    def store(self, store: str) -> ObjectStore:
        return JetStreamObjectStore.of(self._js, store, failover_s=self._settings.publish_timeout_s)

    async def listen(self, subject: str, on_message: OnMessage) -> Listening:
        async def heard(msg: Msg) -> None:
            await on_message(msg.data)

        return _Listening(await self._nc.subscribe(subject, cb=heard))

    async def request(self, subject: str, data: bytes, *, timeout_s: float) -> bytes:
        try:
            reply = await self._nc.request(subject, data, timeout=timeout_s)
        except nats.errors.NoRespondersError:
            raise NoAnswerError(subject) from None
        except nats.errors.TimeoutError:
            msg = f"no answer on {subject} within {timeout_s:g} s"
            raise TimeoutError(msg) from None
        data_: bytes = reply.data
        return data_

    async def serve(self, subject: str, on_ask: OnAsk, *, group: str) -> Listening:
        async def asked(msg: Msg) -> None:
            await on_ask(Asked(subject=msg.subject, reply=msg.reply or None, data=msg.data))

        return _Listening(await self._nc.subscribe(subject, queue=group, cb=asked))

    async def answer(self, asked: Asked, data: bytes) -> None:
        if asked.reply:
            # An answer that cannot go out now is dropped: the asker's request times out.
            with contextlib.suppress(*_TRANSIENT):
                await self._nc.publish(asked.reply, data)

    async def close(self) -> None:
        """Flush what is buffered and close; in-flight handlers must have finished."""
        self._closing = True
        if not self._nc.is_closed:
            try:
                await self._nc.drain()
            except _TRANSIENT:
                await self._nc.close()

    async def publish(self, event: Event[Any]) -> PublishAck:
        subject = subject_of(event.data, self.prefix)
        return await self.publish_raw(subject, encode(event), {MSG_ID: event.id})

    async def publish_many(self, events: Sequence[Event[Any]]) -> list[PublishAck]:
        """Publish a batch without waiting for each ack in turn: for imports and replays."""
        futures = []
        for event in events:
            subject = subject_of(event.data, self.prefix)
            futures.append(
                await self._js.publish_async(subject, encode(event), headers={MSG_ID: event.id})
            )
        results = await asyncio.gather(*futures, return_exceptions=True)
        acks = []
        for event, result in zip(events, results, strict=True):
            if isinstance(result, BaseException):
                # Lost in a reconnect: publish it again, the id de-duplicates if it landed.
                acks.append(await self.publish(event))
            else:
                acks.append(PublishAck(seq=result.seq, duplicate=bool(result.duplicate)))
        return acks

    async def publish_raw(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> PublishAck:
        deadline = time.monotonic() + self._settings.publish_timeout_s
        delay_s = 0.05
        while True:
            try:
                async with self.permission_checked(subject=subject):
                    ack = await self._js.publish(
                        subject, data, timeout=2, headers=dict(headers or {})
                    )
            except _TRANSIENT:
                # Re-publishing is safe: the message id makes a second copy a duplicate.
                if time.monotonic() + delay_s > deadline:
                    raise
                await asyncio.sleep(delay_s)
                delay_s = min(1.0, delay_s * 2)
            else:
                return PublishAck(seq=ack.seq, duplicate=bool(ack.duplicate))

    async def consume(self, subscription: Subscription, stop: asyncio.Event) -> None:
        psub = await self._subscribe(subscription)
        # Only a refusal of this pull is this loop's; a handler's refused publish is the
        # handler's own error, running beside it on the same connection.
        doing = f"consume as {subscription.durable}"
        next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self._settings.stream}.{subscription.durable}"
        try:
            async with HandlerTasks(subscription.max_concurrency) as handlers:
                while not stop.is_set():
                    await handlers.wait_for_slot()
                    try:
                        async with self.permission_checked(doing, subject=next_subject):
                            messages = await psub.fetch(handlers.free, timeout=0.5)
                    except (nats.errors.TimeoutError, TimeoutError):
                        continue  # nothing to fetch in this round
                    except _TRANSIENT as error:
                        log.warning(
                            "consumer.fetch_failed", service=subscription.service, error=str(error)
                        )
                        await asyncio.sleep(0.5)
                        continue
                    for msg in messages:
                        handlers.start(self._handle(msg, subscription))
        finally:
            # Leftover pull-status messages would otherwise hold up the connection's drain.
            with contextlib.suppress(*_TRANSIENT):
                await psub.unsubscribe()

    async def _subscribe(self, subscription: Subscription) -> JetStreamContext.PullSubscription:
        config = ConsumerConfig(
            durable_name=subscription.durable,
            filter_subjects=subscription.filter_subjects(self.prefix),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self._settings.ack_wait_s,
            # The consumer counts deliveries; `settle` decides when enough is enough, so
            # the server never silently stops redelivering a message we did not settle.
            max_deliver=-1,
            max_ack_pending=max(1000, subscription.max_concurrency * 4),
        )
        while True:
            try:
                doing = f"consume as {subscription.durable}"
                async with self.permission_checked(doing, subject="$JS.API.CONSUMER.>"):
                    await self._js.add_consumer(self._settings.stream, config)
                    psub = await self._js.pull_subscribe_bind(
                        durable=subscription.durable, stream=self._settings.stream
                    )
                    await self._nc.flush()  # a refused reply subscription shows up here
                    return psub
            except _TRANSIENT as error:
                log.warning(
                    "consumer.create_failed", service=subscription.service, error=str(error)
                )
                await asyncio.sleep(0.5)

    async def _handle(self, msg: Msg, subscription: Subscription) -> None:
        meta = msg.metadata
        delivery = Delivery(
            subject=msg.subject,
            data=msg.data,
            num_delivered=meta.num_delivered,
            stream_seq=meta.sequence.stream,
        )
        outcome = await settle(delivery, subscription, self.prefix)
        try:
            match outcome:
                case Ack():
                    await msg.ack()
                case Nak(delay_s=delay_s):
                    await msg.nak(delay=delay_s)
                case DeadLetter():
                    await self.publish_raw(
                        dlq_subject(subscription.service, self.prefix),
                        msg.data,
                        dead_letter_headers(delivery, outcome, subscription.service),
                    )
                    log.warning(
                        "event.dead_lettered",
                        service=subscription.service,
                        subject=delivery.subject,
                        seq=delivery.stream_seq,
                        reason=outcome.reason.value,
                        detail=outcome.detail,
                    )
                    await msg.ack()
        except _TRANSIENT as error:
            # Unsettled: the server redelivers after ack_wait, and the handler is idempotent.
            log.warning("consumer.settle_failed", service=subscription.service, error=str(error))

    async def read(self, subject: str, *, after_seq: int = 0) -> list[StoredMessage]:
        """What the stream holds on `subject`, oldest first; only what it stored after the
        sequence `after_seq` when given (where an earlier read ended)."""
        doing = f"read {subject} from the stream"
        async with self.permission_checked(doing, subject="$JS.API.CONSUMER.>"):
            return await self._read(subject, after_seq)

    async def _read(self, subject: str, after_seq: int = 0) -> list[StoredMessage]:
        # A consumer of its own for this read, deleted after it: polling readers must not
        # leave ephemeral consumers behind until the server's limit is reached.
        stream = self._settings.stream
        start = _From(seq=after_seq + 1) if after_seq > 0 else _From()
        created = await self._new_reading_consumer(start, filter_subject=subject)
        name = created.name
        stored: list[StoredMessage] = []
        try:
            psub = await self._js.pull_subscribe_bind(durable=name, stream=stream)
            # How many are left comes with the consumer, then with each message: no round
            # trip to ask it (a read of the cost ledger makes a dozen of these at once).
            pending = created.num_pending or 0
            try:
                unavailable = 0
                while pending:
                    try:
                        batch = await psub.fetch(min(pending, 1000), timeout=2)
                    except (nats.errors.TimeoutError, TimeoutError):
                        break
                    except nats.js.errors.ServiceUnavailableError:
                        # No responder yet: a cluster still placing the consumer (or
                        # electing the stream's leader after a server's loss).
                        unavailable += 1
                        if unavailable > READ_UNAVAILABLE_TRIES:
                            raise
                        await asyncio.sleep(0.2)
                        continue
                    stored.extend(
                        StoredMessage(
                            seq=m.metadata.sequence.stream,
                            subject=m.subject,
                            data=m.data,
                            headers=dict(m.headers or {}),
                        )
                        for m in batch
                    )
                    pending = batch[-1].metadata.num_pending if batch else 0
            finally:
                await psub.unsubscribe()
        finally:
            with contextlib.suppress(*_TRANSIENT, nats.js.errors.NotFoundError):
                await self._js.delete_consumer(stream, name)
        return stored

    async def read_window(
        self,
        subjects: Sequence[str],
        *,
        since: datetime | None,
        until: datetime | None = None,
    ) -> AsyncGenerator[StreamRecord, None]:
        """The messages on `subjects` that the stream stored from `since` (its first message
        when None) until just before `until` (when the read began, when None), oldest first.

        Reads that part of the stream only: a consumer of its own starts at `since` by the
        stream's time index and stops at `until` or when it has caught up, and is deleted
        after. Iterate it inside `contextlib.aclosing` when you may stop before the end."""
        if not subjects:
            return  # a consumer with no filter would read every subject
        end = until or datetime.now(UTC)
        name = await self._reading_consumer(subjects, _From(time=since))
        try:
            psub = await self._js.pull_subscribe_bind(durable=name, stream=self._settings.stream)
            try:
                async with self.permission_checked(f"read {', '.join(subjects)}"):
                    info = await psub.consumer_info()
                pending = info.num_pending or 0
                while pending:
                    try:
                        async with self.permission_checked(f"read {', '.join(subjects)}"):
                            batch = await psub.fetch(min(pending, _READ_BATCH), timeout=5)
                    except (nats.errors.TimeoutError, TimeoutError):
                        return  # nothing more came: what was pending has gone (max age)
                    for msg in batch:
                        record = _record(msg)
                        if record.stored_at >= end:
                            return
                        yield record
                        pending = msg.metadata.num_pending
            finally:
                with contextlib.suppress(*_TRANSIENT):
                    await psub.unsubscribe()
        finally:
            await self._delete_reading_consumer(name)

    async def follow(
        self, subjects: Sequence[str], stop: asyncio.Event, *, since: datetime | None = None
    ) -> AsyncGenerator[StreamRecord, None]:
        """The messages on `subjects` as the stream stores them (from `since` when given, else
        from now on), oldest first, until `stop` is set. Survives a server restart: the
        reading consumer is made again after the last message seen."""
        if not subjects:
            return  # a consumer with no filter would follow every subject
        start = _From(time=since) if since is not None else _From(new=True)
        while not stop.is_set():
            try:
                name = await self._reading_consumer(subjects, start)
            except _TRANSIENT as error:
                log.warning("follow.consumer_failed", error=str(error))
                await asyncio.sleep(0.5)
                continue
            psub: JetStreamContext.PullSubscription | None = None
            try:
                psub = await self._js.pull_subscribe_bind(
                    durable=name, stream=self._settings.stream
                )
                while not stop.is_set():
                    try:
                        async with self.permission_checked(f"follow {', '.join(subjects)}"):
                            batch = await psub.fetch(_READ_BATCH, timeout=0.5)
                    except (nats.errors.TimeoutError, TimeoutError):
                        continue
                    for msg in batch:
                        record = _record(msg)
                        start = _From(seq=record.seq + 1)
                        yield record
            except (*_TRANSIENT, nats.js.errors.NotFoundError) as error:
                # The server restarted or dropped the consumer: start again after the last.
                log.warning("follow.interrupted", error=str(error))
                await asyncio.sleep(0.5)
            finally:
                if psub is not None:
                    # Leftover pull-status messages would hold up the connection's drain.
                    with contextlib.suppress(*_TRANSIENT):
                        await psub.unsubscribe()
                await self._delete_reading_consumer(name)

    async def consumer_filter(self, durable: str) -> tuple[str, ...] | None:
        """The subjects a durable consumer of the stream takes; None if it has none such."""
        async with self.permission_checked(f"look up the consumer {durable}"):
            try:
                info = await self._js.consumer_info(self._settings.stream, durable)
            except nats.js.errors.NotFoundError:
                return None
        config = info.config
        if config.filter_subjects:
            return tuple(config.filter_subjects)
        return (config.filter_subject,) if config.filter_subject else ()

    async def durable_consumers(self) -> list[str]:
        """The names of the stream's durable consumers: the services and bots reading it."""
        async with self.permission_checked("list the stream's consumers"):
            infos = await self._js.consumers_info(self._settings.stream)
        return sorted(i.config.durable_name for i in infos if i.config.durable_name)

    async def _reading_consumer(self, subjects: Sequence[str], start: _From) -> str:
        if start.time is not None and len(subjects) > 1:
            # nats-server 2.15 starts a consumer of several subjects by time past the first
            # message of a subject stored before that time too; by sequence it does not.
            first = await self._first_seq_since(start.time)
            start = start if first is None else _From(seq=first)
        filters: dict[str, Any] = (
            {"filter_subject": subjects[0]}
            if len(subjects) == 1
            else {"filter_subjects": list(subjects)}
        )
        async with self.permission_checked(f"read {', '.join(subjects)} from the stream"):
            created = await self._new_reading_consumer(start, **filters)
        return created.name

    async def _new_reading_consumer(self, start: _From, **filters: Any) -> ConsumerInfo:
        """A consumer for one read: not acked, one copy in memory on the stream's leader (a
        read lives for seconds, and a replicated consumer waits for a leader of its own
        first), dropped by the server 30 s after its reader vanishes.

        Made through a failover under a new name each try: a create the cluster placed on a
        server lost meanwhile is answered by nobody, however often the same name is asked
        for again (one left half-made goes after its inactive threshold)."""

        async def create() -> ConsumerInfo:
            config = ConsumerConfig(
                name=f"read-{secrets.token_hex(6)}",
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30,
                mem_storage=True,
                num_replicas=1,
                **filters,
                **start.config(),
            )
            return await self._js.add_consumer(self._settings.stream, config)

        return await through_failover(self._settings.publish_timeout_s, create)

    async def _first_seq_since(self, since: datetime) -> int | None:
        """The sequence of the first message stored at or after `since`, or the next one to
        come: what a consumer of the whole stream started at that time reports (None if it
        does not say)."""
        async with self.permission_checked("find where a time window starts"):
            info = await self._new_reading_consumer(_From(time=since))
        await self._delete_reading_consumer(info.name)
        return None if info.delivered is None else info.delivered.stream_seq + 1

    async def _delete_reading_consumer(self, name: str) -> None:
        with contextlib.suppress(*_TRANSIENT, nats.js.errors.NotFoundError):
            await self._js.delete_consumer(self._settings.stream, name)

    async def _on_error(self, error: Exception) -> None:
        refusal = _refusal(error)
        if refusal is not None:
            for check in list(self._checks):
                if check.concerns(refusal):
                    check.refuse(refusal)
            log.error(
                "nats.permission_denied",
                user=self.user,
                refused=refusal.refused.value,
                subject=refusal.subject,
            )
            return
        if self._authentication_failed is not None:
            self._connect_error = error
        if isinstance(error, ConnectionRefusedError):
            self._refusals += 1
        # Final once every server of the list refused (one of a cluster may be down).
        if (
            isinstance(error, ConnectionRefusedError)
            and self._refused is not None
            and not self._refused.done()
            and self._refusals >= len(self._settings.nats_servers)
        ):
            self._refused.set_result(error)
        if _is_authentication_failure(error):
            failed = self._authentication_failed
            if failed is not None and not failed.done():
                failed.set_result(str(error).removeprefix("nats: ").strip("'"))
            log.error("nats.authentication_failed", user=self.user, error=str(error))
            return
        # Refused connections while the server restarts are expected and already reported
        # by the disconnection; repeating them every second says nothing new.
        if not self._closing and not isinstance(error, ConnectionRefusedError):
            log.warning("nats.error", error=str(error))

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("nats.disconnected", url=self._settings.nats_url)

    async def _on_reconnected(self) -> None:
        log.info("nats.reconnected", url=self._settings.nats_url)


class _Listening:
    def __init__(self, subscription: NatsSubscription) -> None:
        self._subscription = subscription

    async def stop(self) -> None:
        with contextlib.suppress(*_TRANSIENT, nats.errors.BadSubscriptionError):
            await self._subscription.unsubscribe()


def _record(msg: Msg) -> StreamRecord:
    meta = msg.metadata
    return StreamRecord(
        seq=meta.sequence.stream,
        subject=msg.subject,
        data=msg.data,
        headers=dict(msg.headers or {}),
        stored_at=meta.timestamp,
    )


def _tls_context(settings: BusSettings) -> ssl.SSLContext | None:
    """A context for a private CA or a client certificate; None lets nats-py use the
    system's trust store for a `tls://` URL (or a server that asks for TLS)."""
    if settings.nats_tls_ca_file is None and settings.nats_tls_cert_file is None:
        return None
    context = ssl.create_default_context(
        cafile=str(settings.nats_tls_ca_file) if settings.nats_tls_ca_file else None
    )
    if settings.nats_tls_cert_file is not None and settings.nats_tls_key_file is not None:
        context.load_cert_chain(settings.nats_tls_cert_file, settings.nats_tls_key_file)
    return context
