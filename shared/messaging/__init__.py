"""The bus: JetStream in production and tests of I/O, in memory for unit tests."""

from shared.messaging.delivery import (
    DeadLetterReason,
    Handler,
    HandlerWithDeps,
    RedeliveryPolicy,
    RetryLater,
    Subscription,
    Unhandleable,
    bind_routes,
)
from shared.messaging.ports import EventBus, EventPublisher, PublishAck, StoredMessage
from shared.messaging.settings import BusSettings

__all__ = [
    "BusSettings",
    "DeadLetterReason",
    "EventBus",
    "EventPublisher",
    "Handler",
    "HandlerWithDeps",
    "PublishAck",
    "RedeliveryPolicy",
    "RetryLater",
    "StoredMessage",
    "Subscription",
    "Unhandleable",
    "bind_routes",
]
