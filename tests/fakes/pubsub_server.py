"""A local fake of Pub/Sub's Subscriber gRPC service (StreamingPull, Pull, Acknowledge,
ModifyAckDeadline) for one subscription, for the real `SubscriberClient` pointed at it over
an insecure channel.

Like the real one where tests depend on it (cloud.google.com/pubsub/docs/pull, "StreamingPull
API" and "lease management"; google/pubsub/v1/pubsub.proto): a message stays until acked; a
delivered message is leased for the ack deadline (the stream's `stream_ack_deadline_seconds`,
10 to 600, or the subscription's for a unary pull), then delivered again with a new ack id
unless a `ModifyAckDeadline` extends its lease; an ack with a stale ack id does nothing;
`ModifyAckDeadline` to 0 releases a message at once; a stream delivers no more than its
`max_outstanding_messages` unacked at a time; a unary pull with nothing to deliver waits for
a message until shortly before the client's deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from google.protobuf import empty_pb2  # type: ignore[import-untyped]  # no stubs installed
from google.pubsub_v1.types import (
    AcknowledgeRequest,
    ModifyAckDeadlineRequest,
    PubsubMessage,
    PullRequest,
    PullResponse,
    ReceivedMessage,
    StreamingPullRequest,
    StreamingPullResponse,
)

SERVICE = "google.pubsub.v1.Subscriber"
_POLL_S = 0.02
"""How often a waiting pull looks again: leases expire without anyone saying so."""

Request = TypeVar("Request")
Reply = TypeVar("Reply")


@dataclass
class _Message:
    message_id: str
    data: bytes
    attributes: dict[str, str]
    published_at: datetime
    ack_id: str | None = None
    """The ack id of its latest delivery; older ones no longer ack it."""
    leased_until: float | None = None
    """time.monotonic() when its lease ends and it may be delivered again."""
    deliveries: int = 0
    acked: bool = False


@dataclass
class FakeSubscription:
    """One subscription's messages and what clients did with them."""

    name: str
    """`projects/P/subscriptions/S`; a call for another subscription gets NOT_FOUND."""
    ack_deadline_s: float = 10.0
    max_wait_s: float = 10.0
    """How long a pull waits for a message at most, if the client's deadline is later."""
    endpoint: str = ""
    """`127.0.0.1:port`, set by `serve_fake_pubsub`."""
    acks: list[str] = field(default_factory=list)
    """Message ids acked, in order (each once, though acked again)."""
    released: list[str] = field(default_factory=list)
    """Message ids released with `ModifyAckDeadline(0)`, in order."""
    calls: list[str] = field(default_factory=list)
    """The methods called, in order."""
    extended: list[tuple[str, int]] = field(default_factory=list)
    """(message id, seconds) of every lease extension (`ModifyAckDeadline` above 0)."""
    _messages: dict[str, _Message] = field(default_factory=dict, init=False)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), init=False)
    _changed: threading.Condition = field(default_factory=threading.Condition, init=False)

    def publish(self, data: bytes, attributes: Mapping[str, str] | None = None) -> str:
        """Adds a message, as a publisher to the subscription's topic would; its id."""
        with self._changed:
            message_id = str(next(self._ids))
            self._messages[message_id] = _Message(
                message_id, data, dict(attributes or {}), datetime.now(UTC)
            )
            self._changed.notify_all()
        return message_id

    def deliveries(self, message_id: str) -> int:
        """How many times the message was delivered."""
        with self._changed:
            return self._messages[message_id].deliveries

    def unacked(self) -> list[str]:
        with self._changed:
            return [m.message_id for m in self._messages.values() if not m.acked]

    # --- the service ---------------------------------------------------------------------

    def pull(self, request: PullRequest, context: Any) -> PullResponse:
        self._called("Pull", request.subscription, context)
        if request.max_messages <= 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_messages must be positive")
        wait_s = self.max_wait_s
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, remaining - 0.05)
        until = time.monotonic() + wait_s
        with self._changed:
            while True:
                ready = self._ready(request.max_messages)
                if ready or time.monotonic() >= until or not context.is_active():
                    break
                self._changed.wait(_POLL_S)
            return PullResponse(received_messages=[self._deliver(m) for m in ready])

    def streaming_pull(
        self, requests: Iterator[StreamingPullRequest], context: Any
    ) -> Iterator[StreamingPullResponse]:
        first = next(requests, None)
        if first is None:
            return  # the client went before it asked for anything
        self._called("StreamingPull", first.subscription, context)
        if not 10 <= first.stream_ack_deadline_seconds <= 600:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "stream_ack_deadline_seconds is 10 to 600"
            )
        lease_s = float(first.stream_ack_deadline_seconds)
        most = first.max_outstanding_messages or 1000
        sent: dict[str, _Message] = {}  # ack id -> message, delivered on this stream

        def read() -> None:
            # Acks and lease changes may also come on the stream (the client sends them
            # as unary calls, but the protocol allows both).
            with contextlib.suppress(grpc.RpcError):  # the client cancelled the stream
                for request in requests:
                    with self._changed:
                        self._ack(request.ack_ids)
                        for ack_id, seconds in zip(
                            request.modify_deadline_ack_ids,
                            request.modify_deadline_seconds,
                            strict=False,
                        ):
                            self._modify([ack_id], seconds)

        threading.Thread(target=read, name="fake-pubsub-stream", daemon=True).start()
        while context.is_active():
            with self._changed:
                now = time.monotonic()
                outstanding = sum(
                    1
                    for ack_id, m in sent.items()
                    if m.ack_id == ack_id and not m.acked and (m.leased_until or 0) > now
                )
                ready = self._ready(most - outstanding) if outstanding < most else []
                if not ready:
                    self._changed.wait(_POLL_S)
                    continue
                delivered = [self._deliver(m, lease_s) for m in ready]
                sent.update({d.ack_id: self._messages[d.message.message_id] for d in delivered})
            yield StreamingPullResponse(received_messages=delivered)

    def acknowledge(self, request: AcknowledgeRequest, context: Any) -> empty_pb2.Empty:
        self._called("Acknowledge", request.subscription, context)
        with self._changed:
            self._ack(request.ack_ids)
        return empty_pb2.Empty()

    def _ack(self, ack_ids: Iterable[str]) -> None:
        for message in self._leased(ack_ids):
            if not message.acked:
                message.acked = True
                self.acks.append(message.message_id)

    def modify_ack_deadline(
        self, request: ModifyAckDeadlineRequest, context: Any
    ) -> empty_pb2.Empty:
        self._called("ModifyAckDeadline", request.subscription, context)
        if not 0 <= request.ack_deadline_seconds <= 600:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ack_deadline_seconds is 0 to 600")
        with self._changed:
            self._modify(request.ack_ids, request.ack_deadline_seconds)
        return empty_pb2.Empty()

    def _modify(self, ack_ids: Iterable[str], seconds: int) -> None:
        for message in self._leased(ack_ids):
            if message.acked:
                continue
            message.leased_until = time.monotonic() + seconds
            if seconds == 0:
                self.released.append(message.message_id)
            else:
                self.extended.append((message.message_id, seconds))
        self._changed.notify_all()

    def _called(self, method: str, subscription: str, context: Any) -> None:
        self.calls.append(method)
        if subscription != self.name:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"Resource not found (resource={subscription.rsplit('/', 1)[-1]}).",
            )

    def _ready(self, limit: int) -> list[_Message]:
        now = time.monotonic()
        ready = (
            m
            for m in self._messages.values()
            if not m.acked and (m.leased_until is None or m.leased_until <= now)
        )
        return list(itertools.islice(ready, limit))

    def _deliver(self, message: _Message, lease_s: float | None = None) -> ReceivedMessage:
        message.deliveries += 1
        message.ack_id = f"{message.message_id}-{uuid.uuid4().hex}"
        message.leased_until = time.monotonic() + (
            self.ack_deadline_s if lease_s is None else lease_s
        )
        return ReceivedMessage(
            ack_id=message.ack_id,
            message=PubsubMessage(
                data=message.data,
                attributes=message.attributes,
                message_id=message.message_id,
                publish_time=message.published_at,
            ),
        )

    def _leased(self, ack_ids: Iterable[str]) -> list[_Message]:
        """The messages whose latest delivery these ack ids name; stale ids name none."""
        by_ack_id = {m.ack_id: m for m in self._messages.values() if m.ack_id is not None}
        return [by_ack_id[a] for a in ack_ids if a in by_ack_id]


