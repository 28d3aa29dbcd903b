"""`DemandStore` and `StatusBoard` on the scaler's own key-value bucket: one key per
queued job, one for the pools' status and one for the nodes' last sightings."""

from __future__ import annotations

from typing import Self

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from services.scaler.model import Demand, queueing
from shared.messaging.kv import latest_entries
from shared.pool_knowledge import KNOWLEDGE_KEY, PoolsKnowledge
from shared.pools import (
    SIGHTINGS_KEY,
    SPEND_KEY,
    STATUS_KEY,
    NodeSightings,
    OwnersSpend,
    PoolsStatus,
)


class KvDemandStore:
    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str, *, replicas: int = 1) -> Self:
        kv = await js.create_key_value(
            KeyValueConfig(bucket=bucket, history=1, storage=StorageType.FILE, replicas=replicas)
        )
        return cls(js, kv, bucket)

    async def put(self, demand: Demand) -> None:
        stored = await self._get(demand.job_id)
        if stored is not None and queueing(stored[0]) > queueing(demand):
            return
        await self._kv.put(_key(demand.job_id), demand.model_dump_json().encode())

    async def place(self, demand: Demand, nodes: tuple[str, ...]) -> bool:
        stored = await self._get(demand.job_id)
        if stored is None or stored[0] != demand:
            return False
        placed = demand.model_copy(update={"placed_on": nodes})
        try:
            await self._kv.update(_key(demand.job_id), placed.model_dump_json().encode(), stored[1])
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def remove(self, job_id: str, attempt: int) -> None:
        stored = await self._get(job_id)
        if stored is None or stored[0].attempt > attempt:
            return
        # Compare-and-set: a later attempt's demand stored meanwhile stays.
        try:
            await self._kv.delete(_key(job_id), last=stored[1])
        except nats.js.errors.KeyNotFoundError:
            pass
        except nats.js.errors.BadRequestError as error:
            # nats-py reports a failed compare-and-set on delete as a bare bad request.
            if error.err_code != _WRONG_LAST_SEQUENCE:
                raise

    async def get(self, job_id: str) -> Demand | None:
        stored = await self._get(job_id)
        return stored[0] if stored is not None else None

    async def _get(self, job_id: str) -> tuple[Demand, int] | None:
        try:
            entry = await self._kv.get(_key(job_id))
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value or entry.revision is None:
            return None
        return Demand.model_validate_json(entry.value), entry.revision

    async def publish_status(self, status: PoolsStatus) -> None:
        await self._kv.put(STATUS_KEY, status.model_dump_json().encode())

    async def publish_sightings(self, sightings: NodeSightings) -> None:
        await self._kv.put(SIGHTINGS_KEY, sightings.model_dump_json().encode())

    async def sightings(self) -> NodeSightings | None:
        try:
            entry = await self._kv.get(SIGHTINGS_KEY)
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return NodeSightings.model_validate_json(entry.value)

    async def publish_spend(self, spend: OwnersSpend) -> None:
        await self._kv.put(SPEND_KEY, spend.model_dump_json().encode())

    async def publish_knowledge(self, knowledge: PoolsKnowledge) -> None:
        await self._kv.put(KNOWLEDGE_KEY, knowledge.model_dump_json().encode())

    async def knowledge(self) -> PoolsKnowledge | None:
        try:
            entry = await self._kv.get(KNOWLEDGE_KEY)
        except nats.js.errors.KeyNotFoundError:
            return None
        return PoolsKnowledge.model_validate_json(entry.value) if entry.value else None

    async def all(self) -> list[Demand]:
        return [
            Demand.model_validate_json(entry.value or b"")
            for entry in await latest_entries(self._js, self._bucket, f"{_PREFIX}>")
        ]


_PREFIX = "demand."
_WRONG_LAST_SEQUENCE = 10071  # JetStream's JSStreamWrongLastSequenceErr


def _key(job_id: str) -> str:
    return f"{_PREFIX}{job_id}"
