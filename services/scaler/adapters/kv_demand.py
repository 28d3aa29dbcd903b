"""`DemandStore` and `StatusBoard` on the scaler's own key-value bucket: one key per
queued job, one for the pools' status and one for the nodes' last sightings."""

from __future__ import annotations

from typing import Self

from services.scaler.model import Demand, queueing
from shared.messaging.ports import Buckets, KeyValue
from shared.policy.pool_knowledge import KNOWLEDGE_KEY, PoolsKnowledge
from shared.pools import (
    SIGHTINGS_KEY,
    SPEND_KEY,
    STATUS_KEY,
    NodeSightings,
    OwnersSpend,
    PoolsStatus,
)


class KvDemandStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, buckets: Buckets, bucket: str) -> Self:
        """Declare the bucket (idempotent): the scaler, its writer, does at start."""
        return cls(await buckets.declare_bucket(bucket))

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
        value = placed.model_dump_json().encode()
        return await self._kv.update(_key(demand.job_id), value, revision=stored[1]) is not None

    async def remove(self, job_id: str, attempt: int) -> None:
        stored = await self._get(job_id)
        if stored is None or stored[0].attempt > attempt:
            return
        # Compare-and-set: a later attempt's demand stored meanwhile stays.
        await self._kv.delete(_key(job_id), revision=stored[1])

    async def get(self, job_id: str) -> Demand | None:
        stored = await self._get(job_id)
        return stored[0] if stored is not None else None

    async def _get(self, job_id: str) -> tuple[Demand, int] | None:
        entry = await self._kv.get(_key(job_id))
        if entry is None:
            return None
        return Demand.model_validate_json(entry.value), entry.revision

    async def publish_status(self, status: PoolsStatus) -> None:
        await self._kv.put(STATUS_KEY, status.model_dump_json().encode())

    async def publish_sightings(self, sightings: NodeSightings) -> None:
        await self._kv.put(SIGHTINGS_KEY, sightings.model_dump_json().encode())

    async def sightings(self) -> NodeSightings | None:
        entry = await self._kv.get(SIGHTINGS_KEY)
        return NodeSightings.model_validate_json(entry.value) if entry else None

    async def publish_spend(self, spend: OwnersSpend) -> None:
        await self._kv.put(SPEND_KEY, spend.model_dump_json().encode())

    async def publish_knowledge(self, knowledge: PoolsKnowledge) -> None:
        await self._kv.put(KNOWLEDGE_KEY, knowledge.model_dump_json().encode())

    async def knowledge(self) -> PoolsKnowledge | None:
        entry = await self._kv.get(KNOWLEDGE_KEY)
        return PoolsKnowledge.model_validate_json(entry.value) if entry else None

    async def all(self) -> list[Demand]:
        return [
            Demand.model_validate_json(entry.value) for entry in await self._kv.entries(_PREFIX)
        ]


_PREFIX = "demand."


def _key(job_id: str) -> str:
    return f"{_PREFIX}{job_id}"
