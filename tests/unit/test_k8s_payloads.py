"""Reading Kubernetes Node watch events: which Node changes are notices, losses, or nothing."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.preemption_watcher.payloads.k8s_nodes import (
    IMPENDING_TERMINATION_TAINT,
    SCALE_DOWN_TAINT,
    MalformedNodeError,
    NodeRules,
    node_signals,
)
from shared.events.data import NodeLost, NodePreempting, NoticeSource

DATA = Path(__file__).parents[1] / "data" / "k8s"
SPOT_NOTICE_S = 15.0
"""What GKE gives a training pod of a Spot VM's end."""
NOW = datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC)
SPOT_NAME = "gke-spotrain-gpu-spot-5f1c2a3b-x7k2"
SPOT_UID = "3c0f9f7e-8a51-4c2b-9d7e-2f6a1b4c5d01"
SPOT_BOOT = "a1d6b1e0-5a0c-4b4e-8c3f-7e29c1f0b6a2"
SPOT_NOTICE_KEY = f"{SPOT_UID}@{SPOT_BOOT}:preempting"
TAINTED_AT = "2026-11-30T11:59:58Z"
KUBELET_DOWN_AT = datetime(2026, 11, 30, 12, 0, 4, tzinfo=UTC)
"""The kubelet's `Ready=False` transition in gke-spot-node-shutting-down.json."""


def recorded(name: str) -> dict[str, Any]:
    node: dict[str, Any] = json.loads((DATA / name).read_text())
    return node


