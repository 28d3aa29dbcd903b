"""Which events an operator means by `--type`: catalog entries, named the way people say
them. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from shared.events import CATALOG, EventData


class UnknownEventTypeError(ValueError):
    """A `--type` that names nothing in the catalog; the message lists what does."""


def type_name(model: type[EventData]) -> str:
    """`job.started`: how the CLI names an event type, whatever its version."""
    return f"{model.aggregate}.{model.event}"


def event_types(names: Iterable[str]) -> tuple[type[EventData], ...]:
    """The catalog's models named by `job.started`, `spotrain.job.started.v1` or a whole
    aggregate (`job`), in catalog order; every model when no name is given."""
    wanted = [name.strip() for name in names]
    if not wanted:
        return tuple(spec.model for spec in CATALOG.values())
    chosen: set[type[EventData]] = set()
    for name in wanted:
        matches = [spec.model for spec in CATALOG.values() if _names(spec.model, name)]
        if not matches:
            known = sorted({type_name(spec.model) for spec in CATALOG.values()})
            msg = f"no event type {name!r}; known: {', '.join(known)}"
            raise UnknownEventTypeError(msg)
        chosen.update(matches)
    return tuple(spec.model for spec in CATALOG.values() if spec.model in chosen)


def _names(model: type[EventData], name: str) -> bool:
    return name in (model.event_type(), type_name(model), model.aggregate)
