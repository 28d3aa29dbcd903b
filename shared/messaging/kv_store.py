"""`KeyValue` on a NATS JetStream bucket, and its in-memory twin: the same contract
(`tests/contract/test_key_value_contract.py`), compare-and-set on the revision."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue as NatsKeyValue

from shared.messaging.kv import latest_entries
from shared.messaging.ports import Entry

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a write whose expected revision is not the key's latest."""


class JetStreamKeyValue:
    def __init__(self, js: JetStreamContext, kv: NatsKeyValue | None, bucket: str) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket

    @classmethod
    def of(cls, js: JetStreamContext, bucket: str) -> Self:
        """A bucket another process declares, looked up on first use: until it exists it
        reads as empty (a reader started before its writer)."""
        return cls(js, None, bucket)

    async def _handle(self) -> NatsKeyValue | None:
        if self._kv is None:
            try:
                self._kv = await self._js.key_value(self._bucket)
            except nats.js.errors.BucketNotFoundError:
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
    ) -> Self:
        """The bucket, declared by its writer at start (idempotent)."""
        kv = await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                history=history,
                storage=StorageType.FILE,
                replicas=replicas,
                ttl=ttl_s,
            )
        )
        return cls(js, kv, bucket)

    async def get(self, key: str) -> Entry | None:
        kv = await self._handle()
        if kv is None:
            return None
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # deleted and purged markers too
            return None
        if entry.value is None or entry.revision is None:
            return None
        return Entry(key=key, value=entry.value, revision=entry.revision)

    async def create(self, key: str, value: bytes) -> int | None:
        try:
            return await (await self._writable()).create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def update(self, key: str, value: bytes, *, revision: int) -> int | None:
        try:
            return await (await self._writable()).update(key, value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def delete(self, key: str, *, revision: int | None = None) -> bool:
        try:
            return await (await self._writable()).delete(key, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except nats.js.errors.BadRequestError as error:
            # nats-py passes a delete's lost race on as the server's own error.
            if error.err_code == WRONG_LAST_SEQUENCE:
                return False
            raise

    async def entries(self) -> list[Entry]:
        if await self._handle() is None:
            return []
        return [
            Entry(key=entry.key, value=entry.value, revision=entry.revision)
            for entry in await latest_entries(self._js, self._bucket)
            if entry.value is not None and entry.revision is not None
        ]

    async def _writable(self) -> NatsKeyValue:
        kv = await self._handle()
        if kv is None:
            msg = f"the bucket {self._bucket} is not declared: its writer declares it at start"
            raise nats.js.errors.BucketNotFoundError(description=msg)
        return kv


class InMemoryKeyValue:
    """The same contract in one process: revisions count up across the bucket, as a
    stream's sequence does."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._revision = 0
        self._lock = asyncio.Lock()

    async def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    async def create(self, key: str, value: bytes) -> int | None:
        async with self._lock:
            if key in self._entries:
                return None
            return self._put(key, value)

    async def update(self, key: str, value: bytes, *, revision: int) -> int | None:
        async with self._lock:
            current = self._entries.get(key)
            if current is None or current.revision != revision:
                return None
            return self._put(key, value)

    async def delete(self, key: str, *, revision: int | None = None) -> bool:
        async with self._lock:
            current = self._entries.get(key)
            if revision is not None and (current is None or current.revision != revision):
                return False
            with contextlib.suppress(KeyError):
                del self._entries[key]
            self._revision += 1  # a delete is a write, as a stream stores its marker
            return True

    async def entries(self) -> list[Entry]:
        return sorted(self._entries.values(), key=lambda entry: entry.key)

    def _put(self, key: str, value: bytes) -> int:
        self._revision += 1
        self._entries[key] = Entry(key=key, value=value, revision=self._revision)
        return self._revision
