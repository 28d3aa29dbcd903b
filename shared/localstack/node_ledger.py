"""What `spotrain down` tells the ledger: every node open on it ends, at the end the node
folder recorded (the nodes `down` just stopped, and any that died before while no scaler
watched), so that the cost of a stopped stack does not grow.

It speaks as the scaler (its credentials, on a secure stack): `node.released` is the
scaler's event, and the ids are the scaler's own, so a scaler that announces the same end
later stores it once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from shared.client import SpotrainClient
from shared.clock import SystemClock
from shared.events import new_event, node_event_id
from shared.events.data import NodeReleased, ReleaseReason
from shared.localstack.nodes import NodeFolder
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.settings import BusSettings
from shared.policy.cost.node_ends import closings, node_history
from shared.pools import billed_up_to

SOURCE = "scaler"
"""`down` stands in for the scaler, whose event this is."""


@dataclass(frozen=True)
class LedgerClosing:
    announced: list[NodeReleased]
    """The ends told to the ledger."""
    unannounced: list[str]
    """Nodes the folder started that no event names (a scaler died between a launch and
    its announcement): only the scaler knows their pool's price, so their records stay
    for its next start, which bills them."""


async def close_open_nodes(
    settings: BusSettings, folder: NodeFolder, *, stopped: Collection[str]
) -> LedgerClosing:
    """Announce the end of every node open on the ledger: `stopped` (by `down`, just now)
    as stack-stopped, the others as gone while unwatched; each at its recorded end, else
    its last sighting."""
    bus = await JetStreamBus.connect(settings, name="spotrain-down")
    try:
        # Read as `spotrain cost` reads them.
        reader = SpotrainClient(bus, SystemClock())
        # Sightings first, as `SpotrainClient.costs` reads them.
        seen = billed_up_to(await reader.sightings())
        history = node_history(await reader.cost_events())
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
        unannounced = [name for name in folder.started() if name not in history.launched]
        return LedgerClosing(announced, unannounced)
    finally:
        await bus.close()
