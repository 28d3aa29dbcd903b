"""Who may do what on the bus: the permission table, as data a reviewer can read.

Each role is one NATS user. A role's row lists its grants; each grant names the subjects it
opens, derived from the event catalog and the bucket names, never spelled twice. Pure: no
I/O, no randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from shared.desk import (
    DESK,
    allowances_bucket,
    desk_subject,
    desk_subjects,
    person_inbox_prefix,
)
from shared.events import all_subjects, dlq_subject, subject_for, subject_matches
from shared.events.data import (
    EventData,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobCheckpointed,
    JobFailed,
    JobInterrupted,
    JobMoveRequested,
    JobPlaced,
    JobProgress,
    JobQueued,
    JobRejected,
    JobRequested,
    JobResized,
    JobResumed,
    JobStarted,
    JobSucceeded,
    NodeJoined,
    NodeLaunched,
    NodeLost,
    NodePreempting,
    NodeReleased,
    PoolResized,
    PoolResizeFailed,
    PoolResizeRequested,
)
from shared.jobs import jobs_bucket, refusals_bucket
from shared.leases import leases_bucket
from shared.messaging.settings import Role
from shared.policy.teams import teams_bucket
from shared.pools import pools_bucket
from shared.workspace import uploads_bucket, workspaces_bucket

JS_API = "$JS.API"


class Bucket(StrEnum):
    JOBS = "jobs"
    POOLS = "pools"
    TEAMS = "teams"
    WORKSPACES = "workspaces"
    UPLOADS = "uploads"
    REFUSALS = "refusals"
    ALLOWANCES = "allowances"
    LEASES = "leases"


def replay_subjects(prefix: str) -> str:
    """Where `spotrain events replay` re-delivers past events: `<prefix>.replay.<service>`.

    Inside the stream's `<prefix>.>`, so a replay is on the record like any event."""
    return f"{prefix}.replay.>"


def inbox_prefix(role: Role) -> str:
    """Each role's replies arrive under its own prefix, so no role can read another's."""
    return f"_INBOX_{role.value}"


@dataclass(frozen=True)
class BusNames:
    """The names the subjects are built from: the prefix, the stream, the buckets."""

    prefix: str
    stream: str

    def bucket(self, bucket: Bucket) -> str:
        match bucket:
            case Bucket.JOBS:
                return jobs_bucket(self.prefix)
            case Bucket.POOLS:
                return pools_bucket(self.prefix)
            case Bucket.TEAMS:
                return teams_bucket(self.prefix)
            case Bucket.WORKSPACES:
                return workspaces_bucket(self.prefix)
            case Bucket.UPLOADS:
                return uploads_bucket(self.prefix)
            case Bucket.REFUSALS:
                return refusals_bucket(jobs_bucket(self.prefix))
            case Bucket.ALLOWANCES:
                return allowances_bucket(self.prefix)
            case Bucket.LEASES:
                return leases_bucket(self.prefix)

    def kv_stream(self, bucket: Bucket) -> str:
        return f"KV_{self.bucket(bucket)}"

    def object_stream(self, bucket: Bucket) -> str:
        return f"OBJ_{self.bucket(bucket)}"


@dataclass(frozen=True)
class Rule:
    """One subject a user may (or, with `deny`, may not) publish or subscribe to."""

    subject: str
    why: str
    subscribe: bool = False
    deny: bool = False


class Grant(Protocol):
    """Something a role does on the bus, and the subjects that takes."""

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        """The subjects; `durables` are the other roles' durable consumers, to keep off."""
        ...


@dataclass(frozen=True)
class Publishes:
    """Publishes these events (each on its catalog subject), into the stream."""

    events: tuple[type[EventData], ...]

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        return [
            Rule(subject_for(model, names.prefix), f"publishes {model.event_type()}")
            for model in self.events
        ]


@dataclass(frozen=True)
class PublishesAs:
    """Publishes these requests on one sender's own subject only (`<prefix>.job.requested.
    <sender>`): what proves that a request is that person's (shared/events/catalog.py)."""

    events: tuple[type[EventData], ...]
    sender: str

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        return [
            Rule(
                subject_for(model, names.prefix).removesuffix(">") + self.sender,
                f"publishes {model.event_type()} as {self.sender} only",
            )
            for model in self.events
        ]


@dataclass(frozen=True)
class DeclaresStream:
    """Checks the event stream at start, creating or updating it (`ensure_stream`); never
    deletes or purges it."""

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = "declares the event stream at start"
        return [
            Rule(f"{JS_API}.STREAM.{verb}.{names.stream}", why)
            for verb in ("INFO", "CREATE", "UPDATE")
        ]


