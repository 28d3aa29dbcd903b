"""The event contract: envelope, data models, catalog, codec, schema export."""

from shared.events.catalog import (
    CATALOG,
    DEFAULT_PREFIX,
    EventSpec,
    aggregate_subject,
    all_subjects,
    dlq_subject,
    spec_for,
    subject_for,
    subject_matches,
    subject_of,
    subjects_for,
)
from shared.events.codec import (
    MAX_EVENT_BYTES,
    InvalidEventError,
    InvalidReason,
    decode,
    encode,
)
from shared.events.data import EventData
from shared.events.envelope import Event, new_event, new_event_id, node_event_id

__all__ = [
    "CATALOG",
    "DEFAULT_PREFIX",
    "MAX_EVENT_BYTES",
    "Event",
    "EventData",
    "EventSpec",
    "InvalidEventError",
    "InvalidReason",
    "aggregate_subject",
    "all_subjects",
    "decode",
    "dlq_subject",
    "encode",
    "new_event",
    "new_event_id",
    "node_event_id",
    "spec_for",
    "subject_for",
    "subject_matches",
    "subject_of",
    "subjects_for",
]
