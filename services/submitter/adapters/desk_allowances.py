"""`RequestAllowances`: each person's share of requests, kept in one replica's memory or
in a key-value bucket that every replica of the submitter shares. In the bucket, an
allowance is taken by compare-and-set, so two replicas answering one person at once
count both requests; an entry expires once the allowance would be whole again."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Self

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from shared.desk import ALLOWANCE_WHOLE_AFTER_S, Allowance, allowances_bucket, take_request

MOST_TRIES = 8
"""Compare-and-set tries before a request is refused for a moment: only a person's own
requests, answered at once by several replicas, contend for their entry."""
CONTENDED_RETRY_S = 0.05


class ReplicaAllowances:
    """One replica's own count: a person gets their share from each replica."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._allowances: dict[str, Allowance] = {}

    async def take(self, person: str) -> float | None:
        allowance, wait_s = take_request(self._allowances.get(person), self._clock())
        self._allowances[person] = allowance
        return wait_s


class KvAllowances:
    """Every replica's count, in `<prefix>-allowances`: the wall clock is the one the
    replicas share."""

    def __init__(self, kv: KeyValue, clock: Callable[[], float] = time.time) -> None:
        self._kv = kv
        self._clock = clock

    @classmethod
    async def open(cls, js: JetStreamContext, prefix: str, *, replicas: int = 1) -> Self:
        """Declare the bucket (idempotent): its writer does, at start."""
        kv = await js.create_key_value(
            KeyValueConfig(
                bucket=allowances_bucket(prefix),
                history=1,
                storage=StorageType.FILE,
                replicas=replicas,
                ttl=ALLOWANCE_WHOLE_AFTER_S + 60,
            )
        )
        return cls(kv)

    async def take(self, person: str) -> float | None:
        for _ in range(MOST_TRIES):
            try:
                entry = await self._kv.get(person)
            except nats.js.errors.KeyNotFoundError:
                entry = None
            allowance, wait_s = take_request(
                Allowance.from_bytes(entry.value if entry else None), self._clock()
            )
            try:
                if entry is None:
                    await self._kv.create(person, allowance.to_bytes())
                else:
                    await self._kv.update(person, allowance.to_bytes(), last=entry.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another replica counted one of theirs meanwhile: count again
            return wait_s
        return CONTENDED_RETRY_S
