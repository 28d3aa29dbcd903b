"""`KeyValue` on a NATS JetStream bucket, and its in-memory twin: the same contract
(`tests/contract/test_key_value_contract.py`), compare-and-set on the revision."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Self, TypeVar

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue as NatsKeyValue

from shared.logs import deferred_logger
from shared.messaging.failover import through_failover
from shared.messaging.kv import latest_entries
from shared.messaging.ports import BucketMissingError, Entry, check_key_prefix

T = TypeVar("T")

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a write whose expected revision is not the key's latest."""
STREAM_NAME_IN_USE = 10058
"""JetStream's error code for a stream declared again with another configuration."""

log = deferred_logger()


async def declared_with_replicas(
    failover_s: float,
    declare: Callable[[], Awaitable[T]],
    js: JetStreamContext,
    stream: str,
    replicas: int,
) -> T:
    """Declare a bucket or store; one that exists with another number of copies (an
    installation of one server grown to three) is first brought to `replicas`, as
    `nats stream edit --replicas` would: JetStream copies it to the new servers while it
    keeps serving. Any other difference is refused, as JetStream refuses it."""
    try:
        return await through_failover(failover_s, declare)
    except nats.js.errors.APIError as error:
        if getattr(error, "err_code", None) != STREAM_NAME_IN_USE:
            raise
        info = await through_failover(failover_s, js.stream_info, stream)
        before = info.config.num_replicas
        if before == replicas:
            raise
        await through_failover(
            failover_s, js.update_stream, info.config.evolve(num_replicas=replicas)
        )
        log.info("bucket.replicas_changed", stream=stream, before=before, after=replicas)
    return await through_failover(failover_s, declare)


FAILOVER_S = 10.0
"""How long a call waits through a cluster's leader election (seconds, as a publish waits)."""


class JetStreamKeyValue:
    """Every call rides out a cluster's leader election (`through_failover`): a bucket of
    three copies answers again within seconds of losing the server that led it."""

    def __init__(
        self,
        js: JetStreamContext,
        kv: NatsKeyValue | None,
        bucket: str,
        *,
        failover_s: float = FAILOVER_S,
    ) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket
        self._failover_s = failover_s

    @classmethod
    def of(cls, js: JetStreamContext, bucket: str, *, failover_s: float = FAILOVER_S) -> Self:
        """A bucket another process declares, looked up on first use: until it exists it
        reads as empty (a reader started before its writer)."""
        return cls(js, None, bucket, failover_s=failover_s)

    async def _handle(self) -> NatsKeyValue | None:
        if self._kv is None:
            try:
                self._kv = await through_failover(
                    self._failover_s, self._js.key_value, self._bucket
                )
            except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
                return None
        return self._kv

    @classmethod
    async def declare(
        cls,
        js: JetStreamContext,
        bucket: str,
        *,
        replicas: int = 1,
        history: int = 1,
        ttl_s: float | None = None,
        failover_s: float = FAILOVER_S,
    ) -> Self:
        """The bucket, declared by its writer at start (idempotent)."""
        config = KeyValueConfig(
            bucket=bucket,
            history=history,
            storage=StorageType.FILE,
            replicas=replicas,
            ttl=ttl_s,
        )
        kv = await declared_with_replicas(
            failover_s, partial(js.create_key_value, config), js, f"KV_{bucket}", replicas
        )
        return cls(js, kv, bucket, failover_s=failover_s)

    async def get(self, key: str) -> Entry | None:
        kv = await self._handle()
        if kv is None:
            return None
        try:
            entry = await through_failover(self._failover_s, kv.get, key)
        except nats.js.errors.KeyNotFoundError:  # deleted and purged markers too
            return None
        if entry.value is None or entry.revision is None:
            return None
        return Entry(key=key, value=entry.value, revision=entry.revision)

    async def create(self, key: str, value: bytes) -> int | None:
        kv = await self._writable()
        try:
            return await through_failover(self._failover_s, kv.create, key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def update(self, key: str, value: bytes, *, revision: int) -> int | None:
        kv = await self._writable()
        try:
            return await through_failover(self._failover_s, _update, kv, key, value, revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def put(self, key: str, value: bytes) -> int:
        kv = await self._writable()
        return await through_failover(self._failover_s, kv.put, key, value)

    async def delete(self, key: str, *, revision: int | None = None) -> bool:
        kv = await self._writable()
        try:
            return await through_failover(self._failover_s, _delete, kv, key, revision)
        except nats.js.errors.KeyNotFoundError:
            return revision is None
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except nats.js.errors.BadRequestError as error:
            # nats-py passes a delete's lost race on as the server's own error.
            if error.err_code == WRONG_LAST_SEQUENCE:
                return False
            raise

    async def entries(self, prefix: str = "") -> list[Entry]:
        check_key_prefix(prefix)
        if await self._handle() is None:
            return []
        latest = await through_failover(
            self._failover_s, latest_entries, self._js, self._bucket, f"{prefix}>"
        )
        return [
            Entry(key=entry.key, value=entry.value, revision=entry.revision)
            for entry in latest
            if entry.value is not None and entry.revision is not None
        ]

    async def _writable(self) -> NatsKeyValue:
        kv = await self._handle()
        if kv is None:
            msg = f"the bucket {self._bucket} is not declared: its writer declares it at start"
            raise BucketMissingError(msg)
        return kv


async def _update(kv: NatsKeyValue, key: str, value: bytes, revision: int) -> int:
    return await kv.update(key, value, last=revision)


async def _delete(kv: NatsKeyValue, key: str, revision: int | None) -> bool:
    return await kv.delete(key, last=revision)


class InMemoryKeyValue:
    """The same contract in one process: revisions count up across the bucket, as a
    stream's sequence does. Its time-to-live is not kept: a test that needs values to
    expire uses the real bucket."""

    def __init__(self, *, declared: bool = True) -> None:
        self._entries: dict[str, Entry] = {}
        self._revision = 0
        self._lock = asyncio.Lock()
        self.declared = declared
        """False for a bucket looked up before its writer declared it: reads empty."""

    async def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    async def create(self, key: str, value: bytes) -> int | None:
        self._writable()
        async with self._lock:
            if key in self._entries:
                return None
            return self._put(key, value)

    async def update(self, key: str, value: bytes, *, revision: int) -> int | None:
        self._writable()
        async with self._lock:
            current = self._entries.get(key)
            if current is None or current.revision != revision:
                return None
            return self._put(key, value)

    async def put(self, key: str, value: bytes) -> int:
        self._writable()
        async with self._lock:
            return self._put(key, value)

    async def delete(self, key: str, *, revision: int | None = None) -> bool:
        self._writable()
        async with self._lock:
            current = self._entries.get(key)
            if revision is not None and (current is None or current.revision != revision):
                return False
            with contextlib.suppress(KeyError):
                del self._entries[key]
            self._revision += 1  # a delete is a write, as a stream stores its marker
            return True

    async def entries(self, prefix: str = "") -> list[Entry]:
        check_key_prefix(prefix)
        return sorted(
            (entry for key, entry in self._entries.items() if key.startswith(prefix)),
            key=lambda entry: entry.key,
        )

    def _writable(self) -> None:
        if not self.declared:
            msg = "the bucket is not declared: its writer declares it at start"
            raise BucketMissingError(msg)

    def _put(self, key: str, value: bytes) -> int:
        self._revision += 1
        self._entries[key] = Entry(key=key, value=value, revision=self._revision)
        return self._revision
