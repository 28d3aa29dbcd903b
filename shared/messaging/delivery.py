"""From one delivered message to one outcome: ack, nak with a delay, or dead-letter.

Both buses (JetStream and in-memory) settle messages through `settle`, which is why they
pass the same contract tests.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Self, TypeVar

from shared.events import (
    Event,
    EventData,
    InvalidEventError,
    InvalidReason,
    decode,
    spec_for,
    subjects_for,
)
from shared.events.catalog import replay_subject, replay_subjects_for
from shared.logs import deferred_logger

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

# The consumer's side (settling, its metrics and its log context) imports structlog and
# prometheus_client when it runs: the CLI, which only publishes and reads, does without.
log = deferred_logger()

Handler = Callable[[Event[Any]], Awaitable[None]]
DepsT = TypeVar("DepsT")
HandlerWithDeps = Callable[[Event[Any], DepsT], Awaitable[None]]


def bind_routes(
    table: Mapping[type[EventData], HandlerWithDeps[DepsT]], deps: DepsT
) -> dict[type[EventData], Handler]:
    """Give each `on_<event>(event, deps)` of a service's table its dependencies."""

    def bind(handler: HandlerWithDeps[DepsT]) -> Handler:
        async def bound(event: Event[Any]) -> None:
            await handler(event, deps)

        return bound

    return {model: bind(handler) for model, handler in table.items()}


class RetryLater(Exception):  # noqa: N818  # it is an outcome, named as the handler says it
    """Raised by a handler: the event is fine but cannot be handled yet."""

    def __init__(self, delay_s: float, why: str = "") -> None:
        super().__init__(why or f"retry in {delay_s}s")
        self.delay_s = delay_s


class Unhandleable(Exception):  # noqa: N818  # an outcome, like RetryLater
    """Raised by a handler: this event can never be handled; dead-letter it at once."""


class DeadLetterReason(StrEnum):
    """Why a valid event was dead-lettered; an invalid one carries its `InvalidReason`."""

    WRONG_SUBJECT = "wrong-subject"
    NOT_THE_SENDER = "not-the-sender"
    """A request whose payload names another sender than its subject: its owner (or
    canceller) is the one whose credential published it, so the claim is refused."""
    NO_HANDLER = "no-handler"
    UNHANDLEABLE = "unhandleable"
    DELIVERY_LIMIT = "delivery-limit"


def declare_dead_letters(service: str) -> None:
    """Every reason from 0 at start: "no dead letter yet" reads as 0, not as no series."""
    from shared.messaging.metrics import DEAD_LETTERS  # noqa: PLC0415  # see log above

    for reason in (*InvalidReason, *DeadLetterReason):
        DEAD_LETTERS.labels(service, reason.value)


@dataclass(frozen=True)
class RedeliveryPolicy:
    """How often and how patiently a failing handler is retried before dead-lettering."""

    max_deliveries: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0

    def delay_s(self, num_delivered: int) -> float:
        return min(self.max_delay_s, self.base_delay_s * 2.0 ** max(0, num_delivered - 1))


@dataclass(frozen=True)
class Subscription:
    """What one service consumes: a durable consumer and a handler per event type."""

    service: str
    routes: Mapping[type[EventData], Handler]
    max_concurrency: int = 16
    redelivery: RedeliveryPolicy = field(default_factory=RedeliveryPolicy)

    @property
    def durable(self) -> str:
        return self.service

    def filter_subjects(self, prefix: str) -> list[str]:
        """What its consumer takes: each routed event's subject, and the same event's replay
        subject for this service alone (`spotrain events replay --to <service>`). For a
        request, also the subject without a sender, where nothing may be: what comes there
        is dead-lettered with the reason rather than left unread in the stream."""
        unsent = [
            spec_for(model).subject(prefix).removesuffix(".>")
            for model in self.routes
            if spec_for(model).sender_field is not None
        ]
        return sorted({*subjects_for(self.routes, prefix), *unsent}) + replay_subjects_for(
            self.service, self.routes, prefix
        )


class HandlerTasks:
    """The handlers a consumer has running: at most `limit`, awaited when the consumer
    stops, and cancelled if the consumer itself is cancelled (past the grace period),
    in which case their messages are redelivered."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def free(self) -> int:
        return self._limit - len(self._tasks)

    async def wait_for_slot(self) -> None:
        while self.free <= 0:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)

    def start(self, handling: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(handling)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            for task in self._tasks:
                task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)


@dataclass(frozen=True)
class Delivery:
    """One message as a consumer received it, whatever the bus."""

    subject: str
    data: bytes
    num_delivered: int
    stream_seq: int


@dataclass(frozen=True)
class Ack:
    pass


@dataclass(frozen=True)
class Nak:
    delay_s: float


@dataclass(frozen=True)
class DeadLetter:
    reason: InvalidReason | DeadLetterReason
    detail: str


Outcome = Ack | Nak | DeadLetter


async def settle(delivery: Delivery, subscription: Subscription, prefix: str) -> Outcome:
    """Decode, validate and handle one delivery; never raises for the message's sake."""
    from shared.messaging.metrics import DEAD_LETTERS  # noqa: PLC0415  # see log above

    outcome, event_type = await _settle(delivery, subscription, prefix)
    _events_handled(subscription.service, event_type, _OUTCOME_LABELS[type(outcome)]).inc()
    if isinstance(outcome, DeadLetter):
        DEAD_LETTERS.labels(subscription.service, outcome.reason.value).inc()
    return outcome


