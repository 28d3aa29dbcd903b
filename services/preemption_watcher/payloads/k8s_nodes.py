"""What a Kubernetes Node watch event says about preemption: pure, no I/O, no side effects.

Which Node changes mean what, on GKE (sources checked for this module):
- GKE's graceful node shutdown (on by default since 1.20) is the kubelet's: on the VM's ACPI
  shutdown it reports its Node `Ready=False` with the message "node is shutting down"
  (kubernetes/kubernetes pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go). A Spot
  VM has 30 s from then, of which GKE gives non-system pods, Ray's among them, the first
  15 s and system pods the last 15 (GKE docs "Spot VMs" and "preemptible VMs",
  termination and graceful shutdown): the notice a training pod has is 15 s. Any VM
  shutdown does this, so a node the cluster autoscaler is removing
  (`ToBeDeletedByClusterAutoscaler`) is not news.
- `cloud.google.com/scheduled-maintenance-time` (a Unix time, in seconds) is the label GKE
  (1.31.1-gke.2008000 and later) puts on a GPU or TPU node whose VM has host maintenance
  scheduled, which ends an on-demand GPU VM (GKE docs "Manage GKE node disruption for GPUs
  and TPUs"). It may come days ahead: it is a notice once the time is `maintenance_notice_s`
  away, and the source reads its nodes again at every watch's end to see that come.
- `cloud.google.com/impending-node-termination` (NoSchedule) was put on a node by GKE's node
  termination handler when GCE announced the VM's end (`instance/preempted` 30 s ahead,
  host maintenance an hour ahead). GoogleCloudPlatform/k8s-node-termination-handler
  (main.go, termination/gceTerminationHandler.go), deprecated since Kubernetes 1.20 in
  favour of the graceful shutdown above: read still, for clusters that run it, never
  relied on. The handler writes the taint without `timeAdded`: only the node lifecycle
  controller sets it, and only on the not-ready and unreachable taints
  (kubernetes/kubernetes#42394, #141453). Without it the notice counts from when it is
  first seen.
- Not preemption, so ignored: `ToBeDeletedByClusterAutoscaler` and
  `DeletionCandidateOfClusterAutoscaler` (a scale-down), `node.kubernetes.io/not-ready` and
  `.../unreachable` (any unhealthy node). `node.cloudprovider.kubernetes.io/shutdown` never
  comes on GKE: its cloud provider does not implement `InstanceShutdown`
  (kubernetes/cloud-provider-gcp providers/gce/gce_instances.go).
- A Node deleted from the API is a lost node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from services.preemption_watcher.model import NodeSignal
from services.preemption_watcher.policy import NoticeRules, node_deadline
from shared.events.data import NodeLost, NodePreempting, NoticeSource

GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
"""The label GKE puts on every node with the name of its node pool."""
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"
SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
"""When the node's VM goes down for host maintenance, in Unix seconds (GPU and TPU nodes)."""
SCALE_DOWN_TAINT = "ToBeDeletedByClusterAutoscaler"
SHUTTING_DOWN = "node is shutting down"
"""What the kubelet's `Ready=False` message says during a graceful node shutdown."""
SPOT_LABELS = ("cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible")
"""Labels GKE sets to "true" on Spot and on preemptible VMs."""


class WatchEventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    ERROR = "ERROR"


@dataclass(frozen=True)
class NodeRules(NoticeRules):
    """How to read a Node: the label that names its pool, and how long each notice lasts
    (`policy.NoticeRules`: a node pool's own, where its shutdown grace was read)."""

    pool_label: str = GKE_NODEPOOL_LABEL


class MalformedNodeError(ValueError):
    """The object is not a Node this module can read, or its name or pool cannot be told on
    the bus; `reason` says which part and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed Kubernetes Node: {reason}")
        self.reason = reason


def _none_as(default: Any) -> BeforeValidator:
    # The API leaves out empty fields, but a client may send them as null.
    return BeforeValidator(lambda value: default if value is None else value)


class _Read(BaseModel):
    """The parts of the API's JSON this module reads; the rest is ignored."""

    model_config = ConfigDict(
        frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True
    )


class KubeTaint(_Read):
    key: str
    value: str | None = None
    effect: str
    time_added: AwareDatetime | None = None


class KubeCondition(_Read):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: AwareDatetime | None = None


class KubeNodeMeta(_Read):
    name: Annotated[str, Field(min_length=1)]
    uid: Annotated[str, Field(min_length=1)]
    labels: Annotated[dict[str, str], _none_as({})] = Field(default_factory=dict)


class KubeNodeSpec(_Read):
    taints: Annotated[tuple[KubeTaint, ...], _none_as(())] = ()


class KubeNodeInfo(_Read):
    boot_id: Annotated[str, Field(alias="bootID")] = ""
    """The kubelet reports a new one on every boot: a preempted VM restarted under the same
    Node object keeps its name and uid but not its boot id."""


