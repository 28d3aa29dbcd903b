"""What a preemption source reports: a notice that a node will go, or news that it went."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shared.events.data import NodeLost, NodePreempting


@dataclass(frozen=True)
class NodeSignal:
    """One notice or loss, with the key its source knows it by.

    Sources deliver at least once (Pub/Sub redelivers, a watch restarts from a list), so the
    same signal seen twice carries the same key, and its event the same id.
    """

    key: str
    data: NodePreempting | NodeLost

    @property
    def event_id(self) -> str:
        # Hashed: a source's keys may hold characters, or a length, an event id may not.
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:32]
        return f"node-{self.data.event}-{self.data.source.value}-{digest}"
