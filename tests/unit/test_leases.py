"""Leader leases (`shared.leases`, `shared.runtime.leadership`): one replica acts at a time,
however replicas step, stall and stop, and each takeover raises the term."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.leases import LeaseRecord, LeaseTimes, Move, Sighting, decide, read_record
from shared.messaging.kv_store import InMemoryKeyValue
from shared.messaging.ports import Entry
from shared.runtime.leadership import LeaderLease, LeasesOwnedElsewhereError, claim_leases

TIMES = LeaseTimes(duration_s=4.0, renew_deadline_s=3.0, renew_every_s=1.0)


def entry(holder: str | None, term: int, revision: int = 7) -> Entry:
    value = LeaseRecord(holder=holder, term=term).model_dump_json().encode()
    return Entry(key="scaler", value=value, revision=revision)


@pytest.mark.parametrize(
    ("current", "last", "now", "move", "term"),
    [
        pytest.param(None, None, 0.0, Move.TAKE, 1, id="nobody-ever-held-it"),
        pytest.param(entry("b", 3), None, 100.0, Move.WAIT, 3, id="first-sight-starts-the-clock"),
        pytest.param(entry("b", 3), Sighting(7, 98.0), 100.0, Move.WAIT, 3, id="held-and-young"),
        pytest.param(entry("b", 3), Sighting(7, 96.0), 100.0, Move.TAKE, 4, id="unchanged-4s"),
        pytest.param(
            entry("b", 3, revision=8), Sighting(7, 90.0), 100.0, Move.WAIT, 3,
            id="renewed-meanwhile-the-clock-starts-again",
        ),
        pytest.param(entry("a", 3), Sighting(7, 0.0), 100.0, Move.RENEW, 3, id="mine"),
        pytest.param(entry(None, 3), None, 0.0, Move.TAKE, 4, id="released-taken-at-once"),
        pytest.param(
            Entry(key="scaler", value=b"junk", revision=12), None, 0.0, Move.TAKE, 13,
            id="unreadable-a-term-past-the-buckets-revisions",
        ),
    ],
)  # fmt: skip
def test_what_a_replica_does(
    current: Entry | None, last: Sighting | None, now: float, move: Move, term: int
) -> None:
    decision = decide(current, last, me="a", now=now, times=TIMES)
    assert (decision.move, decision.term) == (move, term)


def test_lease_times_leave_no_overlap() -> None:
    with pytest.raises(ValueError, match="renew_deadline_s < duration_s"):
        LeaseTimes(duration_s=3.0, renew_deadline_s=3.0, renew_every_s=1.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Step = tuple[int, float]
"""Which replica steps (or, as `-1`, stops cleanly the one that leads), after how long."""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 2), st.floats(0.0, 6.0)), min_size=1, max_size=60))
def test_never_two_leaders_and_terms_only_grow(steps: list[Step]) -> None:
    """Three replicas step in any order, any of them silent for any time (a stall, a
    SIGSTOP, a crash), one now and then stopping cleanly: at no moment do two of them
    lead, and each new leader's term is above every earlier one's."""
    clock = Clock()
    kv = InMemoryKeyValue()
    replicas = [LeaderLease(kv, "scaler", f"r{n}", times=TIMES, clock=clock) for n in range(3)]
    terms_seen: list[int] = []

    async def run() -> None:
        for who, wait in steps:
            clock.now += wait
            if who == -1:
                for replica in replicas:
                    if replica.leading:
                        await replica.release()
            else:
                await replicas[who].step()
            leading = [r for r in replicas if r.leading]
            assert len(leading) <= 1, [r.holder for r in leading]
            for replica in leading:
                term = replica.term
                assert term is not None
                if not terms_seen or terms_seen[-1] != term:
                    assert all(term > earlier for earlier in terms_seen)
                    terms_seen.append(term)

    asyncio.run(run())


async def test_a_clean_stop_hands_over_at_once() -> None:
    clock = Clock()
    kv = InMemoryKeyValue()
    first, second = (LeaderLease(kv, "scaler", h, times=TIMES, clock=clock) for h in "ab")
    assert await first.step()
    assert not await second.step()
    assert second.leader == "a"
    await first.release()
    assert not first.leading
    assert await second.step(), "no wait for the lease to expire"
    assert second.term == 2


async def test_a_stalled_leader_stops_acting_before_another_takes_over() -> None:
    clock = Clock()
    kv = InMemoryKeyValue()
    first, second = (LeaderLease(kv, "scaler", h, times=TIMES, clock=clock) for h in "ab")
    assert await first.step()
    assert not await second.step()
    clock.now += TIMES.renew_deadline_s
    assert not first.leading, "past its renew deadline by its own clock"
    assert not await second.step(), "not yet expired for the other"
    clock.now += TIMES.duration_s - TIMES.renew_deadline_s
    assert await second.step()
    # The stalled one wakes: its renewal loses the race, and it follows.
    assert not await first.step()
    assert first.leader == "b"


async def test_a_deposed_leader_that_believes_it_leads_is_fenced_off() -> None:
    """A pause its own clock did not see (a frozen VM, a check made just before a long GC):
    by its clock it still leads, but the bucket holds another's newer term, so its
    confirmation, and with it the action, is refused; the true leader's goes through."""
    frozen, running = Clock(), Clock()
    kv = InMemoryKeyValue()
    first = LeaderLease(kv, "scaler", "a", times=TIMES, clock=frozen)
    second = LeaderLease(kv, "scaler", "b", times=TIMES, clock=running)
    assert await first.step()
    assert not await second.step()
    running.now += TIMES.duration_s + 0.1
    assert await second.step(), "unrenewed for the lease's whole duration, by its clock"
    assert first.leading, "its own clock hid the takeover"
    assert not await first.confirm()
    assert not first.leading
    assert await second.confirm()
    record = await kv.get("scaler")
    assert record is not None
    assert read_record(record) == LeaseRecord(holder="b", term=2)


async def test_a_leader_confirms_by_renewing_and_a_follower_never_does() -> None:
    clock = Clock()
    kv = InMemoryKeyValue()
    first, second = (LeaderLease(kv, "scaler", h, times=TIMES, clock=clock) for h in "ab")
    assert await first.step()
    assert not await second.step()
    before = await kv.get("scaler")
    assert await first.confirm()
    after = await kv.get("scaler")
    assert before is not None
    assert after is not None
    assert after.revision > before.revision, "a confirmation is a write"
    assert not await second.confirm()
    clock.now += TIMES.renew_deadline_s
    assert not await first.confirm(), "past its renew deadline it does not even try"


async def test_the_first_installation_claims_the_leases_and_another_is_refused() -> None:
    kv = InMemoryKeyValue()
    await claim_leases(kv, "spotrain-leases", "ml/spotrain")
    await claim_leases(kv, "spotrain-leases", "ml/spotrain")  # every later start
    with pytest.raises(LeasesOwnedElsewhereError) as refused:
        await claim_leases(kv, "spotrain-leases", "research/spotrain")
    [line] = str(refused.value).splitlines()
    assert "'ml/spotrain'" in line
    assert "SPOTRAIN_SUBJECT_PREFIX" in line
    assert "nats kv del spotrain-leases release" in line
