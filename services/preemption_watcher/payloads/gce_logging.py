"""GCE preemption audit log entries, as a Cloud Logging sink publishes them to Pub/Sub, read
into node signals. Pure: no I/O, no clock, no side effects."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from services.preemption_watcher.model import NodeSignal
from shared.events.data import NodePreempting, NoticeSource

PREEMPTED = "compute.instances.preempted"
"""The audit log `methodName` GCE writes when it preempts a VM (spot or preemptible)."""
GCE_PREEMPTION_NOTICE = timedelta(seconds=30)
"""How long GCE gives a preempted VM between the notice and the hard stop."""

_INSTANCE = re.compile(
    r"projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
    r"/instances/(?P<name>[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)"
)
"""`resourceName` of a VM; the name is a GCE instance name, which is also the GKE node name."""


class MalformedEntryError(ValueError):
    """The payload is not a LogEntry, or a preemption entry lacks what a notice needs; the
    message says why. It can never become valid: drop it."""


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)


class _Operation(_Part):
    """`LogEntry.operation`: the parts of one long operation share its id."""

    id: str | None = None


class _AuditLog(_Part):
    """The fields read from `protoPayload`; other payload types leave them out."""

    method_name: str | None = Field(None, alias="methodName")
    resource_name: str | None = Field(None, alias="resourceName")


class _LogEntry(_Part):
    insert_id: Annotated[str, Field(min_length=1, alias="insertId")]
    timestamp: AwareDatetime
    """When the event happened (not when Logging received it: that is `receiveTimestamp`)."""
    operation: _Operation | None = None
    proto_payload: _AuditLog | None = Field(None, alias="protoPayload")


def read_preemption(
    data: bytes | str, *, notice: timedelta = GCE_PREEMPTION_NOTICE
) -> NodeSignal | None:
    """The `node.preempting` signal of one LogEntry (JSON), or None if it is not a preemption.

    The node is the instance name from `resourceName`. Its pool stays None: the entry
    carries no node pool label, and GKE instance names (`gke-<cluster>-<pool>-<hash>-<id>`)
    truncate and join names that may themselves hold dashes. The deadline is the entry's
    `timestamp` plus `notice`. The key is `operation.id`, shared by the first and last parts
    of the operation, else `insertId`; Pub/Sub redelivery repeats both.
    Raises `MalformedEntryError` for anything that is not a LogEntry or a usable preemption entry.
    Pure: no I/O, no side effects.
    """
    try:
        entry = _LogEntry.model_validate_json(data)
    except ValidationError as error:
        raise MalformedEntryError(_reason(error)) from None
    audit = entry.proto_payload
    if audit is None or audit.method_name != PREEMPTED:
        return None
    entry_id = entry.insert_id[:100]
    if audit.resource_name is None:
        msg = f"preemption entry {entry_id} has no protoPayload.resourceName"
        raise MalformedEntryError(msg)
    instance = _INSTANCE.fullmatch(audit.resource_name)
    if instance is None:
        msg = (
            f"preemption entry {entry_id} names {audit.resource_name[:200]!r}, "
            "not projects/P/zones/Z/instances/NAME"
        )
        raise MalformedEntryError(msg)
    try:
        deadline = entry.timestamp + notice
    except OverflowError:
        msg = f"preemption entry {entry_id} has an out-of-range timestamp"
        raise MalformedEntryError(msg) from None
    operation_id = entry.operation.id if entry.operation is not None else None
    return NodeSignal(
        key=operation_id or entry.insert_id,
        data=NodePreempting(
            node=instance["name"], pool=None, deadline=deadline, source=NoticeSource.GCE_PUBSUB
        ),
    )


def _reason(error: ValidationError) -> str:
    """The first problem, in one line, without echoing the (untrusted, maybe huge) input."""
    first = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "payload"
    return f"not a LogEntry: {where}: {first['msg'][:200]}"
