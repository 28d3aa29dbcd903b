"""A local fake of the Compute Engine API the GKE provider calls: the aggregated operations
list (`GlobalOperationsClient.aggregated_list`), zonal managed instance groups (the VMs
behind each GKE node pool's zone: `InstanceGroupManagersClient.get`, `resize`,
`delete_instances`, `list_managed_instances`) and their zone operations
(`ZoneOperationsClient.get`, which the client's `ExtendedOperation` polls), for the real
clients pointed at it with the REST transport.

The groups follow Compute Engine's documentation of managed instance groups
(cloud.google.com/compute/docs/instance-groups, "Working with managed instances"): a
resize sets the target size and names the new instances at once; each is `CREATING`
until its VM boots (`NONE`, `RUNNING`); in a zone out of the machine type the create is
retried for ever, the instance stays `CREATING` with `lastAttempt.errors`
(`ZONE_RESOURCE_POOL_EXHAUSTED`) and the target is never reached; a resize down deletes
instances the group picks (here at random), while `deleteInstances` deletes the ones
named and lowers the target; operations run for a while before they are `DONE`; past a
rate of changes per second the API answers 429 (`rateLimitExceeded`).

As hard as the real one where the provider depends on it: results are paged
(`maxResults`, `pageToken`, at most 500 a page), grouped by zone with a warning for a zone
without any, filtered (only the `(field = "value") OR ...` expressions the real API takes
on `operationType`, `status` and `targetLink`; anything else is a 400, as an invalid
filter is), a project it does not hold is a 404, and every answer can be slowed down."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http import reply_json, serving

_AGGREGATED = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/operations$")
_CLAUSE = re.compile(
    r'^\(?\s*(?P<field>operationType|status|targetLink)\s*=\s*"(?P<value>[^"]*)"\s*\)?$'
)
_GROUP = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
    r"/instanceGroupManagers/(?P<group>[^/]+?)(?:/(?P<verb>resize|deleteInstances|"
    r"listManagedInstances))?$"
)
_ADVICE = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/]+)/advice/capacity$"
)
_ZONE_OPERATION = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)$"
)
MAX_PAGE = 500
COMPUTE = "https://www.googleapis.com/compute/v1"
STOCK_OUT = "ZONE_RESOURCE_POOL_EXHAUSTED"


@dataclass(frozen=True)
class FakeOperation:
    zone: str
    operation_type: str
    instance: str
    end_time: datetime
    status: str = "DONE"
    target_id: int | None = None
    """The VM's `id`: a VM recreated under its name has a new one."""

    def as_json(self, project: str, number: int) -> dict[str, Any]:
        base = "https://www.googleapis.com/compute/v1"
        zone_link = f"{base}/projects/{project}/zones/{self.zone}"
        return {
            "kind": "compute#operation",
            "id": str(7_000_000 + number),
            "name": f"operation-{number}-{self.operation_type.rsplit('.', 1)[-1]}",
            "zone": zone_link,
            "operationType": self.operation_type,
            "targetLink": f"{zone_link}/instances/{self.instance}",
            "targetId": str(self.target_id or 9_000_000 + number),
            "status": self.status,
            "user": "system"
            if "preempted" in self.operation_type
            else "gke@system.gserviceaccount.com",
            "progress": 100,
            "insertTime": self.end_time.isoformat(timespec="milliseconds"),
            "startTime": self.end_time.isoformat(timespec="milliseconds"),
            "endTime": self.end_time.isoformat(timespec="milliseconds"),
            "selfLink": f"{zone_link}/operations/operation-{number}",
        }


@dataclass
class FakeInstance:
    """One managed instance: named when the group decides to create it, a VM once booted."""

    name: str
    zone: str
    asked_at: float
    """When the group decided to create it (monotonic seconds)."""
    action: str = "CREATING"
    status: str | None = None
    errors: list[dict[str, str]] = field(default_factory=list)
    vm_id: int | None = None
    """The `id` of the VM now behind it; None until one is made."""

    def as_json(self, project: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "instance": f"{COMPUTE}/projects/{project}/zones/{self.zone}/instances/{self.name}",
            "name": self.name,
            "currentAction": self.action,
        }
        if self.status is not None:
            body["instanceStatus"] = self.status
        if self.vm_id is not None:
            body["id"] = str(self.vm_id)
        if self.errors:
            body["lastAttempt"] = {"errors": {"errors": self.errors}}
        return body


