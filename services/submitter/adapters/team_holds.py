"""`TeamHoldStore` on the teams bucket: one `holds` key, compare-and-set only."""

from __future__ import annotations

from typing import Self

from services.submitter.ports import Revision, StaleRevisionError
from shared.messaging.ports import Buckets, KeyValue
from shared.policy.teams import HOLDS_KEY, STATUS_KEY, TeamHolds, TeamsStatus


class KvTeamHolds:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, buckets: Buckets, bucket: str) -> Self:
        return cls(await buckets.declare_bucket(bucket, history=4))

    async def read(self) -> tuple[TeamHolds, Revision | None]:
        entry = await self._kv.get(HOLDS_KEY)
        if entry is None:
            return TeamHolds(), None
        return TeamHolds.model_validate_json(entry.value), entry.revision

    async def write(self, holds: TeamHolds, revision: Revision | None) -> Revision:
        value = holds.model_dump_json().encode()
        if revision is None:
            written = await self._kv.create(HOLDS_KEY, value)
        else:
            written = await self._kv.update(HOLDS_KEY, value, revision=revision)
        if written is None:
            raise StaleRevisionError(HOLDS_KEY)
        return written

    async def publish_status(self, status: TeamsStatus) -> None:
        await self._kv.put(STATUS_KEY, status.model_dump_json().encode())
