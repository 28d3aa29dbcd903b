"""What `spotrain down` tells the ledger: every node open on it ends, at the end the node
folder recorded (the nodes `down` just stopped, and any that died before while no scaler
watched), so that the cost of a stopped stack does not grow.

It speaks as the scaler (its credentials, on a secure stack): `node.released` is the
scaler's event, and the ids are the scaler's own, so a scaler that announces the same end
later stores it once.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

import nats.js.errors

from shared.cost.node_ends import closings, node_history
from shared.events import Event, decode, new_event, node_event_id, subjects_for
from shared.events.data import NodeLaunched, NodeLost, NodeReleased, ReleaseReason
from shared.localstack.nodes import NodeFolder
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.settings import BusSettings
from shared.pools import SIGHTINGS_KEY, NodeSightings, pools_bucket

SOURCE = "scaler"
"""`down` stands in for the scaler, whose event this is."""


async def close_open_nodes(
    settings: BusSettings, folder: NodeFolder, *, stopped: Collection[str]
) -> list[NodeReleased]:
    """Announce the end of every node open on the ledger: `stopped` (by `down`, just now)
    as stack-stopped, the others as gone while unwatched; each at its recorded end, else
    its last sighting. Returns what it announced."""
    bus = await JetStreamBus.connect(settings, name="spotrain-down")
    try:
        history = node_history(await _node_events(bus))
        seen = await _sightings(bus)
        recorded = {
            node.node: end
            for node in history.open
            if (end := folder.recorded_end(node.node)) is not None
        }
        announced = []
        for closing in closings(history.open, running=(), recorded=recorded, last_seen=seen):
            reason = (
                ReleaseReason.STACK_STOPPED
                if closing.node in stopped
                else ReleaseReason.GONE_WHILE_UNWATCHED
            )
            released = NodeReleased(
                node=closing.node,
                pool=closing.pool,
                reason=reason,
                released_at=closing.end.at,
                end_source=closing.end.source,
            )
            event_id = node_event_id("released", closing.node)
            event = new_event(released, source=SOURCE, time=datetime.now(UTC), event_id=event_id)
            await bus.publish(event)
            announced.append(released)
        return announced
    finally:
        await bus.close()


async def _node_events(bus: JetStreamBus) -> list[Event[Any]]:
    stored = []
    for subject in subjects_for((NodeLaunched, NodeReleased, NodeLost), bus.prefix):
        try:
            stored += await bus.read(subject)
        except nats.js.errors.NotFoundError:
            return []  # no stream: nothing was ever launched
    events = []
    for message in sorted(stored, key=lambda m: m.seq):
        try:
            events.append(decode(message.data))
        except ValueError:
            continue  # dead-lettered by its consumers; it opens or closes nothing
    return events


async def _sightings(bus: JetStreamBus) -> dict[str, datetime]:
    try:
        kv = await bus.client.jetstream().key_value(pools_bucket(bus.prefix))
        entry = await kv.get(SIGHTINGS_KEY)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
        return {}
    if not entry.value:
        return {}
    return dict(NodeSightings.model_validate_json(entry.value).seen)
