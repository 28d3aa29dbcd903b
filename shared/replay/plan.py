"""What `spotrain events replay` re-delivers: a copy of each stored event on the replay
subject of the one service it goes to. Pure: the records are read and the run id is made by
the caller."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.events import InvalidEventError, decode
from shared.events.catalog import replay_subject
from shared.messaging.dead_letters import MSG_ID, ORIGINAL_SEQ, ORIGINAL_SUBJECT
from shared.messaging.ports import StreamRecord

REPLAY_RUN = "Spotrain-Replay-Run"
"""Header of a replay copy: the run that published it."""


@dataclass(frozen=True)
class ReplayCopy:
    """One stored event, byte for byte, addressed to one service's replay subject."""

    event_id: str
    event_type: str
    subject: str
    data: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class ReplayPlan:
    service: str
    copies: tuple[ReplayCopy, ...]
    invalid: int
    """Stored messages that are no valid event: their consumers dead-lettered them already."""

    def counts(self) -> dict[str, int]:
        """Copies per event type, in the order they first appear."""
        return dict(Counter(copy.event_type for copy in self.copies))


def plan_replay(
    records: Iterable[StreamRecord], *, service: str, run: str, prefix: str
) -> ReplayPlan:
    """A copy of each valid record for `service`. A copy keeps the event's bytes, so its id,
    the key of every handler's idempotency, is the original's; its message id is its own
    within the run (`<id>.replay.<run>`), so the server's de-duplication, which spans the
    stream, does not drop a recent event's copy, and a retried copy is stored once."""
    copies: list[ReplayCopy] = []
    invalid = 0
    for record in records:
        try:
            event = decode(record.data)
        except InvalidEventError:
            invalid += 1
            continue
        copies.append(
            ReplayCopy(
                event_id=event.id,
                event_type=event.type,
                subject=replay_subject(service, type(event.data), prefix),
                data=record.data,
                headers={
                    MSG_ID: f"{event.id}.replay.{run}",
                    REPLAY_RUN: run,
                    ORIGINAL_SUBJECT: record.subject,
                    ORIGINAL_SEQ: str(record.seq),
                },
            )
        )
    return ReplayPlan(service=service, copies=tuple(copies), invalid=invalid)