@dataclass
class FakeGroup:
    """A zonal managed instance group, as GKE makes one per node pool and zone."""

    zone: str
    name: str
    base_instance_name: str
    instances: dict[str, FakeInstance] = field(default_factory=dict)

    @property
    def target_size(self) -> int:
        return sum(1 for i in self.instances.values() if i.action != "DELETING")

    def url(self, project: str) -> str:
        return f"{COMPUTE}/projects/{project}/zones/{self.zone}/instanceGroupManagers/{self.name}"

    def as_json(self, project: str) -> dict[str, Any]:
        actions = {"creating": 0, "none": 0, "deleting": 0}
        for instance in self.instances.values():
            key = instance.action.lower()
            actions[key] = actions.get(key, 0) + 1
        return {
            "kind": "compute#instanceGroupManager",
            "name": self.name,
            "zone": f"{COMPUTE}/projects/{project}/zones/{self.zone}",
            "baseInstanceName": self.base_instance_name,
            "targetSize": self.target_size,
            "currentActions": actions,
            "status": {"isStable": all(i.action == "NONE" for i in self.instances.values())},
            "selfLink": self.url(project),
        }


@dataclass
class ZoneOperation:
    name: str
    zone: str
    operation_type: str
    target: str
    done_at: float
    error: dict[str, Any] | None = None