@dataclass(frozen=True)
class Consumes:
    """Pulls from its own durable consumer, acks there, dead-letters to its own subject."""

    durable: str

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = f"consumes as {self.durable}"
        s, d = names.stream, self.durable
        return [
            Rule(f"{JS_API}.CONSUMER.DURABLE.CREATE.{s}.{d}", why),
            Rule(f"{JS_API}.CONSUMER.MSG.NEXT.{s}.{d}", why),
            Rule(f"$JS.ACK.{s}.{d}.>", why),
            Rule(dlq_subject(d, names.prefix), f"dead-letters what {d} cannot handle"),
            # A role that also reads history deletes its own read consumers; never this one.
            Rule(f"{JS_API}.CONSUMER.DELETE.{s}.{d}", "only ops deletes a consumer", deny=True),
        ]


@dataclass(frozen=True)
class ReadsHistory:
    """Reads these aggregates' stored events (`spotrain show`, `spotrain cost`) through
    short-lived consumers of its own (`bus.read`); never touches a service's consumer."""

    aggregates: tuple[str, ...]

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        s = names.stream
        rules = [
            # The server refuses a consumer whose own filter is not the one in the subject,
            # so a reader cannot widen what it reads.
            Rule(
                f"{JS_API}.CONSUMER.CREATE.{s}.*.{names.prefix}.{aggregate}.>",
                f"reads stored {aggregate} events",
            )
            for aggregate in self.aggregates
        ]
        why = "reads stored events through its own short-lived consumers"
        rules += [
            Rule(f"{JS_API}.CONSUMER.{verb}.{s}.*", why) for verb in ("INFO", "MSG.NEXT", "DELETE")
        ]
        # A service's consumer is not a reader's: not to take from, redefine or delete.
        for durable in durables:
            keep_off = f"keeps off {durable}'s consumer"
            rules.append(Rule(f"{JS_API}.CONSUMER.CREATE.{s}.{durable}.>", keep_off, deny=True))
            rules += [
                Rule(f"{JS_API}.CONSUMER.{verb}.{s}.{durable}", keep_off, deny=True)
                for verb in ("INFO", "MSG.NEXT", "DELETE")
            ]
        return rules


@dataclass(frozen=True)
class Follows:
    """Hears an aggregate's events as they happen, on core NATS (`spotrain watch`, the
    answer to a submission); sees them, cannot take them from any consumer."""

    aggregate: str

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = f"follows {self.aggregate} events as they happen"
        return [Rule(f"{names.prefix}.{self.aggregate}.>", why, subscribe=True)]


@dataclass(frozen=True)
class AnswersDesk:
    """Answers people's asks for the jobs they may read (`shared.desk`): hears every ask
    and replies to each once, to the asker's own inbox (the server's `allow_responses`)."""

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = "answers people's asks for the jobs they may read"
        return [
            Rule(desk_subjects(names.prefix), why, subscribe=True),
            Rule(dlq_subject(DESK, names.prefix), "dead-letters the requests it refuses"),
        ]


@dataclass(frozen=True)
class AsksDesk:
    """Asks the records desk, on one person's own subject: the desk answers with what that
    person may read, their own jobs and their team's."""

    person: str

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = f"asks for the jobs {self.person} may read, as {self.person} only"
        return [Rule(desk_subject(names.prefix, self.person), why)]


@dataclass(frozen=True)
class HoldsLease:
    """Takes, renews and releases its service's lease (`shared.leases`): its own key of
    the leases bucket, which every service may declare."""

    service: str

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        bucket = names.bucket(Bucket.LEASES)
        stream = names.kv_stream(Bucket.LEASES)
        why = f"holds the {self.service} lease, so that one replica does the work done once"
        return [
            Rule(f"{JS_API}.STREAM.CREATE.{stream}", why),
            Rule(f"$KV.{bucket}.{self.service}", why),
            *_bucket_reads(stream, why, listing=False),
        ]


