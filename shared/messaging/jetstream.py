"""The bus on NATS JetStream: one stream, durable pull consumers, explicit acks."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Self

import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from shared.events import Event, all_subjects, dlq_subject, encode, spec_for, subjects_for
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
from shared.messaging.ports import PublishAck, StoredMessage
from shared.messaging.settings import BusSettings

log = structlog.get_logger()

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


class JetStreamBus:
    """`EventBus` on a NATS JetStream stream that captures `<prefix>.>`."""

    def __init__(self, settings: BusSettings) -> None:
        self._nc = Client()
        self._js: JetStreamContext = self._nc.jetstream(timeout=5)
        self._settings = settings
        self._closing = False

    @classmethod
    async def connect(cls, settings: BusSettings, *, name: str) -> Self:
        """Connect, retrying until `connect_timeout_s`; later reconnects are automatic."""
        bus = cls(settings)
        try:
            # nats-py retries the first connection as it retries reconnects: forever, with
            # max_reconnect_attempts=-1; the deadline bounds it.
            await asyncio.wait_for(
                bus._nc.connect(
                    settings.nats_url,
                    name=name,
                    user_credentials=settings.nats_creds_file,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=1,
                    connect_timeout=2,
                    drain_timeout=5,
                    error_cb=bus._on_error,
                    disconnected_cb=bus._on_disconnected,
                    reconnected_cb=bus._on_reconnected,
                ),
                timeout=settings.connect_timeout_s,
            )
        except (*_TRANSIENT, nats.errors.NoServersError) as error:
            bus._closing = True
            with contextlib.suppress(*_TRANSIENT):
                await bus._nc.close()
            msg = f"cannot reach NATS at {settings.nats_url}: {error or type(error).__name__}"
            raise BusUnavailableError(msg) from error
        return bus

    @property
    def prefix(self) -> str:
        return self._settings.subject_prefix

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
            num_replicas=s.stream_replicas,
        )
        try:
            await self._js.stream_info(s.stream)
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(config)
            log.info("stream.created", stream=s.stream)
        else:
            await self._js.update_stream(config)

    async def close(self) -> None:
        """Flush what is buffered and close; in-flight handlers must have finished."""
        self._closing = True
        if not self._nc.is_closed:
            try:
                await self._nc.drain()
            except _TRANSIENT:
                await self._nc.close()

    async def publish(self, event: Event[Any]) -> PublishAck:
        subject = spec_for(type(event.data)).subject(self.prefix)
        return await self.publish_raw(subject, encode(event), {MSG_ID: event.id})

    async def publish_many(self, events: Sequence[Event[Any]]) -> list[PublishAck]:
        """Publish a batch without waiting for each ack in turn: for imports and replays."""
        futures = []
        for event in events:
            subject = spec_for(type(event.data)).subject(self.prefix)
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
                ack = await self._js.publish(subject, data, timeout=2, headers=dict(headers or {}))
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
        try:
            async with HandlerTasks(subscription.max_concurrency) as handlers:
                while not stop.is_set():
                    await handlers.wait_for_slot()
                    try:
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
            filter_subjects=subjects_for(subscription.routes, self.prefix),
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
                await self._js.add_consumer(self._settings.stream, config)
                return await self._js.pull_subscribe_bind(
                    durable=subscription.durable, stream=self._settings.stream
                )
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

    async def read(self, subject: str) -> list[StoredMessage]:
        # A consumer of its own for this read, deleted after it: polling readers must not
        # leave ephemeral consumers behind until the server's limit is reached.
        name = f"read-{secrets.token_hex(6)}"
        stream = self._settings.stream
        await self._js.add_consumer(
            stream,
            ConsumerConfig(
                name=name,
                filter_subject=subject,
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30,
            ),
        )
        stored: list[StoredMessage] = []
        try:
            psub = await self._js.pull_subscribe_bind(durable=name, stream=stream)
            try:
                while pending := (await psub.consumer_info()).num_pending or 0:
                    try:
                        batch = await psub.fetch(min(pending, 1000), timeout=2)
                    except (nats.errors.TimeoutError, TimeoutError):
                        break
                    stored.extend(
                        StoredMessage(
                            seq=m.metadata.sequence.stream,
                            subject=m.subject,
                            data=m.data,
                            headers=dict(m.headers or {}),
                        )
                        for m in batch
                    )
            finally:
                await psub.unsubscribe()
        finally:
            with contextlib.suppress(*_TRANSIENT, nats.js.errors.NotFoundError):
                await self._js.delete_consumer(stream, name)
        return stored

    async def _on_error(self, error: Exception) -> None:
        # Refused connections while the server restarts are expected and already reported
        # by the disconnection; repeating them every second says nothing new.
        if not self._closing and not isinstance(error, ConnectionRefusedError):
            log.warning("nats.error", error=str(error))

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("nats.disconnected", url=self._settings.nats_url)

    async def _on_reconnected(self) -> None:
        log.info("nats.reconnected", url=self._settings.nats_url)