@dataclass
class FakeCompute:
    project: str
    zones: list[str]
    operations: list[FakeOperation] = field(default_factory=list)
    delay_s: float = 0.0
    requests: list[dict[str, list[str]]] = field(default_factory=list)
    endpoint: str = ""
    groups: dict[tuple[str, str], FakeGroup] = field(default_factory=dict)
    """Managed instance groups by (zone, name)."""
    stocked_out: set[str] = field(default_factory=set)
    """Zones out of the machine type: creates there fail and are retried for ever."""
    boot_s: float = 0.0
    recreate_after_s: float = 0.0
    """How long a preempted VM stays `TERMINATED` before its group recreates it."""
    """How long a VM takes to boot once its zone can serve it."""
    operation_s: float = 0.3
    """How long a change runs before its operation is DONE."""
    writes_per_s: int = 20
    """Changes accepted per second; past it, 429."""
    advice: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    """The capacity advice for Spot VMs per (zone, machine type): (obtainability, estimated
    uptime in seconds); a pair it has none for is unobtainable, with no uptime."""
    advised: list[dict[str, Any]] = field(default_factory=list)
    """Every capacity advice request's body, in order."""
    failing_deletes: int = 0
    """The next this many `deleteInstances` operations end in an error (a backend error)."""
    changes: list[tuple[str, str, str]] = field(default_factory=list)
    """(verb, group, detail) of every change accepted, in order."""
    polled: list[tuple[str, str]] = field(default_factory=list)
    """(operation, status answered) of every zone operation read, in order."""
    _zone_ops: dict[str, ZoneOperation] = field(default_factory=dict)
    _writes: list[float] = field(default_factory=list)
    _named: int = 0
    _vm_ids: int = 5_000_000
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _random: random.Random = field(default_factory=lambda: random.Random(7))  # noqa: S311

    def add_group(
        self, zone: str, name: str, base_instance_name: str, running: Sequence[str] = ()
    ) -> FakeGroup:
        group = FakeGroup(zone, name, base_instance_name)
        for vm in running:
            self._vm_ids += 1
            group.instances[vm] = FakeInstance(
                vm,
                zone,
                asked_at=time.monotonic(),
                action="NONE",
                status="RUNNING",
                vm_id=self._vm_ids,
            )
        self.groups[(zone, name)] = group
        return group

    def running(self, group: FakeGroup) -> list[str]:
        """The VMs of the group that booted (what Kubernetes would list as nodes)."""
        with self._lock:
            self._tick()
            return [i.name for i in group.instances.values() if i.status == "RUNNING"]

    def set_target(self, group: FakeGroup, size: int) -> None:
        """What a resize does, whoever asks (the API, or GKE's own setSize): grows with new
        names, shrinks by deleting instances the group picks, at random."""
        now = time.monotonic()
        live = [i for i in group.instances.values() if i.action != "DELETING"]
        for _ in range(size - len(live)):
            self._named += 1
            name = f"{group.base_instance_name}-{self._named:04x}"
            group.instances[name] = FakeInstance(name, group.zone, asked_at=now)
        if size < len(live):
            for victim in self._random.sample(live, len(live) - size):
                self._delete(group, victim.name)
        self.changes.append(("resize", group.name, str(size)))

    def preempt(self, name: str) -> None:
        """Compute Engine takes a spot VM back: it is `TERMINATED` (its `id` still the
        old VM's) until its group, which keeps its target size, notices and recreates it
        under the same name as a new VM (`RECREATING`, after `recreate_after_s`, until it
        boots)."""
        with self._lock:
            for group in self.groups.values():
                if (instance := group.instances.get(name)) is not None:
                    self.operations.append(
                        FakeOperation(
                            group.zone,
                            "compute.instances.preempted",
                            name,
                            datetime.now(UTC),
                            target_id=instance.vm_id,
                        )
                    )
                    instance.action, instance.status = "NONE", "TERMINATED"
                    instance.asked_at = time.monotonic()

    def replace(self, group: FakeGroup, name: str) -> str:
        """What a surge upgrade does to one node: a new VM under a new name first, then
        the old one deleted. Returns the new instance's name."""
        with self._lock:
            self._named += 1
            made = f"{group.base_instance_name}-{self._named:04x}"
            group.instances[made] = FakeInstance(made, group.zone, asked_at=time.monotonic())
            self._delete(group, name)
            return made

    def _delete(self, group: FakeGroup, name: str) -> None:
        gone = group.instances.pop(name, None)
        self.operations.append(
            FakeOperation(
                group.zone,
                "delete",
                name,
                datetime.now(UTC),
                target_id=None if gone is None else gone.vm_id,
            )
        )

    def _tick(self) -> None:
        now = time.monotonic()
        for group in self.groups.values():
            for instance in group.instances.values():
                if instance.status == "TERMINATED" and now - instance.asked_at >= (
                    self.recreate_after_s
                ):
                    instance.action, instance.status, instance.vm_id = "RECREATING", None, None
                    instance.asked_at = now
                if instance.action not in ("CREATING", "RECREATING"):
                    continue
                if group.zone in self.stocked_out:
                    message = (
                        f"The zone 'projects/{self.project}/zones/{group.zone}' does not have"
                        " enough resources available to fulfill the request.  Try a different"
                        " zone, or try again later."
                    )
                    instance.errors = [{"code": STOCK_OUT, "message": message}]
                elif now - instance.asked_at >= self.boot_s:
                    instance.action, instance.status, instance.errors = "NONE", "RUNNING", []
                    self._vm_ids += 1
                    instance.vm_id = self._vm_ids
                    # Compute Engine's record of the VM's making, as its `insert` operation.
                    self.operations.append(
                        FakeOperation(
                            group.zone,
                            "insert",
                            instance.name,
                            datetime.now(UTC),
                            target_id=instance.vm_id,
                        )
                    )

    def answer(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        time.sleep(self.delay_s)
        with self._lock:
            self._tick()
            if (group := _GROUP.match(path)) is not None:
                return self._answer_group(method, group, query, body)
            if (op := _ZONE_OPERATION.match(path)) is not None:
                return self._answer_operation(op)
            if (advice := _ADVICE.match(path)) is not None and method == "POST":
                return self._answer_advice(advice, body)
            return self._answer_aggregated(path, query)

    def _answer_group(
        self, method: str, match: re.Match[str], query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        group = self.groups.get((match["zone"], match["group"]))
        if match["project"] != self.project or group is None:
            where = f"projects/{match['project']}/zones/{match['zone']}"
            return _error(
                404, f"The resource '{where}/instanceGroupManagers/{match['group']}' was not found"
            )
        verb = match["verb"]
        if verb is None and method == "GET":
            return 200, group.as_json(self.project)
        if verb == "listManagedInstances" and method == "POST":
            size = min(int(query.get("maxResults", [str(MAX_PAGE)])[0]), MAX_PAGE)
            start = int(query.get("pageToken", ["0"])[0] or 0)
            listed = list(group.instances.values())
            page = [i.as_json(self.project) for i in listed[start : start + size]]
            answer: dict[str, Any] = {"managedInstances": page}
            if start + size < len(listed):
                answer["nextPageToken"] = str(start + size)
            return 200, answer
        if method != "POST" or verb not in ("resize", "deleteInstances"):
            return _error(400, f"{method} {verb} is not served here")
        return self._change(group, verb, query, body)

    def _change(
        self, group: FakeGroup, verb: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        self._writes = [t for t in self._writes if now - t < 1.0]
        if len(self._writes) >= self.writes_per_s:
            reason = {"message": "Rate Limit Exceeded", "domain": "usageLimits"}
            return 429, {
                "error": {
                    "code": 429,
                    "message": "Rate Limit Exceeded",
                    "errors": [{**reason, "reason": "rateLimitExceeded"}],
                }
            }
        self._writes.append(now)
        error = None
        if verb == "resize":
            if "size" not in query or int(query["size"][0]) < 0:
                return _error(400, "Invalid value for field 'size': must be at least 0")
            self.set_target(group, int(query["size"][0]))
        else:
            wanted = [url.rsplit("/", 1)[-1] for url in body.get("instances", [])]
            strangers = [name for name in wanted if name not in group.instances]
            if strangers and not body.get("skipInstancesOnValidationError"):
                return _error(400, f"Instance '{strangers[0]}' is not a member of {group.name}")
            if self.failing_deletes > 0:
                self.failing_deletes -= 1
                error = {"errors": [{"code": "INTERNAL_ERROR", "message": "Internal error."}]}
            else:
                for name in wanted:
                    if name in group.instances:
                        self._delete(group, name)
                self.changes.append(("deleteInstances", group.name, ",".join(wanted)))
        number = len(self._zone_ops) + 1
        operation = ZoneOperation(
            name=f"operation-{number}-{verb}",
            zone=group.zone,
            operation_type=f"compute.instanceGroupManagers.{verb}",
            target=group.url(self.project),
            done_at=now + self.operation_s,
            error=error,
        )
        self._zone_ops[operation.name] = operation
        return 200, self._operation_json(operation)

    def _answer_advice(
        self, match: re.Match[str], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """Compute Engine's `advice.capacity` ("View Spot VM availability"): for Spot VMs
        only, of named machine types, in zones of the region asked; one recommendation per
        zone and machine type, the most obtainable first."""
        self.advised.append(body)
        if match["project"] != self.project:
            return _error(404, f"The resource 'projects/{match['project']}' was not found")
        region = match["region"]
        scheduling = body.get("instanceProperties", {}).get("scheduling", {})
        if scheduling.get("provisioningModel") != "SPOT":
            return _error(400, "Invalid value for field 'provisioningModel': only SPOT is advised")
        size = int(body.get("size", 0))
        if not 1 <= size <= 1000:
            return _error(400, f"Invalid value for field 'size': {size}")
        selections = body.get("instanceFlexibilityPolicy", {}).get("instanceSelections", {})
        machines = [m for s in selections.values() for m in s.get("machineTypes", [])]
        if not machines:
            return _error(400, "Required field 'instanceSelections.machineTypes' not specified")
        zones = []
        for entry in body.get("distributionPolicy", {}).get("zones", []):
            zone = str(entry.get("zone", "")).rsplit("/", 1)[-1]
            if not zone.startswith(f"{region}-"):
                return _error(400, f"Invalid value for field 'zone': {entry.get('zone')}")
            zones.append(zone)
        if not zones:
            return _error(400, "Required field 'distributionPolicy.zones' not specified")
        found: list[dict[str, Any]] = []
        for zone in zones:
            for machine in machines:
                obtainability, uptime_s = self.advice.get((zone, machine), (0.0, 0))
                scores: dict[str, Any] = {"obtainability": obtainability}
                if uptime_s:
                    scores["estimatedUptime"] = f"{uptime_s}s"
                shard = {
                    "zone": zone,
                    "machineType": machine,
                    "instanceCount": size,
                    "provisioningModel": "SPOT",
                }
                found.append({"scores": scores, "shards": [shard]})
        found.sort(key=lambda r: -r["scores"]["obtainability"])
        return 200, {"recommendations": found}

    def _answer_operation(self, match: re.Match[str]) -> tuple[int, dict[str, Any]]:
        operation = self._zone_ops.get(match["op"])
        if operation is None or operation.zone != match["zone"]:
            return _error(404, f"The resource 'operations/{match['op']}' was not found")
        answer = self._operation_json(operation)
        self.polled.append((operation.name, answer["status"]))
        return 200, answer

    def _operation_json(self, operation: ZoneOperation) -> dict[str, Any]:
        done = time.monotonic() >= operation.done_at
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "name": operation.name,
            "zone": f"{COMPUTE}/projects/{self.project}/zones/{operation.zone}",
            "operationType": operation.operation_type,
            "targetLink": operation.target,
            "status": "DONE" if done else "RUNNING",
            "progress": 100 if done else 0,
            "selfLink": f"{COMPUTE}/projects/{self.project}/zones/{operation.zone}"
            f"/operations/{operation.name}",
        }
        if done and operation.error is not None:
            body["error"] = operation.error
            body["httpErrorStatusCode"] = 500
            body["httpErrorMessage"] = "INTERNAL SERVER ERROR"
        return body

    def _answer_aggregated(
        self, path: str, query: dict[str, list[str]]
    ) -> tuple[int, dict[str, Any]]:
        self.requests.append(query)
        match = _AGGREGATED.match(path)
        if match is None:
            return _error(404, f"The requested URL {path} was not found on this server.")
        if match["project"] != self.project:
            return _error(404, f"The resource 'projects/{match['project']}' was not found")
        try:
            clauses = _parse_filter(query.get("filter", [""])[0])
        except ValueError as error:
            return _error(400, f"Invalid value for field 'filter': {error}")
        size = min(int(query.get("maxResults", [str(MAX_PAGE)])[0]), MAX_PAGE)
        start = int(query.get("pageToken", ["0"])[0] or 0)
        chosen = [
            (number, op)
            for number, op in enumerate(self.operations)
            if not clauses or any(_holds(op, self.project, number, c) for c in clauses)
        ]
        page = chosen[start : start + size]
        items: dict[str, Any] = {}
        for zone in self.zones:
            ops = [op.as_json(self.project, n) for n, op in page if op.zone == zone]
            key = f"zones/{zone}"
            if ops:
                items[key] = {"operations": ops}
            else:
                items[key] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": "There are no results for scope 'zones/"
                        + zone
                        + "' on this page.",
                        "data": [{"key": "scope", "value": key}],
                    }
                }
        body: dict[str, Any] = {
            "kind": "compute#operationAggregatedList",
            "id": f"projects/{self.project}/aggregated/operations",
            "items": items,
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{self.project}/aggregated/operations",
        }
        if start + size < len(chosen):
            body["nextPageToken"] = str(start + size)
        return 200, body


def _parse_filter(text: str) -> list[tuple[str, str]]:
    if not text.strip():
        return []
    clauses = []
    for part in re.split(r"\s+OR\s+", text.strip()):
        match = _CLAUSE.match(part.strip())
        if match is None:
            msg = f"'{text}' is not a valid filter expression"
            raise ValueError(msg)
        clauses.append((match["field"], match["value"]))
    return clauses


def _holds(op: FakeOperation, project: str, number: int, clause: tuple[str, str]) -> bool:
    name, value = clause
    return str(op.as_json(project, number)[name]) == value


def _error(code: int, message: str) -> tuple[int, dict[str, Any]]:
    reason = "invalid" if code == 400 else "notFound"
    return code, {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


@contextmanager
def serve_fake_compute(compute: FakeCompute) -> Iterator[FakeCompute]:
    """Serves `compute` on 127.0.0.1 at a free port, in a thread, until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def _answer(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            reply_json(self, *compute.answer(self.command, url.path, parse_qs(url.query), body))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler, "fake-compute") as endpoint:
        compute.endpoint = endpoint
        yield compute
