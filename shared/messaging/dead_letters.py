"""What a dead letter carries: the original bytes untouched, the reason in headers."""

from __future__ import annotations

from shared.messaging.delivery import DeadLetter, Delivery

REASON = "Spotrain-Dlq-Reason"
DETAIL = "Spotrain-Dlq-Detail"
SERVICE = "Spotrain-Dlq-Service"
ORIGINAL_SUBJECT = "Spotrain-Original-Subject"
ORIGINAL_SEQ = "Spotrain-Original-Seq"
DELIVERIES = "Spotrain-Deliveries"
MSG_ID = "Nats-Msg-Id"

_MAX_DETAIL = 1024


def dead_letter_headers(delivery: Delivery, outcome: DeadLetter, service: str) -> dict[str, str]:
    """Headers of the dead letter; its id makes a repeated dead-lettering a duplicate."""
    return {
        MSG_ID: f"dlq-{service}-{delivery.stream_seq}",
        REASON: outcome.reason.value,
        DETAIL: _one_line(outcome.detail),
        SERVICE: service,
        ORIGINAL_SUBJECT: delivery.subject,
        ORIGINAL_SEQ: str(delivery.stream_seq),
        DELIVERIES: str(delivery.num_delivered),
    }


def _one_line(text: str) -> str:
    """Header values cannot hold line breaks, and a reason need not be a novel."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_DETAIL else flat[: _MAX_DETAIL - 3] + "..."
