"""The `gce-pubsub` source: GCE preemption audit log entries, which a Cloud Logging sink
publishes to a Pub/Sub topic, pulled from its subscription with the official client."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable
from datetime import timedelta
from typing import TypeVar

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
import structlog
from google.api_core.exceptions import GoogleAPIError
from google.auth.exceptions import GoogleAuthError
from google.cloud.pubsub_v1 import (  # type: ignore[import-untyped]  # no py.typed marker
    SubscriberClient,
)
from google.cloud.pubsub_v1.subscriber.futures import (  # type: ignore[import-untyped]
    StreamingPullFuture,
)
from google.cloud.pubsub_v1.subscriber.message import (  # type: ignore[import-untyped]
    Message,
)
from google.cloud.pubsub_v1.types import (  # type: ignore[import-untyped]
    FlowControl,
)
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

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


class _Ended:
    """The stream ended without an error (it was cancelled)."""


class _Handover:
    """Messages from the client's threads to the iteration's loop. Once closed, what still
    comes is kept aside, to be released with the rest once the stream is closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: asyncio.Queue[Message | BaseException | _Ended] = asyncio.Queue()
        self._lock = threading.Lock()  # a handover and the closing never cross
        self._closed = False
        self.late: list[Message] = []
        """Received after the close: read only once the stream is closed."""

    def put(self, item: Message | BaseException | _Ended) -> None:
        with self._lock:
            if self._closed:
                if isinstance(item, Message):
                    self.late.append(item)
                return
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                self._loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def close(self) -> list[Message]:
        """No more handovers; the messages handed over and not yet taken."""
        with self._lock:
            self._closed = True
        await asyncio.sleep(0)  # what was handed over before is on its way: let it arrive
        left = []
        while not self.queue.empty():
            if isinstance(item := self.queue.get_nowait(), Message):
                left.append(item)
        return left


class PubSubNoticeSource:
    """`SignalSource` over a Pub/Sub subscription fed by a sink of preemption log entries.

    Semantics:
    - One StreamingPull through the client's own subscriber (`subscribe`), which keeps a
      stream open, reconnects it when the server ends it, and extends the lease of every
      message it holds (by `lease_extension_s` at a time) until it is acked or released,
      up to `max_lease_s`: a message is not redelivered while it is being handled, however
      long that takes. At most `max_messages` are held at a time.
    - A signal's message is acked once the consumer asks for the next signal; the messages
      that are not preemptions, or can never be read (a warning with the message id and the
      reason), are acked without a signal.
    - When the iteration ends (stop, an error, or the consumer closing it), the messages
      received but not acked are released (ack deadline 0) once the stream is closed, so
      another pull gets them at once. A consumer that dies without closing the iteration
      leaves them to the subscription's ack deadline: at least once.
    - A stream that fails for good (the subscription missing, credentials refused) ends the
      iteration with `PubSubError` (an `OSError`); the runtime starts the source again.
    """

    name = "gce-pubsub"

    def __init__(
        self,
        client: SubscriberClient,
        subscription: str,
        *,
        notice: timedelta = GCE_PREEMPTION_NOTICE,
        max_messages: int = 10,
        max_lease_s: float = 600.0,
        lease_extension_s: int = 10,
        close_timeout_s: float = 10.0,
    ) -> None:
        self._client = client
        self._subscription = subscription
        self._notice = notice
        # Short extensions, renewed often: a watcher that dies holding a notice lets another
        # have it within `lease_extension_s`, well inside the notice's 30 s.
        self._flow = FlowControl(
            max_messages=max_messages,
            max_lease_duration=max_lease_s,
            max_duration_per_lease_extension=lease_extension_s,
        )
        self._close_timeout_s = close_timeout_s

    async def signals(self, stop: asyncio.Event) -> AsyncGenerator[NodeSignal, None]:
        handover = _Handover(asyncio.get_running_loop())
        queue, put = handover.queue, handover.put

        def ended(future: StreamingPullFuture) -> None:
            error = None if future.cancelled() else future.exception()
            put(error if error is not None else _Ended())

        stream = await asyncio.to_thread(
            self._call,
            f"pulling from {self._subscription}",
            lambda: self._client.subscribe(self._subscription, put, flow_control=self._flow),
        )
        stream.add_done_callback(ended)
        held: list[Message] = []  # received and not acked: released at the end
        stopped = asyncio.ensure_future(stop.wait())
        got: asyncio.Future[Message | BaseException | _Ended] | None = None
        try:
            while not stop.is_set():
                got = asyncio.ensure_future(queue.get())
                await asyncio.wait({got, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    break
                item = got.result()
                if isinstance(item, _Ended):
                    return
                if isinstance(item, BaseException):
                    msg = f"pulling from {self._subscription}: {item}"
                    raise PubSubError(msg) from item
                held.append(item)
                signal = self._read(item)
                if signal is not None:
                    yield signal
                    # The consumer asks for the next signal: it is done with this one.
                item.ack()
                held.remove(item)
        finally:
            for waiting in (got, stopped):
                if waiting is not None:
                    waiting.cancel()
            held += await handover.close()
            stream.cancel()  # flushes the acks above, stops the leases, closes the stream
            with contextlib.suppress(Exception):
                await asyncio.to_thread(stream.result, timeout=self._close_timeout_s)
            # Released only now: a release while the stream was open could come straight
            # back on it, and stay leased to a stream that is going.
            await self._release(held + handover.late)

    async def _release(self, messages: list[Message]) -> None:
        """Ack deadline 0 for `messages`, so another pull gets them at once; on failure
        they come back at their lease's end instead."""
        if not messages:
            return
        try:
            await asyncio.to_thread(
                self._client.modify_ack_deadline,
                subscription=self._subscription,
                ack_ids=[message.ack_id for message in messages],
                ack_deadline_seconds=0,
                timeout=self._close_timeout_s,
            )
        except (GoogleAPIError, GoogleAuthError) as error:
            log.warning(
                "pubsub.release_failed",
                subscription=self._subscription,
                messages=len(messages),
                reason=str(error),
            )
            return
        log.debug("pubsub.released", subscription=self._subscription, messages=len(messages))

    def _read(self, received: Message) -> NodeSignal | None:
        try:
            signal = read_preemption(received.data, notice=self._notice)
        except MalformedEntryError as error:
            log.warning(
                "pubsub.message_malformed",
                subscription=self._subscription,
                message_id=received.message_id,
                reason=str(error),
            )
            return None
        if signal is None:
            log.debug(
                "pubsub.message_skipped",
                subscription=self._subscription,
                message_id=received.message_id,
            )
        return signal

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
        client: SubscriberClient = SubscriberClient()
        return client
    transport = SubscriberGrpcTransport(host=endpoint, channel=grpc.insecure_channel(endpoint))
    client = SubscriberClient(transport=transport)
    return client
