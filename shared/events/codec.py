"""Bytes ↔ events, with a precise reason for everything that is not a valid event."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from shared.events.catalog import CATALOG, known_versions
from shared.events.data import EventData
from shared.events.envelope import Event

MAX_EVENT_BYTES = 64 * 1024
"""Events are facts, not payloads: large things travel in the object store by reference."""

_TYPE_PATTERN = re.compile(r"^spotrain\.([a-z_]+)\.([a-z_]+)\.v(\d+)$")


class InvalidReason(StrEnum):
    TOO_LARGE = "too-large"
    NOT_JSON = "not-json"
    NOT_AN_EVENT = "not-an-event"
    UNKNOWN_TYPE = "unknown-type"
    UNKNOWN_VERSION = "unknown-version"
    INVALID_DATA = "invalid-data"


class InvalidEventError(ValueError):
    """Bytes that can never become a valid event; they belong in the dead-letter subject."""

    def __init__(self, reason: InvalidReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class _Head(BaseModel):
    """Just enough of the envelope to find the model for the rest."""

    model_config = ConfigDict(extra="ignore")
    specversion: str
    type: str


def encode(event: Event[Any]) -> bytes:
    raw = event.model_dump_json(exclude_none=True).encode()
    if len(raw) > MAX_EVENT_BYTES:
        msg = f"event {event.type} is {len(raw)} bytes, over the {MAX_EVENT_BYTES} byte limit"
        raise InvalidEventError(InvalidReason.TOO_LARGE, msg)
    return raw


def decode(raw: bytes, *, max_bytes: int = MAX_EVENT_BYTES) -> Event[EventData]:
    """Parse and validate one event; raise `InvalidEventError` with the reason otherwise."""
    if len(raw) > max_bytes:
        raise InvalidEventError(
            InvalidReason.TOO_LARGE, f"{len(raw)} bytes, over the {max_bytes} byte limit"
        )
    try:
        head = _Head.model_validate_json(raw)
    except ValidationError as error:
        if any(e["type"] == "json_invalid" for e in error.errors()):
            raise InvalidEventError(InvalidReason.NOT_JSON, _summary(error)) from None
        raise InvalidEventError(InvalidReason.NOT_AN_EVENT, _summary(error)) from None
    spec = CATALOG.get(head.type)
    if spec is None:
        raise _unknown(head.type)
    try:
        return spec.envelope.model_validate_json(raw)
    except ValidationError as error:
        raise InvalidEventError(InvalidReason.INVALID_DATA, _summary(error)) from None


def _unknown(event_type: str) -> InvalidEventError:
    match = _TYPE_PATTERN.match(event_type)
    if match:
        aggregate, event, version = match.groups()
        versions = known_versions(aggregate, event)
        if versions:
            known = ", ".join(f"v{v}" for v in versions)
            return InvalidEventError(
                InvalidReason.UNKNOWN_VERSION,
                f"version v{version} of spotrain.{aggregate}.{event} is not known (known: {known})",
            )
    shown = event_type if len(event_type) <= 128 else event_type[:128] + "…"
    return InvalidEventError(InvalidReason.UNKNOWN_TYPE, f"unknown event type {shown!r}")


def _summary(error: ValidationError, limit: int = 3) -> str:
    """The first few validation errors as `loc: message`, short enough for a header."""
    parts = []
    for item in error.errors(include_url=False, include_input=False)[:limit]:
        loc = ".".join(str(p) for p in item["loc"]) or "(root)"
        parts.append(f"{loc}: {item['msg']}")
    more = error.error_count() - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)
