"""The CloudEvents 1.0 structured-JSON envelope that carries every event's data.

The envelope `id` doubles as the JetStream `Nats-Msg-Id`, so a re-published event is
dropped by the server's de-duplication window.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime
from typing import Annotated, Generic, Literal, Self, TypeVar, cast

from pydantic import AwareDatetime, StringConstraints, model_validator

from shared.events.data import EventData
from shared.events.types import Frozen

EventId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]
Source = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,255}$")]
EventTypeName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_.]{1,128}$")]

DataT = TypeVar("DataT", bound=EventData)


class Event(Frozen, Generic[DataT]):
    """A CloudEvents 1.0 envelope around one event's data."""

    specversion: Literal["1.0"] = "1.0"
    id: EventId
    source: Source
    type: EventTypeName
    subject: Annotated[str, StringConstraints(max_length=256)] | None = None
    time: AwareDatetime
    datacontenttype: Literal["application/json"] = "application/json"
    data: DataT

    @model_validator(mode="after")
    def _type_names_the_data(self) -> Self:
        expected = self.data.event_type()
        if self.type != expected:
            msg = f"type {self.type!r} does not match its data, which is {expected!r}"
            raise ValueError(msg)
        return self


def new_event_id() -> str:
    """A fresh random event id, for events that are not derived from another one."""
    return uuid.uuid4().hex


_PLAIN_ID = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def node_event_id(event: str, node: str) -> str:
    """The id of a node's lifetime event (`launched`, `released`), derived from the node's
    name: whoever announces it (the scaler, `spotrain down`), and however often, the
    stream stores it once within its de-duplication window."""
    if _PLAIN_ID.match(node):
        return f"node-{event}-{node}"
    return f"node-{event}-{hashlib.sha256(node.encode()).hexdigest()[:32]}"


def new_event(
    data: DataT,
    *,
    source: str,
    time: datetime,
    event_id: str | None = None,
    subject: str | None = None,
) -> Event[DataT]:
    """Wrap `data` in an envelope.

    Pass `event_id` when the event is derived from another one (`accepted:<job_id>`), so
    that publishing it twice, after a crash or a replay, is de-duplicated by the server.
    """
    # Parametrised by the data's own class, or `data` would serialise as the bare base.
    envelope = cast("type[Event[DataT]]", Event[type(data)])  # type: ignore[misc]
    return envelope(
        id=event_id or new_event_id(),
        source=source,
        type=data.event_type(),
        subject=subject,
        time=time,
        data=data,
    )
