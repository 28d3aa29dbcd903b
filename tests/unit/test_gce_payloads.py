"""GCE audit log entries, as a logging sink publishes them, read into preemption signals.

The entries under tests/data/gce/ follow the LogEntry and AuditLog shapes Cloud Logging
exports for `compute.instances.preempted` (system event) and for other Compute methods.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.preemption_watcher.payloads.gce_logging import (
    GCE_PREEMPTION_NOTICE,
    MalformedEntryError,
    read_preemption,
)
from shared.events.data import NodePreempting, NoticeSource

DATA = Path(__file__).parents[1] / "data" / "gce"


def entry(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return loaded


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("name", "node", "key", "deadline"),
    [
        pytest.param(
            "preempted_spot_node",
            "gke-train-gpu-spot-5f3c2a1b-x7kq",
            "systemevent-1773480413000-64d7f2a9c1b3e-8a2f41c7-3e9b5d06",
            datetime(2026, 3, 14, 9, 27, 23, 358904, tzinfo=UTC),
            id="one-part-operation",
        ),
        pytest.param(
            "preempted_first_part",
            "gke-train-gpu-spot-5f3c2a1b-q2wm",
            "systemevent-1773486137000-64d80a1f55c2a-1d7e93b0-6f2c8e45",
            datetime(2026, 3, 14, 11, 2, 47, 104112, tzinfo=UTC),
            id="first-part",
        ),
        pytest.param(
            "preempted_last_part",
            "gke-train-gpu-spot-5f3c2a1b-q2wm",
            "systemevent-1773486137000-64d80a1f55c2a-1d7e93b0-6f2c8e45",
            datetime(2026, 3, 14, 11, 3, 17, 611873, tzinfo=UTC),
            id="last-part-same-key",
        ),
        pytest.param(
            "preempted_without_operation",
            "gke-train-cpu-spot-0a9e77d2-mm3z",
            "-7hk2d4e2f9aa",
            datetime(2026, 3, 15, 2, 41, 39, 213, tzinfo=UTC),
            id="no-operation-keys-by-insert-id",
        ),
    ],
)
def test_a_preemption_entry_is_a_notice_for_its_instance(
    name: str, node: str, key: str, deadline: datetime
) -> None:
    """The node is the instance, the deadline the entry's time plus GCE's 30 s."""
    signal = read_preemption(raw(entry(name)))
    assert signal is not None
    assert signal.key == key
    assert signal.data == NodePreempting(
        node=node, pool=None, deadline=deadline, source=NoticeSource.GCE_PUBSUB
    )


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("host_maintenance", id="system-event-migrate"),
        pytest.param("instance_stopped_by_user", id="activity-stop"),
    ],
)
def test_other_compute_entries_are_not_preemptions(name: str) -> None:
    """Another methodName, even for a GKE node, is no signal and no error."""
    assert read_preemption(raw(entry(name))) is None


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(
            {
                "insertId": "1j2k3l",
                "timestamp": "2026-03-14T09:26:53Z",
                "textPayload": "compute.instances.preempted",
            },
            id="text-payload",
        ),
        pytest.param(
            {
                "insertId": "1j2k3l",
                "timestamp": "2026-03-14T09:26:53Z",
                "protoPayload": {"@type": "type.googleapis.com/google.appengine.logging.v1"},
            },
            id="proto-payload-without-method",
        ),
    ],
)
def test_log_entries_without_the_preempted_method_are_not_preemptions(
    payload: dict[str, Any],
) -> None:
    """A LogEntry of another kind is skipped, not refused."""
    assert read_preemption(raw(payload)) is None


def test_the_first_and_last_parts_of_one_preemption_share_a_key_and_event_id() -> None:
    """Both parts of the operation relay as one event, whichever comes first."""
    first = read_preemption(raw(entry("preempted_first_part")))
    last = read_preemption(raw(entry("preempted_last_part")))
    assert first is not None
    assert last is not None
    assert first.key == last.key
    assert first.event_id == last.event_id
    assert entry("preempted_first_part")["insertId"] != entry("preempted_last_part")["insertId"]


@pytest.mark.parametrize("notice_s", [0, 25, 120])
def test_the_notice_is_a_parameter(notice_s: int) -> None:
    """The deadline is the entry's timestamp plus the notice the caller says GCE gives."""
    signal = read_preemption(raw(entry("preempted_spot_node")), notice=timedelta(seconds=notice_s))
    assert signal is not None
    assert isinstance(signal.data, NodePreempting)
    logged_at = datetime(2026, 3, 14, 9, 26, 53, 358904, tzinfo=UTC)
    assert signal.data.deadline == logged_at + timedelta(seconds=notice_s)


def test_nanosecond_timestamps_read_to_the_microsecond() -> None:
    """Cloud Logging writes up to nanoseconds; Python keeps microseconds."""
    payload = entry("preempted_spot_node") | {"timestamp": "2026-03-14T09:26:53.358904711Z"}
    signal = read_preemption(raw(payload))
    assert signal is not None
    assert isinstance(signal.data, NodePreempting)
    assert signal.data.deadline == datetime(2026, 3, 14, 9, 27, 23, 358904, tzinfo=UTC)


def _preempted(proto: dict[str, Any] | None = None, **fields: Any) -> bytes:
    """The recorded preemption with `proto` merged into its protoPayload, `fields` replaced."""
    payload = entry("preempted_spot_node")
    payload["protoPayload"] |= proto or {}
    return raw(payload | fields)


