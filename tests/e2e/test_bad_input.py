"""Bad input on every subject the services consume, against the running local stack: each
message is dead-lettered by each service that consumes its subject, with the reason; the
services stay up; a valid request sent after the flood is still handled."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from typing import Any

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.checkpointer.handlers import SUBSCRIPTIONS as CHECKPOINTER
from services.preemption_watcher.handlers import SUBSCRIPTIONS as WATCHER
from services.scaler.handlers import SUBSCRIPTIONS as SCALER
from services.submitter.handlers import SUBSCRIPTIONS as SUBMITTER
from shared.events import DEFAULT_PREFIX, EventData, subject_for
from shared.events.codec import MAX_EVENT_BYTES
from shared.messaging.dead_letters import REASON

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CONSUMERS: dict[str, Mapping[type[EventData], object]] = {
    "submitter": SUBMITTER,
    "scaler": SCALER,
    "preemption_watcher": WATCHER,
    "checkpointer": CHECKPOINTER,
}
SUBJECTS = sorted({subject_for(t, DEFAULT_PREFIX) for table in CONSUMERS.values() for t in table})


def sent_on(subject: str) -> str:
    """A subject to publish on: a request's pattern (`….requested.>`) with a sender's name."""
    return subject.removesuffix(".>") + ".eve" if subject.endswith(".>") else subject


def consumers_of(subject: str) -> list[str]:
    return [
        service
        for service, table in CONSUMERS.items()
        if any(subject_for(t, DEFAULT_PREFIX) == subject for t in table)
    ]


def envelope(event_type: str, data: Any, **fields: Any) -> bytes:
    return json.dumps(
        {
            "specversion": "1.0",
            "id": fields.pop("id", f"bad-{time.monotonic_ns()}"),
            "source": "tests/bad-input",
            "type": event_type,
            "time": "2026-11-30T12:00:00Z",
            "data": data,
            **fields,
        }
    ).encode()


# Each kind of bad input the issue names, by hand, for every consumed subject.
HOSTILE = "'; rm -rf / #$(reboot)`id`\x00\u202e"
FIXED = {
    "not-json": b"{this is not json",
    "non-utf8": b"\xff\xfe\xfa not utf-8 \xc3\x28",
    "not-an-event": b'{"hello": "world"}',
    "unknown-version": envelope("spotrain.job.requested.v9", {"job_id": "x"}),
    "unknown-type": envelope("spotrain.job.exploded.v1", {}),
    "wrong-types": envelope(
        "spotrain.job.requested.v1",
        {"job_id": 7, "owner": ["a"], "entrypoint": "python x.py", "num_workers": "many"},
    ),
    "missing-fields": envelope("spotrain.node.lost.v1", {"pool": "gpu-spot"}),
    "hostile-strings": envelope(
        "spotrain.job.requested.v1",
        {"job_id": HOSTILE, "owner": HOSTILE, "entrypoint": [HOSTILE]},
    ),
    "oversize": envelope("spotrain.job.requested.v1", {"pad": "x" * (MAX_EVENT_BYTES + 1)}),
}


def dead_letters(nats_url: str) -> Counter[tuple[str, str]]:
    """(service, reason) of every dead letter stored so far."""

    async def read() -> Counter[tuple[str, str]]:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            found: Counter[tuple[str, str]] = Counter()
            sub = await js.subscribe(f"{DEFAULT_PREFIX}.dlq.>", ordered_consumer=True)
            try:
                while True:
                    try:
                        msg = await sub.next_msg(timeout=1)
                    except nats.errors.TimeoutError:
                        return found
                    service = msg.subject.rsplit(".", 1)[-1]
                    found[service, (msg.headers or {}).get(REASON, "")] += 1
            finally:
                await sub.unsubscribe()
        finally:
            await nc.close()

    return asyncio.run(read())


def publish(nats_url: str, items: list[tuple[str, bytes]]) -> None:
    async def send() -> None:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            for subject, payload in items:
                await js.publish(subject, payload)
        finally:
            await nc.close()

    asyncio.run(send())


def healthy(env: dict[str, str]) -> list[str]:
    base = int(env["SPOTRAIN_LOCAL_SERVICE_PORT_BASE"])
    up = []
    for offset, service in enumerate(CONSUMERS, start=1):
        try:
            url = f"http://127.0.0.1:{base + offset}/healthz"
            with urllib.request.urlopen(url, timeout=2):
                up.append(service)
        except OSError:
            pass
    return up


def wait_for(nats_url: str, expected: Counter[tuple[str, str]], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        found = dead_letters(nats_url)
        if all(found[key] >= count for key, count in expected.items()):
            return
        assert time.monotonic() < deadline, f"expected at least {expected}, found {found}"
        time.sleep(0.5)


def test_every_kind_of_bad_input_is_dead_lettered_by_each_consumer_with_its_reason(
    local_stack: dict[str, str],
) -> None:
    url = local_stack["SPOTRAIN_NATS_URL"]
    before = dead_letters(url)
    expected: Counter[tuple[str, str]] = Counter()
    items = []
    for subject in SUBJECTS:
        for kind, payload in FIXED.items():
            items.append((sent_on(subject), payload))
            reason = {
                "not-json": "not-json",
                "non-utf8": "not-json",
                "not-an-event": "not-an-event",
                "unknown-version": "unknown-version",
                "unknown-type": "unknown-type",
                "wrong-types": "invalid-data",
                "missing-fields": "invalid-data",
                "hostile-strings": "invalid-data",
                "oversize": "too-large",
            }[kind]
            for service in consumers_of(subject):
                expected[service, reason] += 1
    # A valid request right behind the flood: over the quota, so the answer needs no Ray.
    valid = envelope(
        "spotrain.job.requested.v1",
        {
            "job_id": "after-the-flood",
            "owner": "eve",
            "entrypoint": ["python", "x.py"],
            "worker": {"gpus": 8},
            "num_workers": 8,
        },
        id="after-the-flood",
    )
    publish(url, [*items, (f"{DEFAULT_PREFIX}.job.requested.eve", valid)])
    wait_for(url, before + expected)
    after = dead_letters(url) - before
    assert after == expected, "each bad message once, by each consumer, with its reason"
    assert healthy(local_stack) == list(CONSUMERS), "every service stays up"
    assert rejected(url, "after-the-flood"), "the valid request was handled"


def rejected(nats_url: str, job_id: str) -> bool:
    async def look() -> bool:
        nc = await nats.connect(nats_url)
        try:
            sub = await nc.jetstream().subscribe(
                f"{DEFAULT_PREFIX}.job.rejected", ordered_consumer=True
            )
            while True:
                try:
                    msg = await sub.next_msg(timeout=2)
                except nats.errors.TimeoutError:
                    return False
                if json.loads(msg.data)["data"]["job_id"] == job_id:
                    return True
        finally:
            await nc.close()

    return asyncio.run(look())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(subject=st.sampled_from(SUBJECTS), data=json_values, raw=st.binary(max_size=200))
def test_generated_garbage_never_stops_a_service(
    local_stack: dict[str, str], subject: str, data: Any, raw: bytes
) -> None:
    url = local_stack["SPOTRAIN_NATS_URL"]
    event_type = f"spotrain.{subject.removesuffix('.>').split('.', 1)[1]}.v1"
    on = sent_on(subject)
    publish(url, [(on, envelope(event_type, data)), (on, raw)])
    assert healthy(local_stack) == list(CONSUMERS)
