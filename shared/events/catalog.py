"""The one event catalog: type → data model → subject. Nothing else spells a subject.

Subjects are `<prefix>.<aggregate>.<event>`; the versioned type lives in the envelope, so a
v2 of an event shares its subject with v1 and consumers decide what they understand.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.events import data as d
from shared.events.envelope import Event

DEFAULT_PREFIX = "spotrain"


@dataclass(frozen=True)
class EventSpec:
    """One entry of the catalog."""

    model: type[d.EventData]

    @functools.cached_property
    def envelope(self) -> type[Event[Any]]:
        """The envelope parametrised by this data model, built on first use."""
        return Event[self.model]  # type: ignore[name-defined]

    @property
    def type(self) -> str:
        return self.model.event_type()

    @property
    def sender_field(self) -> str | None:
        """For a request, the field that names who sent it (see `SENT_BY`)."""
        return SENT_BY.get(self.model)

    def subject(self, prefix: str = DEFAULT_PREFIX) -> str:
        """Where this model's events are found: a consumer's filter, a permission. A
        request's subject ends in its sender's name, so this covers every sender."""
        base = f"{prefix}.{self.model.aggregate}.{self.model.event}"
        return f"{base}.>" if self.sender_field else base

    def subject_of(self, data: d.EventData, prefix: str = DEFAULT_PREFIX) -> str:
        """Where this event is published: a request on its sender's own subject."""
        base = f"{prefix}.{self.model.aggregate}.{self.model.event}"
        field = self.sender_field
        return f"{base}.{getattr(data, field)}" if field else base

    def sender_on(self, subject: str, prefix: str = DEFAULT_PREFIX) -> str | None:
        """The sender a request's subject names (names may hold dots: all that follows
        the event's own tokens); None for an event that names none."""
        base = f"{prefix}.{self.model.aggregate}.{self.model.event}."
        if self.sender_field is None or not subject.startswith(base):
            return None
        return subject[len(base) :] or None


_MODELS: tuple[type[d.EventData], ...] = (
    d.JobRequested,
    d.JobAccepted,
    d.JobRejected,
    d.JobQueued,
    d.JobPlaced,
    d.JobStarted,
    d.JobProgress,
    d.JobCheckpointed,
    d.JobInterrupted,
    d.JobResumed,
    d.JobMoveRequested,
    d.JobResized,
    d.JobSucceeded,
    d.JobFailed,
    d.JobCancelRequested,
    d.JobCancelled,
    d.PoolResizeRequested,
    d.PoolResized,
    d.PoolResizeFailed,
    d.NodeJoined,
    d.NodeLaunched,
    d.NodeReleased,
    d.NodePreempting,
    d.NodeLost,
)

SENT_BY: Mapping[type[d.EventData], str] = {
    d.JobRequested: "owner",
    d.JobCancelRequested: "requested_by",
}
"""Requests, and the field that names their sender. Each is published on a subject that
ends in that name (`<prefix>.job.requested.<owner>`): a user's NATS credential may publish
only on its own name (shared/natsauth), and a consumer takes only a request whose subject
and field agree (shared/messaging/delivery.py), so the owner of a job is whoever's
credential sent it, never what the payload claims."""

CATALOG: Mapping[str, EventSpec] = {model.event_type(): EventSpec(model=model) for model in _MODELS}


def spec_for(model: type[d.EventData]) -> EventSpec:
    """The catalog entry of a data model; a model missing from the catalog is a bug."""
    return CATALOG[model.event_type()]


def subject_for(model: type[d.EventData], prefix: str = DEFAULT_PREFIX) -> str:
    """Where a model's events are found (every sender's, for a request)."""
    return spec_for(model).subject(prefix)


def subject_of(data: d.EventData, prefix: str = DEFAULT_PREFIX) -> str:
    """Where one event is published."""
    return spec_for(type(data)).subject_of(data, prefix)


def subjects_for(models: Iterable[type[d.EventData]], prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Distinct subjects of several models, in a stable order (a consumer's filter)."""
    return sorted({subject_for(model, prefix) for model in models})


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching: `*` is one token, a final `>` one or more."""
    words = subject.split(".")
    wildcards = pattern.split(".")
    for i, word in enumerate(wildcards):
        if word == ">":
            return len(words) > i
        if i >= len(words) or word not in ("*", words[i]):
            return False
    return len(wildcards) == len(words)


def aggregate_subject(model: type[d.EventData], prefix: str = DEFAULT_PREFIX) -> str:
    """Every event of a model's aggregate (`<prefix>.job.>`): one consumer's filter."""
    return f"{prefix}.{model.aggregate}.>"


def all_subjects(prefix: str = DEFAULT_PREFIX) -> str:
    """The wildcard that the stream captures."""
    return f"{prefix}.>"


def replay_subject(service: str, model: type[d.EventData], prefix: str = DEFAULT_PREFIX) -> str:
    """Where `spotrain events replay` re-delivers a past event to one service only:
    `<prefix>.replay.<service>.<aggregate>.<event>`. Inside the stream's `<prefix>.>`, so a
    replay is on the record; the envelope's type, not this subject, names the handler."""
    return f"{prefix}.replay.{service}.{model.aggregate}.{model.event}"


def replay_subjects_for(
    service: str, models: Iterable[type[d.EventData]], prefix: str = DEFAULT_PREFIX
) -> list[str]:
    """The replay subjects of one service's events, in a stable order."""
    return sorted({replay_subject(service, model, prefix) for model in models})


def dlq_subject(service: str, prefix: str = DEFAULT_PREFIX) -> str:
    """Where a service dead-letters what it cannot handle."""
    return f"{prefix}.dlq.{service}"


def known_versions(aggregate: str, event: str) -> list[int]:
    return sorted(
        spec.model.version
        for spec in CATALOG.values()
        if (spec.model.aggregate, spec.model.event) == (aggregate, event)
    )
