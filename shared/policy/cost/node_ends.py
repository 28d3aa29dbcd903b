"""Which nodes the ledger still bills, and when the ones nobody watched really stopped.
Pure: the caller reads the events, the provider's records and the sightings.

The scaler, at its start, and `spotrain down`, when it stops the local stack, both close
the nodes that are open in the ledger (a `node.launched` with no `node.released` or
`node.lost`) but no longer run. Each is closed at the best end known, never at the time it
was found gone: the provider's record of its end where there is one, else the last time it
was seen alive, else its launch (it was never seen after it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.events import Event
from shared.events.data import NodeEndSource, NodeLaunched, NodeLost, NodeReleased


@dataclass(frozen=True)
class OpenNode:
    """A node the ledger bills with no end yet."""

    node: str
    pool: str
    launched_at: datetime
    host: str | None = None
    """The machine's name where the node is not named by it (`NodeLaunched.host`)."""
    life: str | None = None
    """Which machine it is behind that name (`NodeLaunched.life`)."""

    @property
    def machine(self) -> str:
        """The name the provider, Ray and the attempts know the node by."""
        return self.host or self.node


@dataclass(frozen=True)
class NodeEnd:
    """When a node stopped, and how that is known."""

    at: datetime
    source: NodeEndSource
    maintenance: bool = False
    """The provider recorded it inside an upgrade or repair of the node's pool (GKE
    replacing or recreating its nodes): the cloud did not take it back."""


@dataclass(frozen=True)
class NodeHistory:
    """The node events on record, folded: what is open, and what has already ended."""

    open: tuple[OpenNode, ...]
    ended: frozenset[str]
    launched: frozenset[str] = frozenset()
    """Every node with a `node.launched`: the nodes the ledger bills, or billed."""
    lives: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    """Every launched node's machine name and life (`OpenNode.machine`, `.life`)."""


def node_history(events: Iterable[Event[Any]]) -> NodeHistory:
    """Launched nodes without an end, and nodes with one, from events in any order;
    anything but node lifetime events is ignored, and a repeated event changes nothing."""
    launched: dict[str, NodeLaunched] = {}
    ended: set[str] = set()
    for event in events:
        data = event.data
        if isinstance(data, NodeLaunched):
            launched.setdefault(data.node, data)
        elif isinstance(data, NodeReleased | NodeLost):
            ended.add(data.node)
    still_open = tuple(
        OpenNode(node=n.node, pool=n.pool, launched_at=n.launched_at, host=n.host, life=n.life)
        for name, n in sorted(launched.items())
        if name not in ended
    )
    return NodeHistory(
        open=still_open,
        ended=frozenset(ended),
        launched=frozenset(launched),
        lives={name: (n.host or n.node, n.life) for name, n in launched.items()},
    )


def best_end(node: OpenNode, *, recorded: NodeEnd | None, last_seen: datetime | None) -> NodeEnd:
    """The provider's record of the end if it has one; else the latest sighting, the
    provider's own (a last stamp) or the scaler's; else the launch. Never before the launch
    (a clock skewed between machines must not make a negative life)."""
    if recorded is not None and recorded.source is NodeEndSource.RECORDED:
        return NodeEnd(max(recorded.at, node.launched_at), recorded.source, recorded.maintenance)
    sightings = [node.launched_at]
    sightings += [last_seen] if last_seen is not None else []
    sightings += [recorded.at] if recorded is not None else []
    return NodeEnd(max(sightings), NodeEndSource.LAST_SEEN)


@dataclass(frozen=True)
class NodeClosing:
    """A node to close on the ledger, at `end`."""

    node: str
    pool: str
    end: NodeEnd


def closings(
    open_nodes: Iterable[OpenNode],
    *,
    running: Collection[str],
    recorded: Mapping[str, NodeEnd],
    last_seen: Mapping[str, datetime],
) -> list[NodeClosing]:
    """Every open node that is not running, closed at its best known end."""
    return [
        NodeClosing(
            node=node.node,
            pool=node.pool,
            end=best_end(
                node, recorded=recorded.get(node.node), last_seen=last_seen.get(node.node)
            ),
        )
        for node in open_nodes
        if node.node not in running
    ]


@dataclass(frozen=True)
class Unaccounted:
    """A node open in the ledger that no provider has listed for a while."""

    node: str
    pool: str
    launched_at: datetime
    last_seen: datetime
    for_s: float
    """How long since it was last seen: the time the ledger does not charge it for."""


def unaccounted(
    open_nodes: Iterable[OpenNode],
    *,
    last_seen: Mapping[str, datetime],
    now: datetime,
    stale_after_s: float,
) -> list[Unaccounted]:
    """Open nodes last seen (or, never seen, launched) more than `stale_after_s` ago."""
    found = []
    for node in open_nodes:
        seen = max(last_seen.get(node.node, node.launched_at), node.launched_at)
        gap_s = (now - seen).total_seconds()
        if gap_s > stale_after_s:
            found.append(Unaccounted(node.node, node.pool, node.launched_at, seen, gap_s))
    return found
