"""Reading a JetStream key-value bucket whole."""

from __future__ import annotations

import contextlib
import secrets

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.kv import KV_DEL, KV_MARKER_REASON, KV_OP, KV_PURGE, KeyValue

_BATCH = 1000
_FETCH_TIMEOUT_S = 2.0
_IDLE_CONSUMER_S = 30.0
"""How long the server keeps a reader's consumer that was not deleted (its reader died)."""


async def latest_entries(
    js: JetStreamContext, bucket: str, keys: str = ">"
) -> list[KeyValue.Entry]:
    """The latest value of every key of `bucket` that matches `keys` (a NATS subject pattern
    such as `demand.>`), deleted keys left out: a thousand jobs' records in one pass rather
    than a get, and a round trip, per key.

    A pull consumer of its own, deleted after the read, rather than nats-py's `watch`: the
    watch's "all delivered" marker comes from a consumer info that may be answered before
    the values are, so that a read now and then came back empty while the bucket was not
    (the scaler saw no demand for a whole pass); and the ordered consumer it leaves behind
    lingers on the server for five minutes. A pull consumer delivers nothing before it is
    asked, and says at its creation how many values there are."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    name = f"latest-{secrets.token_hex(6)}"
    created = await js.add_consumer(
        stream,
        ConsumerConfig(
            name=name,
            filter_subject=prefix + keys,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=_IDLE_CONSUMER_S,
            mem_storage=True,
        ),
    )
    latest: dict[str, KeyValue.Entry | None] = {}
    try:
        pending = created.num_pending or 0
        if pending:
            psub = await js.pull_subscribe_bind(durable=name, stream=stream)
            try:
                while pending:
                    try:
                        batch = await psub.fetch(min(pending, _BATCH), timeout=_FETCH_TIMEOUT_S)
                    except (nats.errors.TimeoutError, TimeoutError):
                        break  # what was counted has gone since (a purge)
                    for msg in batch:
                        key = msg.subject.removeprefix(prefix)
                        latest[key] = _entry(bucket, key, msg)
                    pending = batch[-1].metadata.num_pending if batch else 0
            finally:
                await psub.unsubscribe()
    finally:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await js.delete_consumer(stream, name)
    return [entry for entry in latest.values() if entry is not None]


def _entry(bucket: str, key: str, msg: Msg) -> KeyValue.Entry | None:
    """The key's value, or None where its latest message says it was deleted (by a delete,
    a purge, or the server's marker of a value that expired)."""
    headers = msg.headers or {}
    if headers.get(KV_OP) in (KV_DEL, KV_PURGE) or KV_MARKER_REASON in headers:
        return None
    if not msg.data:
        return None
    meta = msg.metadata
    return KeyValue.Entry(
        bucket=bucket,
        key=key,
        value=msg.data,
        revision=meta.sequence.stream,
        delta=meta.num_pending,
        created=meta.timestamp,  # type: ignore[arg-type]  # nats-py's own watch does the same
        operation=None,
    )
