"""Prometheus metrics every service exports through the runtime."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS_HANDLED = Counter(
    "spotrain_events_handled_total",
    "Events settled by a service's consumer, by outcome (ack, nak, dead_letter).",
    ["service", "type", "outcome"],
)
HANDLER_SECONDS = Histogram(
    "spotrain_event_handler_seconds",
    "Time a handler took for one event.",
    ["service", "type"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
DEAD_LETTERS = Counter(
    "spotrain_dead_letters_total",
    "Messages a service sent to its dead-letter subject, by reason.",
    ["service", "reason"],
)
BUS_CONNECTED = Gauge(
    "spotrain_bus_connected",
    "1 while the service is connected to NATS.",
    ["service"],
)
SERVICE_LEADING = Gauge(
    "spotrain_service_leading",
    "1 while this replica holds its service's lease and does the work that must happen once.",
    ["service", "replica"],
)