def with_taint(node: dict[str, Any], taint: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(node)
    node["spec"].setdefault("taints", []).append(taint)
    return node


def termination_taint(time_added: str | None = TAINTED_AT) -> dict[str, Any]:
    taint: dict[str, Any] = {"key": IMPENDING_TERMINATION_TAINT, "effect": "NoSchedule"}
    if time_added is not None:
        taint["timeAdded"] = time_added
    return taint


def relabelled(
    node: dict[str, Any], *, drop: str | None = None, add: dict[str, str] | None = None
) -> dict[str, Any]:
    node = copy.deepcopy(node)
    if drop is not None:
        del node["metadata"]["labels"][drop]
    node["metadata"]["labels"].update(add or {})
    return node


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


SPOT = recorded("gke-spot-node.json")


@pytest.mark.parametrize(
    ("event", "node", "rules", "expected_deadline", "expected_pool"),
    [
        pytest.param(
            "MODIFIED",
            with_taint(SPOT, termination_taint()),
            NodeRules(),
            at(TAINTED_AT) + timedelta(seconds=SPOT_NOTICE_S),
            "gpu-spot",
            id="spot-taint-counts-from-time-added",
        ),
        pytest.param(
            "ADDED",
            with_taint(SPOT, termination_taint()),
            NodeRules(),
            at(TAINTED_AT) + timedelta(seconds=SPOT_NOTICE_S),
            "gpu-spot",
            id="listed-already-tainted",
        ),
        pytest.param(
            "MODIFIED",
            recorded("gke-spot-node-impending-termination.json"),
            NodeRules(),
            NOW + timedelta(seconds=SPOT_NOTICE_S),
            "gpu-spot",
            id="taint-without-time-added-counts-from-now",
        ),
        pytest.param(
            "MODIFIED",
            recorded("gke-spot-node-shutting-down.json"),
            NodeRules(),
            KUBELET_DOWN_AT + timedelta(seconds=SPOT_NOTICE_S),
            "gpu-spot",
            id="kubelet-shutdown-time-beats-an-untimed-taint",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(relabelled(SPOT, drop="cloud.google.com/gke-spot"), termination_taint()),
            NodeRules(),
            at(TAINTED_AT) + timedelta(hours=1),
            "gpu-spot",
            id="on-demand-taint-is-host-maintenance",
        ),
        pytest.param(
            "MODIFIED",
            recorded("gke-gpu-node-host-maintenance.json"),
            NodeRules(maintenance_notice_s=1800),
            NOW + timedelta(minutes=30),
            "gpu-on-demand",
            id="recorded-host-maintenance",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(
                relabelled(
                    SPOT,
                    drop="cloud.google.com/gke-spot",
                    add={"cloud.google.com/gke-preemptible": "true"},
                ),
                termination_taint(),
            ),
            NodeRules(),
            at(TAINTED_AT) + timedelta(seconds=SPOT_NOTICE_S),
            "gpu-spot",
            id="preemptible-vm-has-the-spot-notice",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(SPOT, termination_taint()),
            NodeRules(notice_s=120),
            at(TAINTED_AT) + timedelta(seconds=120),
            "gpu-spot",
            id="notice-is-a-parameter",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(relabelled(SPOT, drop="cloud.google.com/gke-nodepool"), termination_taint()),
            NodeRules(),
            at(TAINTED_AT) + timedelta(seconds=SPOT_NOTICE_S),
            None,
            id="no-pool-label-no-pool",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(SPOT, termination_taint()),
            NodeRules(pool_label="cloud.google.com/machine-family"),
            at(TAINTED_AT) + timedelta(seconds=SPOT_NOTICE_S),
            "g2",
            id="pool-label-is-a-parameter",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(
                recorded("gke-spot-node-scale-down.json"),
                termination_taint(),
            ),
            NodeRules(),
            at(TAINTED_AT) + timedelta(seconds=SPOT_NOTICE_S),
            "gpu-spot",
            id="preempted-while-being-scaled-down",
        ),
    ],
)
def test_a_termination_sign_is_one_notice(
    event: str,
    node: dict[str, Any],
    rules: NodeRules,
    expected_deadline: datetime,
    expected_pool: str | None,
) -> None:
    """A node told it will go yields one notice: its deadline, its pool, keyed by boot."""
    (signal,) = node_signals(event, node, now=NOW, rules=rules)
    assert signal.data == NodePreempting(
        node=node["metadata"]["name"],
        pool=expected_pool,
        deadline=expected_deadline,
        source=NoticeSource.K8S,
    )
    uid, boot = node["metadata"]["uid"], node["status"]["nodeInfo"]["bootID"]
    assert signal.key == f"{uid}@{boot}:preempting"


def shutting_down(node: dict[str, Any], message: str = "node is shutting down") -> dict[str, Any]:
    node = copy.deepcopy(node)
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    ready.update(status="False", reason="KubeletNotReady", message=message)
    return node


@pytest.mark.parametrize(
    ("event", "node"),
    [
        pytest.param("ADDED", SPOT, id="healthy-spot-node"),
        pytest.param("MODIFIED", SPOT, id="healthy-spot-node-changed"),
        pytest.param(
            "MODIFIED", recorded("gke-spot-node-scale-down.json"), id="autoscaler-scale-down"
        ),
        pytest.param(
            "MODIFIED",
            recorded("gke-spot-node-scale-down-shutting-down.json"),
            id="autoscaler-removed-vm-shuts-down",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(
                SPOT,
                {"key": "DeletionCandidateOfClusterAutoscaler", "effect": "PreferNoSchedule"},
            ),
            id="autoscaler-deletion-candidate",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(
                with_taint(
                    shutting_down(SPOT, "container runtime is down"),
                    {
                        "key": "node.kubernetes.io/not-ready",
                        "effect": "NoExecute",
                        "timeAdded": "2026-11-30T12:00:09Z",
                    },
                ),
                {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
            ),
            id="not-ready-for-another-reason",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(SPOT, {"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": ""}),
            id="cloud-provider-shutdown-taint-is-not-gke",
        ),
        pytest.param(
            "MODIFIED",
            with_taint(
                SPOT, {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
            ),
            id="spot-pool-taint",
        ),
        pytest.param("BOOKMARK", {"metadata": {"resourceVersion": "48213377"}}, id="bookmark"),
        pytest.param("ERROR", {"kind": "Status", "code": 410}, id="error-is-the-adapters"),
    ],
)
def test_nothing_else_is_a_signal(event: str, node: dict[str, Any]) -> None:
    """Scale-downs, unhealthy nodes, other taints and non-node events yield nothing."""
    assert node_signals(event, node, now=NOW) == []


def test_a_deleted_node_is_lost_at_now() -> None:
    """DELETED yields one loss, at the time it was seen, keyed by the node's uid."""
    (signal,) = node_signals("DELETED", SPOT, now=NOW)
    assert signal.key == f"{SPOT_UID}:deleted"
    assert signal.data == NodeLost(
        node=SPOT_NAME, pool="gpu-spot", source=NoticeSource.K8S, lost_at=NOW
    )


def test_a_deleted_tainted_node_is_only_lost() -> None:
    """A notice is moot once the node is gone: its deletion is only a loss."""
    signals = node_signals("DELETED", recorded("gke-spot-node-shutting-down.json"), now=NOW)
    assert [type(s.data) for s in signals] == [NodeLost]


def test_taint_and_kubelet_shutdown_are_one_notice() -> None:
    """The taint, then the kubelet's shutdown, announce one end: the same key."""
    tainted = node_signals(
        "MODIFIED", recorded("gke-spot-node-impending-termination.json"), now=NOW
    )
    down = node_signals(
        "MODIFIED",
        recorded("gke-spot-node-shutting-down.json"),
        now=NOW + timedelta(seconds=4),
    )
    assert [s.key for s in tainted] == [s.key for s in down] == [SPOT_NOTICE_KEY]


def test_a_new_boot_is_a_new_notice() -> None:
    """A preempted VM restarted under the same Node object is told again under a new key."""
    rebooted = copy.deepcopy(with_taint(SPOT, termination_taint()))
    rebooted["status"]["nodeInfo"]["bootID"] = "5e1b0c2d-7f3a-4b9e-8d6c-1a2b3c4d5e6f"
    (first,) = node_signals("MODIFIED", with_taint(SPOT, termination_taint()), now=NOW)
    (second,) = node_signals("MODIFIED", rebooted, now=NOW)
    assert first.key != second.key


def test_kubelet_shutdown_alone_is_a_notice() -> None:
    """Without the taint, the kubelet's graceful shutdown is the notice, from its transition:
    the 15 s GKE gives a training pod of the Spot VM's 30 (issue 20, 7)."""
    node = shutting_down(SPOT)
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    ready["lastTransitionTime"] = "2026-11-30T12:00:01Z"
    (signal,) = node_signals("MODIFIED", node, now=NOW)
    assert isinstance(signal.data, NodePreempting)
    assert signal.data.deadline == datetime(2026, 11, 30, 12, 0, 16, tzinfo=UTC)
    assert signal.key == SPOT_NOTICE_KEY


MAINTENANCE = "cloud.google.com/scheduled-maintenance-time"


@pytest.mark.parametrize(
    ("ahead", "told"),
    [
        pytest.param(timedelta(minutes=59), True, id="within-the-hour-is-a-notice"),
        pytest.param(timedelta(hours=1), True, id="an-hour-ahead-is-a-notice"),
        pytest.param(timedelta(days=3), False, id="days-ahead-is-not-yet"),
        pytest.param(-timedelta(minutes=1), True, id="overdue-is-a-notice"),
    ],
)
def test_scheduled_host_maintenance_is_a_notice_once_it_is_near(
    ahead: timedelta, told: bool
) -> None:
    """GKE's current sign of a GPU VM's host maintenance is a label with its time; the
    deprecated handler's taint is not there (issue 20, 7)."""
    when = NOW + ahead
    node = relabelled(
        SPOT, drop="cloud.google.com/gke-spot", add={MAINTENANCE: str(int(when.timestamp()))}
    )
    notices = [s.data for s in node_signals("MODIFIED", node, now=NOW)]
    assert [n.deadline for n in notices if isinstance(n, NodePreempting)] == (
        [when] if told else []
    )
    assert len(notices) == int(told)


def test_an_unreadable_maintenance_time_is_a_malformed_node() -> None:
    node = relabelled(SPOT, add={MAINTENANCE: "next tuesday"})
    with pytest.raises(MalformedNodeError, match="not a Unix time"):
        node_signals("MODIFIED", node, now=NOW)


def break_node(change: str) -> dict[str, Any]:
    node = copy.deepcopy(SPOT)
    match change:
        case "no-uid":
            del node["metadata"]["uid"]
        case "no-name":
            node["metadata"]["name"] = ""
        case "labels-not-a-map":
            node["metadata"]["labels"] = ["cloud.google.com/gke-nodepool=gpu-spot"]
        case "taints-not-a-list":
            node["spec"]["taints"] = {"key": IMPENDING_TERMINATION_TAINT}
        case "bad-time-added":
            node["spec"]["taints"] = [termination_taint("yesterday")]
        case "naive-time-added":
            node["spec"]["taints"] = [termination_taint("2026-11-30T11:59:58")]
        case "name-too-long-for-the-bus":
            node["metadata"]["name"] = "n" * 200
            node["spec"]["taints"] = [termination_taint()]
        case "pool-not-a-name":
            node["metadata"]["labels"]["cloud.google.com/gke-nodepool"] = "gpu spot"
            node["spec"]["taints"] = [termination_taint()]
        case "not-an-object":
            return {"metadata": "gke-node"}
    return node


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param("no-uid", "metadata.uid", id="no-uid"),
        pytest.param("no-name", "metadata.name", id="empty-name"),
        pytest.param("labels-not-a-map", "metadata.labels", id="labels-not-a-map"),
        pytest.param("taints-not-a-list", "spec.taints", id="taints-not-a-list"),
        pytest.param("bad-time-added", "spec.taints.0.timeAdded", id="bad-time-added"),
        pytest.param("naive-time-added", "spec.taints.0.timeAdded", id="naive-time-added"),
        pytest.param("name-too-long-for-the-bus", "node", id="name-too-long-for-the-bus"),
        pytest.param("pool-not-a-name", "pool", id="pool-not-a-name"),
        pytest.param("not-an-object", "metadata", id="metadata-not-an-object"),
    ],
)
def test_a_malformed_node_says_why(change: str, reason: str) -> None:
    """A part that cannot be read raises MalformedNodeError naming that part."""
    with pytest.raises(MalformedNodeError) as raised:
        node_signals("MODIFIED", break_node(change), now=NOW)
    assert raised.value.reason.startswith(reason)
    assert isinstance(raised.value, ValueError)


def test_an_unread_event_is_not_validated() -> None:
    """A BOOKMARK's partial object is not a Node and is not read as one."""
    assert node_signals("BOOKMARK", {"kind": "Node"}, now=NOW) == []


# --- invariants ---------------------------------------------------------------------------

label_keys = st.one_of(
    st.sampled_from(
        [
            "cloud.google.com/gke-nodepool",
            "cloud.google.com/gke-spot",
            "cloud.google.com/gke-preemptible",
        ]
    ),
    st.text(max_size=40),
)
label_values = st.one_of(st.sampled_from(["true", "false", "gpu-spot", ""]), st.text(max_size=70))
times = st.datetimes(
    min_value=datetime(2020, 1, 1),
    max_value=datetime(2035, 1, 1),
    timezones=st.just(UTC),
).map(lambda t: t.replace(microsecond=0).isoformat().replace("+00:00", "Z"))
taints = st.fixed_dictionaries(
    {
        "key": st.one_of(
            st.sampled_from(
                [
                    IMPENDING_TERMINATION_TAINT,
                    SCALE_DOWN_TAINT,
                    "node.kubernetes.io/not-ready",
                    "nvidia.com/gpu",
                ]
            ),
            st.text(max_size=30),
        ),
        "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", ""]),
    },
    optional={"value": st.text(max_size=20), "timeAdded": times},
)
ready_messages = st.sampled_from(
    ["kubelet is posting ready status", "node is shutting down", "PLEG is not healthy"]
)


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Any]:
    node = copy.deepcopy(SPOT)
    node["metadata"]["labels"] = draw(st.dictionaries(label_keys, label_values, max_size=8))
    node["spec"]["taints"] = draw(st.lists(taints, max_size=5))
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    ready["status"] = draw(st.sampled_from(["True", "False", "Unknown"]))
    ready["message"] = draw(ready_messages)
    ready["lastTransitionTime"] = draw(times)
    return node