def _without(field: str) -> bytes:
    payload = entry("preempted_spot_node")
    del payload[field]
    return raw(payload)


def _without_resource_name() -> bytes:
    payload = entry("preempted_spot_node")
    del payload["protoPayload"]["resourceName"]
    return raw(payload)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"", "Invalid JSON", id="empty"),
        pytest.param(b"\xff\xfe{", "Invalid JSON", id="not-utf8"),
        pytest.param(b"preempted!", "Invalid JSON", id="not-json"),
        pytest.param(b"[1, 2]", "payload: Input should be an object", id="json-array"),
        pytest.param(b"{}", "insertId: Field required", id="empty-object"),
        pytest.param(_without("insertId"), "insertId: Field required", id="no-insert-id"),
        pytest.param(_without("timestamp"), "timestamp: Field required", id="no-timestamp"),
        pytest.param(_preempted(insertId=""), "insertId: String should have", id="empty-id"),
        pytest.param(
            _preempted(insertId=7), "insertId: Input should be a valid string", id="id-a-number"
        ),
        pytest.param(
            _preempted(timestamp="yesterday"), "timestamp: Input should be", id="timestamp-words"
        ),
        pytest.param(
            _preempted(timestamp=1773480413), "timestamp: Input should be", id="timestamp-a-number"
        ),
        pytest.param(_preempted(timestamp="2026-03-14T09:26:53"), "timezone", id="timestamp-naive"),
        pytest.param(
            _preempted(timestamp="9999-12-31T23:59:59.999999Z"),
            "out-of-range timestamp",
            id="timestamp-at-the-end-of-time",
        ),
        pytest.param(_preempted(protoPayload=[]), "protoPayload", id="payload-not-an-object"),
        pytest.param(_without_resource_name(), "has no protoPayload.resourceName", id="no-rn"),
        pytest.param(
            _preempted({"resourceName": "projects/p/zones/z/disks/gke-x"}),
            "not projects/P/zones/Z/instances/NAME",
            id="a-disk",
        ),
        pytest.param(
            _preempted({"resourceName": "projects/p/zones/z/instances/Bad_Name"}),
            "not projects/P/zones/Z/instances/NAME",
            id="not-an-instance-name",
        ),
        pytest.param(
            _preempted({"resourceName": "projects/p/zones/z/instances/a/b"}),
            "not projects/P/zones/Z/instances/NAME",
            id="trailing-path",
        ),
        pytest.param(
            _preempted({"resourceName": "projects/p/zones/z/instances/gke-a\n"}),
            "not projects/P/zones/Z/instances/NAME",
            id="trailing-newline",
        ),
    ],
)
def test_malformed_payloads_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    """Anything that is not a usable LogEntry raises MalformedEntryError (a ValueError)."""
    with pytest.raises(MalformedEntryError, match=reason) as raised:
        read_preemption(data)
    assert isinstance(raised.value, ValueError)


def test_a_refusal_does_not_echo_a_huge_payload() -> None:
    """The reason goes into a log line: it stays short whatever the payload holds."""
    junk = "x" * 100_000
    with pytest.raises(MalformedEntryError) as raised:
        read_preemption(_preempted({"resourceName": junk}, insertId=junk))
    assert len(str(raised.value)) < 500


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
"""Any JSON value."""
ENTRY_KEYS = st.sampled_from(
    ["insertId", "timestamp", "operation", "protoPayload", "resource", "severity", "logName"]
)


@given(JSON)
def test_arbitrary_json_raises_nothing_but_not_a_log_entry(value: Any) -> None:
    """Whatever JSON arrives, the only error is the documented one."""
    with contextlib.suppress(MalformedEntryError):
        read_preemption(raw(value))


@given(st.dictionaries(ENTRY_KEYS, JSON, max_size=7))
def test_arbitrary_entry_fields_raise_nothing_but_not_a_log_entry(
    fields: dict[str, Any],
) -> None:
    """A preemption entry with any of its fields replaced by any JSON still never crashes."""
    with contextlib.suppress(MalformedEntryError):
        read_preemption(raw(entry("preempted_spot_node") | fields))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_nothing_but_not_a_log_entry(data: bytes) -> None:
    """Bytes that are not even text are refused the same way."""
    with contextlib.suppress(MalformedEntryError):
        read_preemption(data)


PART_FLAGS = st.fixed_dictionaries({}, optional={"first": st.booleans(), "last": st.booleans()})


@given(
    insert_id=st.text(min_size=1, max_size=40),
    at=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ),
    flags=PART_FLAGS,
    extra=st.dictionaries(st.text(max_size=10).map(lambda k: f"x-{k}"), JSON, max_size=3),
)
def test_any_part_of_an_operation_has_the_operation_key(
    insert_id: str, at: datetime, flags: dict[str, bool], extra: dict[str, Any]
) -> None:
    """Whatever insertId, time, first/last flags or extra fields a part has, the key is the
    operation's id and the deadline its own timestamp plus the notice."""
    payload = entry("preempted_spot_node") | extra
    payload |= {
        "insertId": insert_id,
        "timestamp": at.isoformat().replace("+00:00", "Z"),
        "operation": {"id": "systemevent-42", "producer": "compute.instances.preempted"} | flags,
    }
    signal = read_preemption(raw(payload))
    assert signal is not None
    assert isinstance(signal.data, NodePreempting)
    assert signal.key == "systemevent-42"
    assert signal.data.node == "gke-train-gpu-spot-5f3c2a1b-x7kq"
    assert signal.data.deadline == at + GCE_PREEMPTION_NOTICE
