"""One replica's side of a leader lease (`shared.leases`) on a `KeyValue` bucket: it takes,
renews and releases the lease, and says whether this replica may act now and for which
term."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from shared.leases import (
    RELEASE_KEY,
    LeaseRecord,
    LeaseTimes,
    Move,
    Sighting,
    decide,
    leads,
    read_record,
    release_refusal,
)
from shared.messaging.ports import KeyValue

log = structlog.get_logger()


class LeasesOwnedElsewhereError(RuntimeError):
    """The leases bucket was claimed by another installation: refused at start, with the
    setting to change, rather than two installations sharing one leader."""


async def claim_leases(kv: KeyValue, bucket: str, release: str) -> None:
    """Claim the leases bucket for this installation on first start; at every later start,
    check the claim is this installation's."""
    if await kv.create(RELEASE_KEY, release.encode()) is not None:
        log.info("leases.claimed", bucket=bucket, release=release)
        return
    entry = await kv.get(RELEASE_KEY)
    owner = entry.value.decode() if entry is not None else release
    refusal = release_refusal(bucket, owner, release)
    if refusal is not None:
        raise LeasesOwnedElsewhereError(refusal)


class LeaderLease:
    def __init__(
        self,
        kv: KeyValue,
        name: str,
        holder: str,
        *,
        times: LeaseTimes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kv = kv
        self.name = name
        self.holder = holder
        self.times = times or LeaseTimes()
        self._clock = clock
        self._sighting: Sighting | None = None
        self._renewed_at: float | None = None
        self._revision: int | None = None
        self._term: int | None = None
        self.leader: str | None = None
        """Who holds the lease, as last read (this replica or another); None if nobody."""
        self._writing = asyncio.Lock()
        """One write of the lease at a time: a renewal and a confirmation racing each
        other would fail one compare-and-set and look like a lost lease."""

    @property
    def leading(self) -> bool:
        """Whether this replica may act now: it holds the lease and renewed it in time."""
        return leads(self._renewed_at, self._clock(), self.times)

    @property
    def term(self) -> int | None:
        """The fencing token of this replica's writes while it leads; None otherwise."""
        return self._term if self.leading else None

    async def step(self) -> bool:
        """Read the lease and take or renew it as `shared.leases.decide` says; whether this
        replica leads after it."""
        async with self._writing:
            return await self._step()

    async def confirm(self) -> bool:
        """Whether this replica may act now, proven by the bucket: the lease is renewed by
        compare-and-set on the revision this replica last wrote. A deposed leader, one whose
        clock or pause hid that another took over, fails the write and acts on nothing:
        the fence for an action no one can undo."""
        async with self._writing:
            if not self.leading or self._revision is None or self._term is None:
                return False
            started = self._clock()
            value = LeaseRecord(holder=self.holder, term=self._term).model_dump_json().encode()
            revision = await self._kv.update(self.name, value, revision=self._revision)
            if revision is None:
                log.warning("lease.fenced", lease=self.name, holder=self.holder, term=self._term)
                self._lost()
                return False
            self._renewed_at, self._revision = started, revision
            self._sighting = Sighting(revision, started)
            return True

    async def _step(self) -> bool:
        started = self._clock()  # a renewal counts from before it was asked for
        current = await self._kv.get(self.name)
        decision = decide(current, self._sighting, me=self.holder, now=started, times=self.times)
        self._sighting = decision.sighting
        if decision.move is Move.WAIT:
            self._lost()
            record = read_record(current)
            self.leader = record.holder if record else None
            return False
        value = LeaseRecord(holder=self.holder, term=decision.term).model_dump_json().encode()
        if current is None:
            revision = await self._kv.create(self.name, value)
        else:
            revision = await self._kv.update(self.name, value, revision=current.revision)
        if revision is None:
            self._lost()  # another replica wrote first: it leads, this one reads again
            return False
        if decision.move is Move.TAKE or self._term != decision.term:
            log.info("lease.taken", lease=self.name, holder=self.holder, term=decision.term)
        self._renewed_at, self._revision, self._term = started, revision, decision.term
        self._sighting = Sighting(revision, started)
        self.leader = self.holder
        return self.leading

    async def release(self) -> None:
        """Hand the lease over at once (a clean stop): no holder, the same term."""
        async with self._writing:
            if self._revision is None or self._term is None:
                return
            value = LeaseRecord(holder=None, term=self._term).model_dump_json().encode()
            released = await self._kv.update(self.name, value, revision=self._revision)
            if released is not None:
                log.info("lease.released", lease=self.name, holder=self.holder, term=self._term)
            self._lost()

    async def keep(self, stop: asyncio.Event) -> None:
        """Take and renew until `stop` is set, then release."""
        try:
            while not stop.is_set():
                try:
                    await self.step()
                except Exception as error:  # noqa: BLE001  # the bus's trouble: try again
                    # Unrenewed, the lease runs out by this replica's own clock: a leader
                    # that cannot reach the bucket stops acting within the renew deadline.
                    log.warning("lease.step_failed", lease=self.name, error=repr(error))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.times.renew_every_s)
        finally:
            await self.release()

    def _lost(self) -> None:
        if self._term is not None:
            log.info("lease.lost", lease=self.name, holder=self.holder, term=self._term)
        self._renewed_at = self._revision = self._term = None


class Leadership:
    """What a service's code asks just before an action that must happen once (a resize, a
    call no one can undo): whether this replica still leads. The runtime binds it to the
    service's lease; unbound (a service run alone, a test), it leads.

    A tick checks the lease when it starts; a replica stalled in the middle of one (a long
    pause, a SIGSTOP) finds, by its own clock, that it no longer leads before its next
    action, while another replica may already act."""

    def __init__(self) -> None:
        self._lease: LeaderLease | None = None

    def bind(self, lease: LeaderLease) -> None:
        self._lease = lease

    def leading(self) -> bool:
        return self._lease is None or self._lease.leading

    async def fenced(self) -> bool:
        """Whether this replica still leads, proven by a write of the lease
        (`LeaderLease.confirm`): asked just before an action no one can undo."""
        return self._lease is None or await self._lease.confirm()

    @property
    def term(self) -> int | None:
        """The lease's term while leading (the fencing token); None unbound or following."""
        return self._lease.term if self._lease is not None else None
