"""Leader leases, decided without I/O: which replica of a service does the work that must
happen once (the scaler's pass, the checkpointer's resume, the watcher's sources).

As Kubernetes' leader election does, a lease is one record in a bucket, written by
compare-and-set, and time is each replica's own:

- the holder renews it every `renew_every_s`, and acts only while its last renewal is
  younger than `renew_deadline_s`: a holder that stalled (a SIGSTOP, a long pause) knows
  by its own clock that it may no longer act, before it tries anything;
- another replica takes it over once it has seen the record unchanged for `duration_s`
  by its own clock (the writer's clock is never trusted), and `duration_s` exceeds the
  renew deadline, so the two never act at once;
- each takeover raises the lease's `term`, the fencing token: a write made for a term
  that is no longer the latest can be refused by whoever keeps the highest term seen;
- a holder that stops cleanly releases the record (no holder, same term), and the next
  replica takes over at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from shared.messaging.ports import Entry


def leases_bucket(prefix: str) -> str:
    """Where each service's replicas keep its lease (one key per service)."""
    return f"{prefix}-leases"


RELEASE_KEY = "release"
"""The key of the leases bucket that names the installation whose services lease in it: a
second installation on the same NATS with the same prefix would otherwise share leaders."""


def release_refusal(bucket: str, owner: str, mine: str) -> str | None:
    """Why this installation (`mine`) may not lease in a bucket another (`owner`) claimed;
    None when it is its own."""
    if owner == mine:
        return None
    return (
        f"the leases bucket {bucket} belongs to the installation {owner!r}, not {mine!r}: give "
        "this one a subject prefix of its own (SPOTRAIN_SUBJECT_PREFIX), or, if that one is "
        f"gone for good, delete the key: nats kv del {bucket} {RELEASE_KEY}"
    )


class LeaseRecord(BaseModel):
    """What the bucket holds for one lease."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    holder: str | None = Field(min_length=1)
    """None: released by its last holder, free to take at once."""
    term: int = Field(ge=1)
    """Raised by each takeover: the fencing token of the holder's writes."""


@dataclass(frozen=True)
class LeaseTimes:
    duration_s: float = 4.0
    """How long a record must stay unchanged before another replica takes it over."""
    renew_deadline_s: float = 3.0
    """How long the holder acts after its last renewal; less than `duration_s`."""
    renew_every_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_every_s < self.renew_deadline_s < self.duration_s:
            msg = (
                "lease times must satisfy 0 < renew_every_s < renew_deadline_s < duration_s, "
                f"not {self.renew_every_s}, {self.renew_deadline_s}, {self.duration_s}"
            )
            raise ValueError(msg)


@dataclass(frozen=True)
class Sighting:
    """The record as this replica last saw it, and when (its own monotonic clock) it first
    saw that revision: how long the record has stayed unchanged."""

    revision: int | None
    """None: no record (never taken, or released)."""
    since: float


class Move(StrEnum):
    TAKE = "take"
    """Write the record for a new term: there is none, or it expired."""
    RENEW = "renew"
    """Write the record again, same term: this replica holds it."""
    WAIT = "wait"
    """Another replica holds it and renews it."""


@dataclass(frozen=True)
class Decision:
    move: Move
    sighting: Sighting
    term: int
    """The term the write is for (TAKE: the next one), or the holder's (WAIT)."""


def decide(
    current: Entry | None,
    last: Sighting | None,
    *,
    me: str,
    now: float,
    times: LeaseTimes,
) -> Decision:
    """What this replica (`me`) does about the lease, seeing its entry `current` at `now`
    (its own monotonic clock), having last seen it as `last`."""
    record = read_record(current)
    revision = current.revision if current is not None else None
    sighting = last if last is not None and last.revision == revision else Sighting(revision, now)
    if record is None:
        # No lease yet, or one nobody can read: a new term, past any the bucket had (its
        # revisions only grow).
        return Decision(Move.TAKE, sighting, term=1 if current is None else current.revision + 1)
    if record.holder is None:
        return Decision(Move.TAKE, sighting, term=record.term + 1)
    if record.holder == me:
        return Decision(Move.RENEW, sighting, term=record.term)
    if now - sighting.since >= times.duration_s:
        return Decision(Move.TAKE, sighting, term=record.term + 1)
    return Decision(Move.WAIT, sighting, term=record.term)


def leads(last_renewed: float | None, now: float, times: LeaseTimes) -> bool:
    """Whether the holder may act now: it renewed within the deadline, by its own clock."""
    return last_renewed is not None and now - last_renewed < times.renew_deadline_s


def read_record(entry: Entry | None) -> LeaseRecord | None:
    if entry is None:
        return None
    try:
        return LeaseRecord.model_validate_json(entry.value)
    except ValueError:
        return None