@settings(max_examples=300, deadline=None)
@given(node=nodes(), event=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
def test_any_labels_and_taints_give_signals_or_the_documented_error(
    node: dict[str, Any], event: str
) -> None:
    """Arbitrary labels and taints never crash: signals, or MalformedNodeError."""
    reason: str | None = None
    try:
        signals = node_signals(event, node, now=NOW)
    except MalformedNodeError as error:
        signals, reason = [], error.reason
    if reason is not None:
        assert reason, "the error says why"
        return
    assert len(signals) <= 1
    if event == "DELETED":
        assert [type(s.data) for s in signals] == [NodeLost]
    for signal in signals:
        assert signal.data.node == SPOT_NAME
        assert signal.data.source is NoticeSource.K8S


@settings(max_examples=300, deadline=None)
@given(
    node=nodes(),
    event=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
    later_s=st.integers(0, 86_400),
    version=st.integers(1, 10**9),
)
def test_the_same_node_seen_again_has_the_same_key(
    node: dict[str, Any], event: str, later_s: int, version: int
) -> None:
    """Seen again later (a relist), with a new resource version, a node's signals keep
    their keys: the key never depends on when it was seen."""
    again = copy.deepcopy(node)
    again["metadata"]["resourceVersion"] = str(version)
    try:
        first = node_signals(event, node, now=NOW)
    except MalformedNodeError:
        return
    relisted = node_signals(
        "ADDED" if event != "DELETED" else event,
        again,
        now=NOW + timedelta(seconds=later_s),
    )
    assert [s.key for s in relisted] == [s.key for s in first]


@settings(max_examples=300, deadline=None)
@given(node=nodes())
def test_a_notice_comes_only_from_a_termination_sign(node: dict[str, Any]) -> None:
    """A notice needs the termination taint or the kubelet's shutdown, and its deadline
    is never before the sign it comes from."""
    try:
        signals = node_signals("MODIFIED", node, now=NOW)
    except MalformedNodeError:
        return
    taint_keys = {t["key"] for t in node["spec"]["taints"]}
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    kubelet_down = ready["status"] == "False" and ready["message"] == "node is shutting down"
    if not signals:
        assert IMPENDING_TERMINATION_TAINT not in taint_keys
        assert not kubelet_down or SCALE_DOWN_TAINT in taint_keys
        return
    (signal,) = signals
    assert isinstance(signal.data, NodePreempting)
    assert IMPENDING_TERMINATION_TAINT in taint_keys or kubelet_down
    signs = [
        datetime.fromisoformat(t.get("timeAdded", NOW.isoformat()))
        for t in node["spec"]["taints"]
        if t["key"] == IMPENDING_TERMINATION_TAINT
    ]
    if kubelet_down and SCALE_DOWN_TAINT not in taint_keys:
        signs.append(datetime.fromisoformat(ready["lastTransitionTime"]))
    assert signal.data.deadline > min(signs)
