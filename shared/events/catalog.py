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

    def subject(self, prefix: str = DEFAULT_PREFIX) -> str:
        return f"{prefix}.{self.model.aggregate}.{self.model.event}"


_MODELS: tuple[type[d.EventData], ...] = (
    d.JobRequested,
    d.JobAccepted,
    d.JobRejected,
    d.JobQueued,
    d.JobStarted,
    d.JobProgress,
    d.JobCheckpointed,
    d.JobInterrupted,
    d.JobResumed,
    d.JobMoveRequested,
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

CATALOG: Mapping[str, EventSpec] = {model.event_type(): EventSpec(model=model) for model in _MODELS}


def spec_for(model: type[d.EventData]) -> EventSpec:
    """The catalog entry of a data model; a model missing from the catalog is a bug."""
    return CATALOG[model.event_type()]


def subject_for(model: type[d.EventData], prefix: str = DEFAULT_PREFIX) -> str:
    return spec_for(model).subject(prefix)


def subjects_for(models: Iterable[type[d.EventData]], prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Distinct subjects of several models, in a stable order (a consumer's filter)."""
    return sorted({subject_for(model, prefix) for model in models})


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