def _unary(
    handle: Callable[[Request, Any], Reply],
    request_type: Any,
    serialize: Callable[[Reply], bytes],
) -> Any:
    return grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=request_type.deserialize, response_serializer=serialize
    )


@contextmanager
def serve_fake_pubsub(subscription: FakeSubscription) -> Iterator[FakeSubscription]:
    """Serves `subscription` with a real gRPC server on 127.0.0.1 at a free port."""
    handlers = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Pull": _unary(subscription.pull, PullRequest, PullResponse.serialize),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                subscription.streaming_pull,
                request_deserializer=StreamingPullRequest.deserialize,
                response_serializer=StreamingPullResponse.serialize,
            ),
            "Acknowledge": _unary(
                subscription.acknowledge, AcknowledgeRequest, empty_pb2.Empty.SerializeToString
            ),
            "ModifyAckDeadline": _unary(
                subscription.modify_ack_deadline,
                ModifyAckDeadlineRequest,
                empty_pb2.Empty.SerializeToString,
            ),
        },
    )
    executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-pubsub")
    server = grpc.server(executor)
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    subscription.endpoint = f"127.0.0.1:{port}"
    try:
        yield subscription
    finally:
        server.stop(grace=None).wait(timeout=5)
        executor.shutdown(wait=True)
