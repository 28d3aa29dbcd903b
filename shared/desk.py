"""The desk: all a person with a credential of their own does on the platform, they ask.

A person's credential publishes on one subject, `<prefix>_desk.<their name>` (so the name
is proven by the server), and hears replies in an inbox of its own; it has no JetStream
API right at all. So no route lets the server publish for them (a direct get, a consumer's
delivery, a publish's ack, each sent wherever its asker says), and nothing stored on the
bus is theirs to read, take, create or delete. The submitter answers each ask with what
they may see and do: their own jobs and their team's (records and events hold `--env`
values, often API tokens), the pools, the teams. It puts their requests and their uploaded
workspaces on the bus itself, under their name. Outside the event stream's `<prefix>.>`,
so asks are not stored as events.

Messages and the pure parts (paging, what a hidden job's cost events keep). No I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import Field, StringConstraints

from shared.events import (
    Event,
    InvalidEventError,
    InvalidReason,
    decode,
    subject_for,
    subject_of,
)
from shared.events.data import (
    JobAccepted,
    JobCancelRequested,
    JobCheckpointed,
    JobFailed,
    JobRejected,
    JobRequested,
    JobResumed,
    JobStarted,
)
from shared.events.types import Frozen, JobId, ObjectRef
from shared.jobs import JobRecord
from shared.messaging.delivery import DeadLetterReason
from shared.policy.teams import TeamHolds, TeamsStatus
from shared.workspace import DEFAULT_LIMIT_BYTES

ANSWER_LIMIT_BYTES = 512 * 1024
"""The most an answer carries (the server's default message limit is 1 MiB); past it the
answer says `more` and where to go on from."""

REQUEST_LIMIT_BYTES = 256 * 1024
"""The most a request's envelope may hold."""

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


def replies_to_asker(reply: str, person: str) -> bool:
    """Whether an ask's reply subject is the asker's own inbox. The desk answers no other:
    an answer published to a subject the asker chose (the event stream's, someone else's
    inbox) would go there with the submitter's rights."""
    return reply.startswith(f"{person_inbox_prefix(person)}.")


def person_inbox_prefix(name: str) -> str:
    """A person's replies arrive under a prefix of their own. From a digest of the name: a
    name may hold dots, and `_INBOX_jane.>` would cover `jane.doe`'s replies too."""
    return f"_INBOX_u{hashlib.sha256(name.encode()).hexdigest()[:20]}"


def person_event_id(person: str, event_id: str) -> str:
    """The id a person's request is stored under: in a namespace of their own (no id any
    service or other person gives has it), so the stream's de-duplication of ids drops a
    request sent twice, and never another's event."""
    digest = hashlib.sha256(f"{person}\n{event_id}".encode()).hexdigest()
    return f"person:{hashlib.sha256(person.encode()).hexdigest()[:16]}:{digest[:40]}"


def asker(subject: str, prefix: str) -> str | None:
    """The person an ask came from: its subject, which the server let only them send on."""
    head = f"{prefix}_desk."
    name = subject.removeprefix(head)
    return name if subject.startswith(head) and name else None


PART_BYTES = 256 * 1024
"""One part of a workspace going up through the desk (base64 in the ask: about 342 KiB)."""

DESK = "desk"
"""Whose dead letters a refused request is (`<prefix>.dlq.desk`)."""

MOST_ASKS_PER_PERSON = 16
"""Asks of one person answered at once; past it the desk refuses at once, so one person's
flood of slow asks leaves room for everyone else's."""


REQUESTS_BURST = 200
"""Requests one person may send at once (a sweep of 200 points goes in one go)..."""
REQUESTS_PER_S = 2.0
"""... and then how many a second: one person's flood of requests, each a record the
submitter decides and keeps, cannot delay everyone else's."""


ALLOWANCE_WHOLE_AFTER_S = REQUESTS_BURST / REQUESTS_PER_S
"""A person's allowance is whole again after this long without a request: where the
replicas keep allowances (a bucket), an entry is forgotten then."""


def allowances_bucket(prefix: str) -> str:
    """Where the submitter's replicas keep each person's allowance, so that a person's
    share is theirs across replicas, not theirs from each."""
    return f"{prefix}-allowances"


@dataclass(frozen=True)
class Allowance:
    """What is left of one person's requests (a token bucket), and when it was counted."""

    left: float
    at: float

    def to_bytes(self) -> bytes:
        return json.dumps({"left": self.left, "at": self.at}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> Allowance | None:
        """None for what is not an allowance: a whole one is given then."""
        try:
            fields = json.loads(raw or b"")
            return cls(left=float(fields["left"]), at=float(fields["at"]))
        except (ValueError, TypeError, KeyError):
            return None


def take_request(
    allowance: Allowance | None,
    now: float,
    *,
    burst: int = REQUESTS_BURST,
    per_s: float = REQUESTS_PER_S,
) -> tuple[Allowance, float | None]:
    """One more request of a person's, at `now` (seconds, any monotonic clock): what is
    left after it, and None when it may go, else in how many seconds one may."""
    if allowance is None:
        allowance = Allowance(left=float(burst), at=now)
    left = min(float(burst), allowance.left + max(0.0, now - allowance.at) * per_s)
    if left >= 1.0:
        return Allowance(left=left - 1.0, at=now), None
    return Allowance(left=left, at=now), (1.0 - left) / per_s


class Ask(StrEnum):
    JOBS = "jobs"
    """Every job record the reader may see."""
    JOB = "job"
    """One record."""
    HISTORY = "history"
    """One job's stored events, after a stream sequence, waiting up to `wait_s` for news."""
    COST = "cost"
    """The job and node events cost accounting reads, every job's: the reader's own and
    their team's as they are, anyone else's under an alias with nothing but what the bill
    needs."""
    SUBMIT = "submit"
    """Put a request (`job.requested`, `job.cancel_requested`) on the bus, on the
    asker's own subject; the answer says where the stream stored it (`next_seq`)."""
    POOLS = "pools"
    """The scaler's view of the pools (`spotrain pools`, `top`, `cost`)."""
    TEAMS = "teams"
    """The submitter's view of the teams."""
    UPLOAD = "upload"
    """One part of a workspace; the last part's answer is the stored workspace."""
    LOGS = "logs"
    """One attempt's output as Ray keeps it, its last `ANSWER_LIMIT_BYTES`: Ray's job API
    is the submitter's alone (token authentication), and answers every job's."""


class UploadPart(Frozen):
    """One part of a packed workspace: parts go up in order, each `PART_BYTES` but the
    last; the first answer is the workspace at once when the owner already stored it."""

    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size: Annotated[int, Field(ge=1, le=DEFAULT_LIMIT_BYTES)]
    offset: Annotated[int, Field(ge=0)]
    data: Annotated[str, StringConstraints(max_length=(PART_BYTES * 4) // 3 + 4)]
    """The part's bytes, base64."""

    def part_problem(self, raw: bytes) -> str | None:
        """Why this part cannot be one of its workspace's, or None."""
        if self.offset % PART_BYTES or self.offset >= self.size:
            return f"a part starts at {self.offset}: parts start at multiples of {PART_BYTES}"
        expected = min(PART_BYTES, self.size - self.offset)
        if len(raw) != expected:
            return f"the part at {self.offset} holds {len(raw)} bytes, not {expected}"
        return None

    @property
    def is_last(self) -> bool:
        return self.offset + PART_BYTES >= self.size


def part_offsets(size: int) -> range:
    """Where each part of a workspace of `size` bytes starts."""
    return range(0, size, PART_BYTES)


def part_name(owner: str, sha256: str, offset: int) -> str:
    return f"{owner}.{sha256}.{offset:012d}"


MOST_STAGED_BYTES = 256 * 1024 * 1024
"""What one person's unfinished uploads may hold in the uploads store at once (two and a
half of the largest workspace): parts left behind expire only after an hour, and one
person must not fill the store for everyone until then."""


def staged_by(owner: str, first_parts: Mapping[str, int]) -> int:
    """The bytes `owner`'s unfinished uploads have reserved: each upload reserves its whole
    size with its first part (`first_parts`: the store's first parts, by name)."""
    return sum(
        size
        for name, size in first_parts.items()
        if name.startswith(f"{owner}.") and name.endswith(f".{0:012d}")
    )


def staging_refusal(staged: int, size: int) -> str | None:
    """Why a new upload of `size` bytes may not begin beside `staged` bytes, or None."""
    if staged + size <= MOST_STAGED_BYTES:
        return None
    return (
        f"your unfinished uploads hold {staged // 2**20} MiB; a new one of "
        f"{size // 2**20} MiB would pass the {MOST_STAGED_BYTES // 2**20} MiB each person "
        "may stage: finish one, or wait an hour for what was left behind to expire"
    )


class DeskAsk(Frozen):
    ask: Ask
    job_id: JobId | None = None
    after_seq: Annotated[int, Field(ge=0)] = 0
    """Only what the stream stored after this sequence (where the last answer ended)."""
    wait_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = 0.0
    event: Annotated[str, StringConstraints(max_length=REQUEST_LIMIT_BYTES)] | None = None
    """For `submit`: the request, as a CloudEvents JSON envelope."""
    part: UploadPart | None = None
    """For `upload`."""
    attempt: Annotated[int, Field(ge=1)] | None = None
    """For `logs`: which attempt's."""


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
    entries: dict[str, str] = Field(default_factory=dict)
    """For `pools` and `teams`: the bucket's keys the client reads, as they are stored."""
    workspace: ObjectRef | None = None
    """For `upload`: the workspace, once stored whole."""
    retry_after_s: float | None = None
    """With `refused`: the asker sent more than their share; this much later, they may."""
    logs: str | None = None
    """For `logs`: the attempt's output (None: Ray keeps none for it)."""


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
        # The job's id is in more than its `job_id`: an attempt's Ray submission id, a
        # checkpoint's URI; a cancel names who asked.
        case JobStarted():
            update |= {"submission_id": alias(job_id) + data.submission_id.removeprefix(job_id)}
        case JobResumed():
            update |= {"from_checkpoint": None}
        case JobCheckpointed():
            update |= {"uri": f"hidden://{alias(job_id)}"}
        case JobCancelRequested():
            update |= {"requested_by": HIDDEN_OWNER}
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


def teams_status_for(status: TeamsStatus, reader: str) -> TeamsStatus:
    """The teams' status as `reader` may see it: every team's use, as `spotrain teams`
    shows it, but the holds of jobs outside the reader's team under their alias, owned
    by `others`."""
    team = status.teams.team_of(reader)
    mine = team.name if team is not None else None
    holds = {}
    for job_id, hold in status.holds.holds.items():
        if hold.team == mine or hold.owner == reader:
            holds[job_id] = hold
        else:
            holds[alias(job_id)] = hold.model_copy(
                update={"job_id": alias(job_id), "owner": HIDDEN_OWNER}
            )
    return status.model_copy(update={"holds": TeamHolds(holds=holds)})


@dataclass(frozen=True)
class Forward:
    """A person's request, as the desk puts it on the bus: on their own subject, under an
    id of their namespace."""

    subject: str
    event: Event[Any]


@dataclass(frozen=True)
class RefuseRequest:
    """A request the desk does not forward: the answer for the person, and the reason
    and detail of its dead letter."""

    answer: str
    reason: str
    detail: str


def forward_request(raw: bytes, person: str, prefix: str) -> Forward | RefuseRequest:
    """What the desk does with what `person` asks it to submit: a request of theirs goes
    on their own subject (the submitter's intake takes it as it takes any tool's); not a
    request, or one in someone else's name, is refused."""
    try:
        event = decode(raw)
    except InvalidEventError as error:
        return RefuseRequest(
            f"not a request the platform takes: {error}", error.reason.value, str(error)
        )
    if not isinstance(event.data, JobRequested | JobCancelRequested):
        detail = f"{event.type} is not a request (job.requested, job.cancel_requested)"
        return RefuseRequest(
            f"not a request the platform takes: {detail}", InvalidReason.UNKNOWN_TYPE, detail
        )
    subject = subject_for(type(event.data), prefix).removesuffix(">") + person
    if subject_of(event.data, prefix) != subject:
        return RefuseRequest(
            f"{person} may send requests as {person} only",
            DeadLetterReason.NOT_THE_SENDER,
            f"a request of {person}'s names someone else as its sender",
        )
    return Forward(subject, event.model_copy(update={"id": person_event_id(person, event.id)}))