_OUTCOME_LABELS: dict[type[Outcome], str] = {Ack: "ack", Nak: "nak", DeadLetter: "dead_letter"}


async def _settle(
    delivery: Delivery, subscription: Subscription, prefix: str
) -> tuple[Outcome, str]:
    policy = subscription.redelivery
    if delivery.num_delivered > policy.max_deliveries:
        # A message that keeps coming back without an outcome (the process died while
        # handling it) is not given another chance to take the service down.
        limit = f"delivered {delivery.num_delivered} times, limit {policy.max_deliveries}"
        return DeadLetter(DeadLetterReason.DELIVERY_LIMIT, limit), _UNDECODED
    try:
        event = decode(delivery.data)
    except InvalidEventError as error:
        return DeadLetter(error.reason, error.detail), _UNDECODED

    model = type(event.data)
    # A replay copy is the stored event re-delivered to this service alone: its envelope's
    # type names the handler, as on the original subject.
    replayed = delivery.subject == replay_subject(subscription.service, model, prefix)
    if not replayed and (letter := _misplaced(event, delivery.subject, prefix)) is not None:
        return letter, event.type
    handler = subscription.routes.get(model)
    if handler is None:
        detail = f"{subscription.service} has no handler for {event.type}"
        return DeadLetter(DeadLetterReason.NO_HANDLER, detail), event.type

    # Each delivery runs in its own task, hence its own context: what is bound here reaches
    # every log line of the handler and is gone when the task ends.
    from structlog.contextvars import bind_contextvars  # noqa: PLC0415  # see log above

    bind_contextvars(
        service=subscription.service,
        event_id=event.id,
        event_type=event.type,
        job_id=getattr(event.data, "job_id", None),
    )
    if replayed:
        bind_contextvars(replayed=True)
    started = time.perf_counter()
    try:
        await handler(event)
    except RetryLater as retry:
        delay_s, why = retry.delay_s, str(retry)
        log.info("handler.retry_later", delay_s=delay_s, why=why)
    except Unhandleable as error:
        return DeadLetter(DeadLetterReason.UNHANDLEABLE, str(error)), event.type
    except Exception as error:  # any handler bug becomes a retry, then a dead letter
        delay_s, why = policy.delay_s(delivery.num_delivered), f"{type(error).__name__}: {error}"
        log.exception("handler.failed", delivery=delivery.num_delivered)
    else:
        return Ack(), event.type
    finally:
        _handler_seconds(subscription.service, event.type).observe(time.perf_counter() - started)

    if delivery.num_delivered >= policy.max_deliveries:
        detail = f"failed {delivery.num_delivered} times, last: {why}"
        return DeadLetter(DeadLetterReason.DELIVERY_LIMIT, detail), event.type
    return Nak(delay_s), event.type


_UNDECODED = "undecoded"


# Looking a metric child up by its labels costs more than handling a small event; the set
# of (service, type, outcome) is small and fixed, so each child is looked up once.
@functools.cache
def _events_handled(service: str, event_type: str, outcome: str) -> Counter:
    from shared.messaging.metrics import EVENTS_HANDLED  # noqa: PLC0415  # see log above

    return EVENTS_HANDLED.labels(service, event_type, outcome)


@functools.cache
def _handler_seconds(service: str, event_type: str) -> Histogram:
    from shared.messaging.metrics import HANDLER_SECONDS  # noqa: PLC0415  # see log above

    return HANDLER_SECONDS.labels(service, event_type)


def _misplaced(event: Event[Any], subject: str, prefix: str) -> DeadLetter | None:
    """Why an event may not be taken from the subject it came on, if it may not."""
    spec = spec_for(type(event.data))
    if spec.sender_field is None:
        if subject == spec.subject(prefix):
            return None
        detail = f"{event.type} belongs on {spec.subject(prefix)}, not {subject}"
        return DeadLetter(DeadLetterReason.WRONG_SUBJECT, detail)
    claimed = getattr(event.data, spec.sender_field)
    sender = spec.sender_on(subject, prefix)
    if sender is None:
        detail = f"{event.type} belongs on {spec.subject_of(event.data, prefix)}, not {subject}"
        return DeadLetter(DeadLetterReason.WRONG_SUBJECT, detail)
    if sender != claimed:
        detail = (
            f"{event.type} sent as {sender} names {claimed} as its {spec.sender_field}: "
            f"a request is its sender's own"
        )
        return DeadLetter(DeadLetterReason.NOT_THE_SENDER, detail)
    return None
