"""`TeamHoldStore` on the teams bucket: one `holds` key, compare-and-set only."""

from __future__ import annotations

from typing import Self

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from services.submitter.ports import Revision, StaleRevisionError
from shared.teams import HOLDS_KEY, STATUS_KEY, TeamHolds, TeamsStatus


class KvTeamHolds:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str, *, replicas: int = 1) -> Self:
        kv = await js.create_key_value(
            KeyValueConfig(bucket=bucket, history=4, storage=StorageType.FILE, replicas=replicas)
        )
        return cls(kv)

    async def read(self) -> tuple[TeamHolds, Revision | None]:
        try:
            entry = await self._kv.get(HOLDS_KEY)
        except nats.js.errors.KeyNotFoundError:
            return TeamHolds(), None
        if entry.value is None or entry.revision is None:
            return TeamHolds(), None
        return TeamHolds.model_validate_json(entry.value), entry.revision

    async def write(self, holds: TeamHolds, revision: Revision | None) -> Revision:
        value = holds.model_dump_json().encode()
        try:
            if revision is None:
                return await self._kv.create(HOLDS_KEY, value)
            return await self._kv.update(HOLDS_KEY, value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise StaleRevisionError(HOLDS_KEY) from error

    async def publish_status(self, status: TeamsStatus) -> None:
        await self._kv.put(STATUS_KEY, status.model_dump_json().encode())
