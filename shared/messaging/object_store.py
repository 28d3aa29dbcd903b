"""`ObjectStore` on a NATS JetStream object store, and its in-memory twin: the same
contract (`tests/contract/test_bus_contract.py`)."""

from __future__ import annotations

from functools import partial
from typing import Self

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectStoreConfig, StorageType
from nats.js.object_store import ObjectStore as NatsObjectStore

from shared.messaging.failover import through_failover
from shared.messaging.kv_store import declared_with_replicas
from shared.messaging.ports import ObjectStoreMissingError, StoredObject


class JetStreamObjectStore:
    """Every call rides out a cluster's leader election, as the key-value port's do."""

    def __init__(
        self, js: JetStreamContext, store: NatsObjectStore | None, name: str, *, failover_s: float
    ) -> None:
        self._js = js
        self._store = store
        self._name = name
        self._failover_s = failover_s

    @classmethod
    async def declare(
        cls,
        js: JetStreamContext,
        name: str,
        *,
        replicas: int = 1,
        ttl_s: float | None = None,
        failover_s: float = 10.0,
    ) -> Self:
        config = ObjectStoreConfig(
            bucket=name, storage=StorageType.FILE, ttl=ttl_s, replicas=replicas
        )
        store = await declared_with_replicas(
            failover_s, partial(js.create_object_store, name, config), js, f"OBJ_{name}", replicas
        )
        return cls(js, store, name, failover_s=failover_s)

    @classmethod
    def of(cls, js: JetStreamContext, name: str, *, failover_s: float = 10.0) -> Self:
        return cls(js, None, name, failover_s=failover_s)

    async def _handle(self) -> NatsObjectStore | None:
        if self._store is None:
            try:
                self._store = await through_failover(
                    self._failover_s, self._js.object_store, self._name
                )
            except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
                return None
        return self._store

    async def _writable(self) -> NatsObjectStore:
        store = await self._handle()
        if store is None:
            msg = f"there is no object store {self._name} yet: its writer declares it at start"
            raise ObjectStoreMissingError(msg)
        return store

    async def put(self, name: str, data: bytes, *, description: str | None = None) -> None:
        store = await self._writable()
        meta = ObjectMeta(name=name, description=description)
        await through_failover(self._failover_s, _put, store, name, data, meta)

    async def get(self, name: str) -> bytes | None:
        store = await self._handle()
        if store is None:
            return None
        try:
            result = await through_failover(self._failover_s, store.get, name)
        except nats.js.errors.ObjectNotFoundError:
            return None
        return result.data or b""

    async def has(self, name: str) -> bool:
        store = await self._handle()
        if store is None:
            return False
        try:
            info = await through_failover(self._failover_s, store.get_info, name)
        except nats.js.errors.ObjectNotFoundError:
            return False
        return not info.deleted

    async def delete(self, name: str) -> bool:
        store = await self._writable()
        try:
            await through_failover(self._failover_s, store.delete, name)
        except nats.js.errors.ObjectNotFoundError:
            return False
        return True

    async def list(self) -> list[StoredObject]:
        store = await self._handle()
        if store is None:
            return []
        try:
            infos = await through_failover(self._failover_s, _list, store)
        except nats.js.errors.NotFoundError:
            return []  # an empty store
        return [
            StoredObject(name=info.name, size=info.size or 0, description=info.description)
            for info in infos
        ]


async def _put(store: NatsObjectStore, name: str, data: bytes, meta: ObjectMeta) -> None:
    await store.put(name, data, meta=meta)


async def _list(store: NatsObjectStore) -> list[nats.js.api.ObjectInfo]:
    return await store.list(ignore_deletes=True)


class InMemoryObjectStore:
    """The same contract in one process; its time-to-live is not kept."""

    def __init__(self, *, declared: bool = True) -> None:
        self._objects: dict[str, tuple[bytes, str | None]] = {}
        self.declared = declared

    def _writable(self) -> None:
        if not self.declared:
            msg = "there is no object store yet: its writer declares it at start"
            raise ObjectStoreMissingError(msg)

    async def put(self, name: str, data: bytes, *, description: str | None = None) -> None:
        self._writable()
        self._objects[name] = (bytes(data), description)

    async def get(self, name: str) -> bytes | None:
        found = self._objects.get(name)
        return found[0] if found is not None else None

    async def has(self, name: str) -> bool:
        return name in self._objects

    async def delete(self, name: str) -> bool:
        self._writable()
        return self._objects.pop(name, None) is not None

    async def list(self) -> list[StoredObject]:
        return [
            StoredObject(name=name, size=len(data), description=description)
            for name, (data, description) in sorted(self._objects.items())
        ]
