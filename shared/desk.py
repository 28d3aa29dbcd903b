"""The records desk: how a person with a credential of their own reads jobs.

A person may not read the `jobs` bucket or the job events on the bus themselves: records
and events hold `--env` values, often API tokens, and the server cannot tell one owner's
key from another's. They ask the desk instead, a request on `<prefix>_desk.<their name>`
(the only one the server lets them send, so the name is proven), and the submitter, which
knows the records and the teams, answers with what they may see: their own jobs and their
team's. Outside the event stream's `<prefix>.>`, so asks are not stored as events.

Messages and the pure parts (paging, what a hidden job's cost events keep). No I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import Field

from shared.events import Event
from shared.events.data import JobAccepted, JobFailed, JobRejected, JobRequested
from shared.events.types import Frozen, JobId
from shared.jobs import JobRecord

ANSWER_LIMIT_BYTES = 512 * 1024
"""The most an answer carries (the server's default message limit is 1 MiB); past it the
answer says `more` and where to go on from."""

MAX_WAIT_S = 20.0
"""The longest an ask may wait for news: a follower asks again after it."""

T = TypeVar("T")

HIDDEN_OWNER = "others"
"""Whom a hidden job's cost is shown as: it is someone outside the reader's team."""


def desk_subject(prefix: str, person: str) -> str:
    """Where `person` asks. The first token is never the prefix itself, so no ask lands in
    the event stream; a name's own dots are more tokens, matched exactly by the server."""
    return f"{prefix}_desk.{person}"


def desk_subjects(prefix: str) -> str:
    """What the desk answers: every person's asks."""
    return f"{prefix}_desk.>"


def asker(subject: str, prefix: str) -> str | None:
    """The person an ask came from: its subject, which the server let only them send on."""
    head = f"{prefix}_desk."
    name = subject.removeprefix(head)
    return name if subject.startswith(head) and name else None


class Ask(StrEnum):
    JOBS = "jobs"
    """Every job record the reader may see."""
    JOB = "job"
    """One record."""
    HISTORY = "history"
    """One job's stored events, after a stream sequence, waiting up to `wait_s` for news."""
    COST = "cost"
    """The job events cost accounting reads, every job's: the reader's own and their team's
    as they are, anyone else's under an alias with nothing but what the bill needs."""


class DeskAsk(Frozen):
    ask: Ask
    job_id: JobId | None = None
    after_seq: Annotated[int, Field(ge=0)] = 0
    """Only what the stream stored after this sequence (where the last answer ended)."""
    wait_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = 0.0


class StoredEvent(Frozen):
    seq: int
    event: str
    """The event as the stream holds it (its JSON envelope)."""


class DeskAnswer(Frozen):
    records: tuple[JobRecord, ...] = ()
    events: tuple[StoredEvent, ...] = ()
    next_seq: int = 0
    """Where to ask from next time (`after_seq`)."""
    more: bool = False
    """The answer stopped at its size limit: ask again from `next_seq` for the rest."""
    may_cancel: bool = False
    """For one job's record: whether the reader may cancel it (theirs, or as its team's
    admin), as the submitter will decide."""
    refused: str | None = None
    """Why the desk would not answer, for the user."""


def page(items: Sequence[T], size: Callable[[T], int], limit: int = ANSWER_LIMIT_BYTES) -> int:
    """How many of `items`, from the first, fit in `limit` bytes; always at least one, so
    an answer always moves on."""
    used = 0
    for count, item in enumerate(items):
        used += size(item)
        if count and used > limit:
            return count
    return len(items)


def alias(job_id: str) -> str:
    """A hidden job's stable name: the same in every answer, telling nothing of the job."""
    return f"other-{hashlib.sha256(job_id.encode()).hexdigest()[:12]}"


def hidden(event: Event[Any]) -> Event[Any]:
    """A job event of someone outside the reader's team, as the cost ledger needs it and
    no more: under the job's alias, with no owner, command, labels, environment or error
    text. Its shape (GPUs, class, priority) and timings stay: they are the bill."""
    data = event.data
    job_id = getattr(data, "job_id", None)
    if job_id is None:
        return event
    update: dict[str, Any] = {"job_id": alias(job_id)}
    match data:
        case JobRequested():
            update |= {
                "owner": HIDDEN_OWNER,
                "experiment": None,
                "entrypoint": ("hidden",),
                "working_dir": None,
                "labels": {},
                "env": {},
                "secrets": {},
                "pip": (),
            }
        case JobAccepted():
            update |= {"owner": HIDDEN_OWNER, "experiment": None}
        case JobFailed():
            update |= {"message": "hidden"}
        case JobRejected():
            update |= {"detail": "hidden"}
        case _:
            pass
    return event.model_copy(
        update={
            "data": data.model_copy(update=update),
            "id": f"hidden-{hashlib.sha256(event.id.encode()).hexdigest()[:32]}",
            "source": "hidden",
            "subject": alias(job_id),
        }
    )
