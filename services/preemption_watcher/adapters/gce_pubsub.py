"""The `gce-pubsub` source: GCE preemption audit log entries, which a Cloud Logging sink
publishes to a Pub/Sub topic, pulled from its subscription with the official client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Collection, Sequence
from datetime import timedelta
from typing import TypeVar

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
import structlog
from google.api_core.exceptions import DeadlineExceeded, GoogleAPIError
from google.auth.exceptions import GoogleAuthError
from google.cloud.pubsub_v1 import (  # type: ignore[import-untyped]  # no py.typed marker
    SubscriberClient as PubSubSubscriberClient,
)
from google.pubsub_v1 import SubscriberClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport
from google.pubsub_v1.types import ReceivedMessage

from services.preemption_watcher.model import NodeSignal
from services.preemption_watcher.payloads.gce_logging import (
    GCE_PREEMPTION_NOTICE,
    MalformedEntryError,
    read_preemption,
)

log = structlog.get_logger()
T = TypeVar("T")


class PubSubError(OSError):
    """A Pub/Sub call failed; the message says which and on what subscription. The runtime
    starts the source again after a pause."""


class PubSubNoticeSource:
    """`SignalSource` over a Pub/Sub subscription fed by a sink of preemption log entries.

    Semantics:
    - Unary `Pull` of up to `max_messages`, each waiting at most `pull_timeout_s` (in a
      worker thread), so a set `stop` ends the iteration within about that time.
    - A signal's message is acked once the consumer asks for the next signal; the messages
      that are not preemptions, or can never be read (a warning with the message id and the
      reason), are acked without a signal, with the next ack.
    - When the iteration ends (stop, an error, or the consumer closing it), messages pulled
      but not acked are released (ack deadline 0), so another pull gets them at once
      instead of after the subscription's ack deadline. A consumer that dies without
      closing the iteration gets them again after the ack deadline: at least once.
    - Pub/Sub and Google auth errors leave as `PubSubError` (an `OSError`); calls are not
      retried here, the runtime restarts the source.
    """

    name = "gce-pubsub"

    def __init__(
        self,
        client: SubscriberClient,
        subscription: str,
        *,
        notice: timedelta = GCE_PREEMPTION_NOTICE,
        max_messages: int = 10,
        pull_timeout_s: float = 2.0,
        call_timeout_s: float = 10.0,
    ) -> None:
        self._client = client
        self._subscription = subscription
        self._notice = notice
        self._max_messages = max_messages
        self._pull_timeout_s = pull_timeout_s
        self._call_timeout_s = call_timeout_s

    async def signals(self, stop: asyncio.Event) -> AsyncGenerator[NodeSignal, None]:
        held: set[str] = set()  # ack ids pulled and not acked: released at the end
        try:
            while not stop.is_set():
                received = await self._pull()
                held.update(m.ack_id for m in received)
                done: list[str] = []
                for message in received:
                    if stop.is_set():
                        break
                    signal = self._read(message)
                    if signal is not None:
                        yield signal
                        # The consumer asks for the next signal: it is done with this one.
                    done.append(message.ack_id)
                    if signal is not None:
                        await self._acknowledge(done, held)
                        done = []
                await self._acknowledge(done, held)
        finally:
            await self._release(held)

    def _read(self, received: ReceivedMessage) -> NodeSignal | None:
        message = received.message
        try:
            signal = read_preemption(message.data, notice=self._notice)
        except MalformedEntryError as error:
            log.warning(
                "pubsub.message_malformed",
                subscription=self._subscription,
                message_id=message.message_id,
                reason=str(error),
            )
            return None
        if signal is None:
            log.debug(
                "pubsub.message_skipped",
                subscription=self._subscription,
                message_id=message.message_id,
            )
        return signal

    async def _pull(self) -> Sequence[ReceivedMessage]:
        def pull() -> Sequence[ReceivedMessage]:
            try:
                response = self._client.pull(
                    subscription=self._subscription,
                    max_messages=self._max_messages,
                    timeout=self._pull_timeout_s,
                    retry=None,
                )
            except DeadlineExceeded:
                return ()  # nothing came within the pull timeout
            return response.received_messages

        return await asyncio.to_thread(self._call, f"pulling from {self._subscription}", pull)

    async def _acknowledge(self, ack_ids: list[str], held: set[str]) -> None:
        if not ack_ids:
            return
        await asyncio.to_thread(
            self._call,
            f"acknowledging {len(ack_ids)} messages on {self._subscription}",
            lambda: self._client.acknowledge(
                subscription=self._subscription,
                ack_ids=ack_ids,
                timeout=self._call_timeout_s,
                retry=None,
            ),
        )
        held.difference_update(ack_ids)

    async def _release(self, held: Collection[str]) -> None:
        """Best effort: a message not released comes back after its ack deadline anyway."""
        if not held:
            return
        try:
            await asyncio.to_thread(
                self._call,
                f"releasing {len(held)} messages on {self._subscription}",
                lambda: self._client.modify_ack_deadline(
                    subscription=self._subscription,
                    ack_ids=list(held),
                    ack_deadline_seconds=0,
                    timeout=self._call_timeout_s,
                    retry=None,
                ),
            )
        except PubSubError as error:
            log.warning("pubsub.release_failed", subscription=self._subscription, error=str(error))
        else:
            log.debug("pubsub.released", subscription=self._subscription, messages=len(held))

    @staticmethod
    def _call(what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"{what}: {error}"
            raise PubSubError(msg) from error


def connect_subscriber(endpoint: str | None = None) -> SubscriberClient:
    """The official subscriber client (gRPC) with application default credentials; with an
    `endpoint` (`host:port` of a local fake or the emulator), a plain-text channel to it
    that carries no credentials at all: the transport ignores credentials when handed a
    channel, which is also how the client serves `PUBSUB_EMULATOR_HOST`, without setting it.

    The caller closes the client (`close()`, or use it as a context manager)."""
    if endpoint is None:
        client: SubscriberClient = PubSubSubscriberClient()
        return client
    transport = SubscriberGrpcTransport(host=endpoint, channel=grpc.insecure_channel(endpoint))
    client = PubSubSubscriberClient(transport=transport)
    return client