def _bucket_reads(stream: str, why: str, *, listing: bool) -> list[Rule]:
    # A get goes to the stream, or straight to a replica when the bucket allows direct gets
    # (nats-py's buckets do not, the `nats` CLI's do).
    rules = [
        Rule(f"{JS_API}.STREAM.INFO.{stream}", why),
        Rule(f"{JS_API}.STREAM.MSG.GET.{stream}", why),
        Rule(f"{JS_API}.DIRECT.GET.{stream}", why),
        Rule(f"{JS_API}.DIRECT.GET.{stream}.>", why),
    ]
    if listing:
        # Reading objects goes through an ordered push consumer with flow control, delivered
        # to the reader's inbox; nats-py creates it unnamed, newer clients name it. A bucket
        # is read whole through a pull consumer of the reader's own, which it deletes after
        # (`shared.messaging.kv.latest_entries`).
        rules += [
            Rule(f"{JS_API}.CONSUMER.CREATE.{stream}", why),
            Rule(f"{JS_API}.CONSUMER.CREATE.{stream}.>", why),
            Rule(f"{JS_API}.CONSUMER.INFO.{stream}.>", why),
            Rule(f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*", why),
            Rule(f"{JS_API}.CONSUMER.DELETE.{stream}.*", why),
            Rule(f"$JS.FC.{stream}.>", why),
        ]
    return rules


@dataclass(frozen=True)
class ReadsBucket:
    """Reads a key-value bucket: gets keys, and lists them when `listing`."""

    bucket: Bucket
    listing: bool = True

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = f"reads the {names.bucket(self.bucket)} bucket"
        return _bucket_reads(names.kv_stream(self.bucket), why, listing=self.listing)


@dataclass(frozen=True)
class HearsBucket:
    """Hears a key-value bucket's writes as they happen, on core NATS (each write is a
    message on `$KV.<bucket>.<key>`): what it may read anyway, as it changes."""

    bucket: Bucket

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        bucket = names.bucket(self.bucket)
        return [Rule(f"$KV.{bucket}.>", f"hears the {bucket} bucket's writes", subscribe=True)]


@dataclass(frozen=True)
class WritesBucket:
    """Declares and writes a key-value bucket: its one writer."""

    bucket: Bucket

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        name = names.bucket(self.bucket)
        why = f"the one writer of the {name} bucket"
        stream = names.kv_stream(self.bucket)
        return [
            Rule(f"{JS_API}.STREAM.CREATE.{stream}", why),
            Rule(f"$KV.{name}.>", why),
            *_bucket_reads(stream, why, listing=True),
        ]


@dataclass(frozen=True)
class ReadsObjects:
    """Downloads from an object store bucket."""

    bucket: Bucket

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = f"downloads from the {names.bucket(self.bucket)} object store"
        return [
            *_bucket_reads(names.object_stream(self.bucket), why, listing=True),
            # nats-py finds the stream behind the chunks' subject by asking for stream names.
            Rule(f"{JS_API}.STREAM.NAMES", why),
        ]


@dataclass(frozen=True)
class DeclaresObjects:
    """Declares an object store bucket at start, and is its one writer: stores, replaces
    and deletes objects (a delete purges the object's chunks)."""

    bucket: Bucket

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        name = names.bucket(self.bucket)
        why = f"declares and writes the {name} object store"
        stream = names.object_stream(self.bucket)
        return [
            Rule(f"{JS_API}.STREAM.CREATE.{stream}", why),
            Rule(f"{JS_API}.STREAM.PURGE.{stream}", why),
            Rule(f"$O.{name}.>", why),
            *_bucket_reads(stream, why, listing=True),
            Rule(f"{JS_API}.STREAM.NAMES", why),
        ]


@dataclass(frozen=True)
class UploadsObjects:
    """Uploads new objects to an object store its writer declared. Not purging: nats-py
    purges the old chunks when a name is stored again, and a client that may purge may
    empty the whole store, so an upload skips a name that is already there (uploads are
    content-addressed)."""

    bucket: Bucket

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        name = names.bucket(self.bucket)
        why = f"uploads to the {name} object store"
        stream = names.object_stream(self.bucket)
        return [
            Rule(f"$O.{name}.C.>", why),
            Rule(f"$O.{name}.M.>", why),
            *_bucket_reads(stream, why, listing=False),
        ]


@dataclass(frozen=True)
class Operates:
    """Operators: the whole JetStream API (streams, consumers, replays, imports), every
    event subject including the replay subjects; still not a writer of the state buckets,
    which keep one writer each."""

    def rules(self, names: BusNames, durables: Sequence[str]) -> list[Rule]:
        why = "operates the bus: streams, consumers, export, import, replay"
        events = all_subjects(names.prefix)
        return [
            Rule(f"{JS_API}.>", why),
            Rule("$JS.ACK.>", why),
            Rule("$JS.FC.>", why),
            Rule(events, "imports and replays events, replay subjects included"),
            Rule(events, "tails every event", subscribe=True),
            Rule("$KV.>", "buckets keep one writer each, and it is a service", deny=True),
            Rule("$O.>", "object stores are written by their clients", deny=True),
        ]


@dataclass(frozen=True)
class RoleSpec:
    """A row of the table: who the role is and what it may do."""

    role: Role
    summary: str
    grants: tuple[Grant, ...]

    @property
    def durables(self) -> tuple[str, ...]:
        return tuple(g.durable for g in self.grants if isinstance(g, Consumes))


def _service(
    role: Role, summary: str, publishes: Iterable[type[EventData]], *more: Grant
) -> RoleSpec:
    """A service's row: it declares the stream, consumes as its own durable consumer (named
    after it) and dead-letters to its own subject, publishes these events, and more."""
    return RoleSpec(
        role,
        summary,
        (
            DeclaresStream(),
            Consumes(role.value),
            Publishes(tuple(publishes)),
            HoldsLease(role.value),
            *more,
        ),
    )


CLIENT_REQUESTS = (JobRequested, JobCancelRequested)
"""All a client may publish: it asks; the services decide and publish the facts."""

TABLE: tuple[RoleSpec, ...] = (
    _service(
        Role.SUBMITTER,
        "admits, queues and runs jobs on Ray; the one writer of the jobs and teams buckets"
        " and the workspace stores; answers people's asks and puts their requests on the bus",
        (
            JobAccepted,
            JobRejected,
            JobQueued,
            JobStarted,
            JobProgress,
            JobResized,
            JobInterrupted,
            JobSucceeded,
            JobFailed,
            JobCancelled,
        ),
        WritesBucket(Bucket.JOBS),
        WritesBucket(Bucket.REFUSALS),
        WritesBucket(Bucket.TEAMS),
        WritesBucket(Bucket.ALLOWANCES),  # each person's share of requests
        DeclaresObjects(Bucket.WORKSPACES),
        ReadsBucket(Bucket.POOLS, listing=False),  # prices and spend, for team budgets
        # The desk: what people read, it reads for them and answers in part; what they
        # send, it puts on the bus under their name.
        AnswersDesk(),
        ReadsHistory(("job", "node")),
        Publishes(CLIENT_REQUESTS),
        DeclaresObjects(Bucket.UPLOADS),
    ),
    _service(
        Role.SCALER,
        "sizes the pools and announces the nodes it bills; the only publisher of pool events,"
        " the one writer of the pools bucket",
        (
            JobPlaced,
            PoolResizeRequested,
            PoolResized,
            PoolResizeFailed,
            NodeLaunched,
            NodeReleased,
        ),
        WritesBucket(Bucket.POOLS),
        ReadsHistory(("job", "node")),  # for the cost-accrued metrics
    ),
    _service(
        Role.PREEMPTION_WATCHER,
        "turns preemption notices and lost nodes into events",
        (NodePreempting, NodeLost),
    ),
    _service(
        Role.CHECKPOINTER,
        "resumes interrupted jobs from their latest checkpoint, or gives up on them; moves"
        " running deadline jobs between spot and on-demand",
        (JobResumed, JobFailed, JobMoveRequested),
        # Listing: a notice, a loss and each review of moves read every active job.
        ReadsBucket(Bucket.JOBS),
        ReadsBucket(Bucket.POOLS, listing=False),
    ),
    RoleSpec(
        Role.METADATA_AGENT,
        "one per node: relays its own VM's preemption notice; consumes nothing",
        (DeclaresStream(), Publishes((NodePreempting,))),
    ),
    RoleSpec(
        Role.CLI,
        "data scientists: submit (with a workspace upload) and cancel; read jobs, their"
        " history and costs, and the pools",
        (
            Publishes(CLIENT_REQUESTS),
            UploadsObjects(Bucket.WORKSPACES),
            ReadsBucket(Bucket.JOBS),
            ReadsBucket(Bucket.REFUSALS, listing=False),
            ReadsBucket(Bucket.POOLS, listing=False),
            ReadsBucket(Bucket.TEAMS, listing=False),
            ReadsHistory(("job", "node")),
            Follows("job"),
        ),
    ),
    RoleSpec(
        Role.SLACK,
        "the Slack bot: submits and cancels on a user's behalf, posts job events to threads,"
        " reads jobs and pools",
        (
            DeclaresStream(),
            Consumes("slack"),
            Publishes(CLIENT_REQUESTS),
            ReadsBucket(Bucket.JOBS),
            ReadsBucket(Bucket.REFUSALS, listing=False),
            ReadsBucket(Bucket.POOLS, listing=False),
            ReadsHistory(("job", "node")),  # the ledger, for `/train cost`
        ),
    ),
    RoleSpec(
        Role.UI,
        "the web page behind a sign-in: reads jobs, their history and costs, the pools and"
        " teams, and shows each person what they may read; cancels for the person signed in",
        (
            Publishes((JobCancelRequested,)),
            ReadsBucket(Bucket.JOBS),
            HearsBucket(Bucket.JOBS),
            ReadsBucket(Bucket.REFUSALS, listing=False),
            ReadsBucket(Bucket.POOLS, listing=False),
            ReadsBucket(Bucket.TEAMS, listing=False),
            ReadsHistory(("job", "node", "pool")),
        ),
    ),
    RoleSpec(
        Role.OPS,
        "operators: replay, import, export, tail; administer the stream",
        (Operates(),),
    ),
)

NOT_YET_PUBLISHED: frozenset[type[EventData]] = frozenset({JobCheckpointed, NodeJoined})
"""Catalog events no role publishes today (ops aside); whoever adds a publisher adds the
grant to its row."""


@dataclass(frozen=True)
class UserPermissions:
    """One user's subjects, each with the reasons it is there."""

    role: Role
    summary: str
    publish_allow: Mapping[str, tuple[str, ...]]
    publish_deny: Mapping[str, tuple[str, ...]]
    subscribe_allow: Mapping[str, tuple[str, ...]]
    subscribe_deny: Mapping[str, tuple[str, ...]]
    allow_responses: bool = False
    """May reply, once, to a request it received (the reply goes to the asker's inbox)."""

    def may_publish(self, subject: str) -> bool:
        """What the server answers: allowed by a pattern, and denied by none."""
        return _allowed(subject, self.publish_allow, self.publish_deny)

    def may_subscribe(self, subject: str) -> bool:
        return _allowed(subject, self.subscribe_allow, self.subscribe_deny)


def _allowed(subject: str, allow: Iterable[str], deny: Iterable[str]) -> bool:
    return any(subject_matches(p, subject) for p in allow) and not any(
        subject_matches(p, subject) for p in deny
    )


def permissions(names: BusNames, table: Sequence[RoleSpec] = TABLE) -> dict[Role, UserPermissions]:
    """Each role's subjects, from the table. Pure."""
    durables = [d for spec in table for d in spec.durables]
    result = {}
    for spec in table:
        # A role may do to its own consumer what readers may not do to anyone's.
        others = [d for d in durables if d not in spec.durables]
        rules = [rule for grant in spec.grants for rule in grant.rules(names, others)]
        rules.append(
            Rule(f"{inbox_prefix(spec.role)}.>", "replies to its own requests", subscribe=True)
        )
        result[spec.role] = UserPermissions(
            role=spec.role,
            summary=spec.summary,
            publish_allow=_collect(rules, subscribe=False, deny=False),
            publish_deny=_collect(rules, subscribe=False, deny=True),
            subscribe_allow=_collect(rules, subscribe=True, deny=False),
            subscribe_deny=_collect(rules, subscribe=True, deny=True),
            allow_responses=any(isinstance(g, AnswersDesk) for g in spec.grants),
        )
    return result


def person_grants(name: str) -> tuple[Grant, ...]:
    """What a person's own credential may: ask the desk, on their own subject, and hear
    its answers in their own inbox; nothing else. No event subject, so no request of
    theirs is stored but by the desk, under their name and an id of their namespace; no
    JetStream API, so no route (a direct get, a consumer's delivery, an ack) makes the
    server publish for them, and no stream, bucket, object or consumer is theirs to read,
    create, take from or delete (`shared.desk`)."""
    return (AsksDesk(name),)


def person_permissions(
    name: str, names: BusNames, table: Sequence[RoleSpec] = TABLE
) -> UserPermissions:
    """A person's own credential (`spotrain users add`): `person_grants`, and their replies
    come to an inbox of their own. Pure."""
    durables = [d for spec in table for d in spec.durables]
    rules = [rule for grant in person_grants(name) for rule in grant.rules(names, durables)]
    rules.append(
        Rule(f"{person_inbox_prefix(name)}.>", "replies to their own requests", subscribe=True)
    )
    return UserPermissions(
        role=Role.CLI,
        summary="a person: asks the desk, as themselves, and nothing else",
        publish_allow=_collect(rules, subscribe=False, deny=False),
        publish_deny=_collect(rules, subscribe=False, deny=True),
        subscribe_allow=_collect(rules, subscribe=True, deny=False),
        subscribe_deny=_collect(rules, subscribe=True, deny=True),
    )


def _collect(rules: Iterable[Rule], *, subscribe: bool, deny: bool) -> dict[str, tuple[str, ...]]:
    collected: dict[str, list[str]] = {}
    for rule in rules:
        if rule.subscribe == subscribe and rule.deny == deny:
            reasons = collected.setdefault(rule.subject, [])
            if rule.why not in reasons:
                reasons.append(rule.why)
    return {subject: tuple(reasons) for subject, reasons in collected.items()}
