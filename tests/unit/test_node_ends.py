"""Which nodes the ledger still bills, and the best end of those nobody watched stop."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from shared.events import Event, new_event
from shared.events.data import (
    NodeEndSource,
    NodeLaunched,
    NodeLost,
    NodeReleased,
    NoticeSource,
    ReleaseReason,
)
from shared.events.types import CapacityClass
from shared.policy.cost.node_ends import (
    NodeEnd,
    OpenNode,
    best_end,
    closings,
    node_history,
    unaccounted,
)
from tests.events import NOW

RECORDED, LAST_SEEN = NodeEndSource.RECORDED, NodeEndSource.LAST_SEEN


def at(s: float) -> datetime:
    return NOW + timedelta(seconds=s)


def launched(node: str, s: float = 0) -> Event[NodeLaunched]:
    data = NodeLaunched(
        node=node,
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        gpus=1,
        cpus=4,
        price_per_hour_usd=0.5,
        launched_at=NOW + timedelta(seconds=s),
    )
    return new_event(data, source="scaler", time=NOW + timedelta(seconds=s))


def test_open_nodes_are_the_launched_ones_with_no_release_and_no_loss() -> None:
    released = NodeReleased(
        node="b", pool="gpu-spot", reason=ReleaseReason.SCALED_DOWN, released_at=NOW
    )
    lost = NodeLost(node="c", pool="gpu-spot", source=NoticeSource.LOCAL)
    events: list[Event[Any]] = [launched("a"), launched("b"), launched("c"), launched("a", 50)]
    events += [
        new_event(released, source="scaler", time=NOW),
        new_event(lost, source="watcher", time=NOW),
    ]
    history = node_history(events)
    assert history.open == (OpenNode("a", "gpu-spot", NOW),)
    assert history.ended == {"b", "c"}


NODE = OpenNode("n", "gpu-spot", NOW)


@pytest.mark.parametrize(
    ("recorded", "last_seen", "expected"),
    [
        pytest.param(
            NodeEnd(at(90), RECORDED), at(60), NodeEnd(at(90), RECORDED), id="record-first"
        ),
        pytest.param(None, at(60), NodeEnd(at(60), LAST_SEEN), id="else-last-seen"),
        pytest.param(None, None, NodeEnd(NOW, LAST_SEEN), id="never-seen-ends-at-launch"),
        pytest.param(
            NodeEnd(at(-5), RECORDED), None, NodeEnd(NOW, RECORDED), id="never-before-launch"
        ),
        pytest.param(None, at(-5), NodeEnd(NOW, LAST_SEEN), id="sighting-before-launch"),
        pytest.param(
            NodeEnd(at(30), LAST_SEEN), at(60), NodeEnd(at(60), LAST_SEEN), id="later-sighting"
        ),
        pytest.param(
            NodeEnd(at(70), LAST_SEEN), at(60), NodeEnd(at(70), LAST_SEEN), id="later-stamp"
        ),
    ],
)
def test_best_end(recorded: NodeEnd | None, last_seen: datetime | None, expected: NodeEnd) -> None:
    assert best_end(NODE, recorded=recorded, last_seen=last_seen) == expected


def test_closings_leave_running_nodes_open() -> None:
    nodes = [OpenNode("up", "p", NOW), OpenNode("gone", "p", NOW), OpenNode("lost", "p", NOW)]
    closed = closings(
        nodes,
        running={"up"},
        recorded={"gone": NodeEnd(at(10), RECORDED), "up": NodeEnd(at(1), RECORDED)},
        last_seen={"lost": at(20)},
    )
    assert [(c.node, c.end) for c in closed] == [
        ("gone", NodeEnd(at(10), RECORDED)),
        ("lost", NodeEnd(at(20), LAST_SEEN)),
    ]


def test_unaccounted_nodes_are_those_not_seen_for_longer_than_the_staleness() -> None:
    nodes = [OpenNode("fresh", "p", NOW), OpenNode("stale", "p", NOW), OpenNode("never", "p", NOW)]
    found = unaccounted(
        nodes,
        last_seen={"fresh": at(95), "stale": at(40)},
        now=at(100),
        stale_after_s=15,
    )
    assert [(u.node, u.for_s) for u in found] == [("stale", 60.0), ("never", 100.0)]
