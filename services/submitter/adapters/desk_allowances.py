"""`RequestAllowances` on the key-value port: each person's share of requests, in a bucket
that every replica of the submitter shares. An allowance is taken by compare-and-set, so
two replicas answering one person at once count both requests; an entry expires once the
allowance would be whole again. On the in-memory twin it is one replica's own count."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Self

from shared.desk import ALLOWANCE_WHOLE_AFTER_S, Allowance, allowances_bucket, take_request
from shared.messaging.ports import Buckets, KeyValue

MOST_TRIES = 8
"""Compare-and-set tries before a request is refused for a moment: only a person's own
requests, answered at once by several replicas, contend for their entry."""
CONTENDED_RETRY_S = 0.05


class KvAllowances:
    """The wall clock is the one the replicas share; one replica alone may pass its own
    monotonic clock."""

    def __init__(self, kv: KeyValue, clock: Callable[[], float] = time.time) -> None:
        self._kv = kv
        self._clock = clock

    @classmethod
    async def open(cls, buckets: Buckets, prefix: str) -> Self:
        """Declare the bucket (idempotent): its writer does, at start."""
        kv = await buckets.declare_bucket(
            allowances_bucket(prefix), ttl_s=ALLOWANCE_WHOLE_AFTER_S + 60
        )
        return cls(kv)

    async def take(self, person: str) -> float | None:
        for _ in range(MOST_TRIES):
            entry = await self._kv.get(person)
            allowance, wait_s = take_request(
                Allowance.from_bytes(entry.value if entry else None), self._clock()
            )
            if entry is None:
                written = await self._kv.create(person, allowance.to_bytes())
            else:
                written = await self._kv.update(
                    person, allowance.to_bytes(), revision=entry.revision
                )
            if written is not None:
                return wait_s
            # Another replica counted one of theirs meanwhile: count again.
        return CONTENDED_RETRY_S