class KubeNodeStatus(_Read):
    conditions: Annotated[tuple[KubeCondition, ...], _none_as(())] = ()
    node_info: KubeNodeInfo | None = None


class KubeNode(_Read):
    metadata: KubeNodeMeta
    spec: Annotated[KubeNodeSpec, _none_as({})] = KubeNodeSpec()
    status: Annotated[KubeNodeStatus, _none_as({})] = KubeNodeStatus()

    def taint(self, key: str) -> KubeTaint | None:
        return next((t for t in self.spec.taints if t.key == key), None)

    @property
    def is_spot(self) -> bool:
        return any(self.metadata.labels.get(label) == "true" for label in SPOT_LABELS)

    @property
    def boot_id(self) -> str:
        return self.status.node_info.boot_id if self.status.node_info else ""


def read_node(obj: Mapping[str, Any]) -> KubeNode:
    """The parts of a Node (the API's JSON, camelCase) that say what happens to it.

    Raises `MalformedNodeError` if a part it reads is missing or of the wrong type.
    """
    try:
        return KubeNode.model_validate(obj)
    except ValidationError as error:
        raise MalformedNodeError(_reasons(error)) from None


def node_signals(
    event_type: str,
    obj: Mapping[str, Any],
    *,
    now: datetime,
    rules: NodeRules = NodeRules(),
) -> list[NodeSignal]:
    """The signals one watch event implies: a notice, a loss, or none.

    `obj` is the Node as the API server sends it; `now` is when the event was seen. Events
    other than ADDED, MODIFIED and DELETED imply nothing and are not read.
    Raises `MalformedNodeError`. Pure: no I/O, no side effects.
    """
    if event_type not in (WatchEventType.ADDED, WatchEventType.MODIFIED, WatchEventType.DELETED):
        return []
    return signals_of(WatchEventType(event_type), read_node(obj), now=now, rules=rules)


def signals_of(
    event_type: WatchEventType,
    node: KubeNode,
    *,
    now: datetime,
    rules: NodeRules = NodeRules(),
) -> list[NodeSignal]:
    """`node_signals` for a Node already read; see there. Pure: no I/O, no side effects."""
    meta = node.metadata
    match event_type:
        case WatchEventType.DELETED:
            lost = _event(
                NodeLost,
                node=meta.name,
                pool=_pool(node, rules),
                source=NoticeSource.K8S,
                lost_at=now,
            )
            return [NodeSignal(key=f"{meta.uid}:deleted", data=lost)]
        case WatchEventType.ADDED | WatchEventType.MODIFIED:
            deadline = _deadline(node, now, rules)
            if deadline is None:
                return []
            notice = _event(
                NodePreempting,
                node=meta.name,
                pool=_pool(node, rules),
                deadline=deadline,
                source=NoticeSource.K8S,
            )
            # One notice per VM boot, whichever sign of it is seen first: the taint and the
            # kubelet's shutdown both announce the same end, and a Node object that outlives
            # its VM (GKE restarts a preempted VM under the same name) boots again.
            key = f"{meta.uid}@{node.boot_id or 'unknown-boot'}:preempting"
            return [NodeSignal(key=key, data=notice)]
        case _:
            return []


def _deadline(node: KubeNode, now: datetime, rules: NodeRules) -> datetime | None:
    """The node's signs, read, for `policy.node_deadline` to weigh."""
    taint = node.taint(IMPENDING_TERMINATION_TAINT)
    ready = next((c for c in node.status.conditions if c.type == "Ready"), None)
    shutting_down = (
        ready is not None
        and ready.status == "False"
        and SHUTTING_DOWN in (ready.message or "")
        and node.taint(SCALE_DOWN_TAINT) is None
    )
    return node_deadline(
        now=now,
        pool=_pool(node, rules),
        is_spot=node.is_spot,
        tainted=taint is not None,
        termination_taint_at=taint.time_added if taint is not None else None,
        maintenance_at=_scheduled_maintenance(node),
        shutting_down=shutting_down,
        shutting_down_since=ready.last_transition_time if ready is not None else None,
        rules=rules,
    )


def _scheduled_maintenance(node: KubeNode) -> datetime | None:
    value = node.metadata.labels.get(SCHEDULED_MAINTENANCE_LABEL)
    if value is None:
        return None
    try:
        return datetime.fromtimestamp(int(value), tz=UTC)
    except (ValueError, OverflowError, OSError):
        raise MalformedNodeError(
            f"label {SCHEDULED_MAINTENANCE_LABEL} is {value[:40]!r}, not a Unix time"
        ) from None


def _pool(node: KubeNode, rules: NodeRules) -> str | None:
    return node.metadata.labels.get(rules.pool_label)


E = TypeVar("E", NodePreempting, NodeLost)


def _event(kind: type[E], **fields: Any) -> E:
    try:
        return kind.model_validate(fields)
    except ValidationError as error:
        raise MalformedNodeError(_reasons(error)) from None


def _reasons(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc']) or 'the object'}: {e['msg']}"
        for e in error.errors()[:3]
    )
