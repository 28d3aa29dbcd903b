"""Issue 32's attacks on a secure local stack (real nats-server, real Ray), counted per
class, and how long another person's job takes from submit to queued while one person
floods the platform, beside the same with no flood, in the same run.

The attacks are `tests/security/attacks.py`'s (what the adversarial suite asserts). The
flood is alice's, all at once, for as long as bob's jobs are measured:
- asks that wait (a history ask of 20 s on a job of hers, as many as she can keep open);
- requests the submitter refuses (a secret her team does not have), 56 KB each, as fast
  as the desk takes them.
Bob submits one job at a time through the desk, `--gpus 0`, and the figure is the time
from his submit to the stream's `job.queued` for it (the median of `ROUNDS`).

Job code (class job_code, where the stack can confine it: root): a job of alice's tries
to read the stack's credentials, NATS store, bob's team's secret and the submitter's
process, and to change the platform's code (`tests/security/job_code.py`).

Goals (issue 32): attacks_succeeded_<class> 0; victim_job_delay_s_under_flood <= 2 s.

    python bench/security.py
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.client import PlatformError, SpotrainClient  # noqa: E402
from shared.desk import Ask, DeskAsk  # noqa: E402
from shared.events import encode, new_event  # noqa: E402
from shared.events.data import JobQueued, JobRequested  # noqa: E402
from shared.events.types import Bundle  # noqa: E402
from shared.localstack.confinement import can_confine  # noqa: E402
from tests.security.attacks import ATTACKS, Arena  # noqa: E402
from tests.security.job_code import refused, snoop  # noqa: E402
from tests.security.world import arena_of, close_world, open_world  # noqa: E402

ROUNDS = 5
SLOW_ASKS = 600
REFUSED_REQUEST_BYTES = 56 * 1024


async def attacks(arena: Arena) -> tuple[Counter[str], Counter[str]]:
    tried: Counter[str] = Counter()
    through: Counter[str] = Counter()
    for attack in ATTACKS:
        tried[attack.kind] += 1
        got_through = await attack.run(arena)
        through[attack.kind] += got_through
        print(f"  {attack.kind:16} {attack.name:40} {'THROUGH' if got_through else 'refused'}")
    return tried, through


async def submit_to_queued(bob: SpotrainClient, job_id: str) -> float:
    request = JobRequested(
        job_id=job_id, owner="bob", entrypoint=("python", "-c", "pass"), worker=Bundle(gpus=0)
    )
    began = datetime.now(UTC)
    await bob.submit(request, answer_timeout_s=60)
    try:
        while True:
            for event in await bob.history(job_id):
                if isinstance(event.data, JobQueued):
                    return (event.time - began).total_seconds()
            if (datetime.now(UTC) - began).total_seconds() > 120:
                return float("inf")
            await asyncio.sleep(0.05)
    finally:
        with contextlib.suppress(PlatformError):
            await bob.cancel(job_id, "bob")


async def delays(bob: SpotrainClient, label: str) -> float:
    seen = [await submit_to_queued(bob, f"bob-{label}-{n}-{time.time_ns()}") for n in range(ROUNDS)]
    return statistics.median(seen)


async def flood(alice: SpotrainClient, stop: asyncio.Event) -> Counter[str]:
    sent: Counter[str] = Counter()

    # Her own job, so that the desk waits the whole 20 s for news of it.
    own = JobRequested(job_id=f"alice-own-{time.time_ns()}", owner="alice", entrypoint=("true",))
    await alice.submit(own, answer_timeout_s=30)

    async def slow_asks() -> None:
        ask = DeskAsk(ask=Ask.HISTORY, job_id=own.job_id, after_seq=10**12, wait_s=20)
        while not stop.is_set():
            try:
                await alice._ask(ask)
                sent["slow-ask answered"] += 1
            except PlatformError:
                sent["slow-ask refused"] += 1
                await asyncio.sleep(0.01)

    async def refused_requests() -> None:
        # 14 variables of 4 KiB: 56 KiB, the most an event may hold is 64 KiB.
        padding = {f"PAD_{i}": "x" * 4096 for i in range(REFUSED_REQUEST_BYTES // 4096)}
        n = 0
        while not stop.is_set():
            n += 1
            request = JobRequested(
                job_id=f"flood-{n}-{time.time_ns()}",
                owner="alice",
                entrypoint=("python", "-c", "pass"),
                env=padding,
                secrets={"HF_TOKEN": "hf-token"},  # nlp's: refused for vision
            )
            event = new_event(request, source="cli/alice", time=datetime.now(UTC))
            try:
                await alice._ask(DeskAsk(ask=Ask.SUBMIT, event=encode(event).decode()))
                sent["request stored"] += 1
            except PlatformError:
                sent["request refused at the desk"] += 1
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(slow_asks()) for _ in range(SLOW_ASKS)]
    tasks += [asyncio.create_task(refused_requests()) for _ in range(8)]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return sent


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-security-") as scratch:
        world = await asyncio.to_thread(open_world, Path(scratch))
        try:
            async with arena_of(world) as arena:
                print("attacks on the secure stack:")
                tried, through = await attacks(arena)
                if can_confine():
                    seen = await asyncio.to_thread(snoop, world, Path(scratch))
                    seen.pop("checkpoints")  # its own: the one thing it may write
                    for name, what in sorted(seen.items()):
                        tried["job_code"] += 1
                        through["job_code"] += not refused(what)
                        print(f"  {'job_code':16} {name:40} {what}")
                bob = arena.client(arena.bob, "bob")
                alice = arena.client(arena.alice, "alice")
                quiet = await delays(bob, "quiet")
                stop = asyncio.Event()
                flooding = asyncio.create_task(flood(alice, stop))
                await asyncio.sleep(5)  # the flood at full height before bob's first job
                flooded = await delays(bob, "flood")
                stop.set()
                sent = await flooding
        finally:
            await asyncio.to_thread(close_world, world)
    print()
    print(f"alice's flood: {dict(sent)}")
    print(f"bob's job, submit to queued (median of {ROUNDS}):")
    print(f"  {'no flood':>12}  {'under flood':>12}")
    print(f"  {quiet:12.2f}  {flooded:12.2f}")
    print()
    for kind in sorted(tried):
        print(f"attacks_tried_{kind}: {tried[kind]}")
        print(f"attacks_succeeded_{kind}: {through[kind]}")
    print(f"victim_job_delay_s_no_flood: {quiet:.2f}")
    print(f"victim_job_delay_s_under_flood: {flooded:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
