"""The platform's own queue on a real local stack (issue 30), each figure beside its
baseline measured in the same run:

1. answers: a burst of --burst requests published at once (one-GPU jobs, held queued: the
   scaler may buy nothing, budget $0/h) against a single request on the idle stack:
   answer latency p50/p99, requests never answered, answers given twice;
2. Ray's head memory (RSS of the head's processes) idle, and with --queued jobs queued;
3. the platform's order: --order jobs of random priorities held, then one node's worth of
   budget: how many started before a higher-ranked job that waited for the same room;
4. a sweep of --sweep points (one GPU each, a quick script) under an owner quota of 16,
   on pools that hold more than the quota: accepted, most running at once, succeeded;
5. --running quick jobs from the burst to all RUNNING, against the same jobs submitted
   straight to Ray's Job API, both on nodes already up.

Ends with `name: value` lines (the names issue 30 gives).

    python bench/platform_queue.py [--burst 1000] [--sweep 100] [--running 20] [--steps ...]

(Not `bench/queue.py`: a script of this folder named `queue` would shadow the standard
library's `queue` module for every other script here, Ray's and asyncio's imports included.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared.client import SpotrainClient
from shared.events import decode, new_event, subject_for
from shared.events.data import JobAccepted, JobRejected, JobRequested
from shared.events.types import Bundle, CapacityClass
from shared.jobs import JobRecord, JobState
from shared.localstack import stack
from shared.localstack.nodes import kill_node
from shared.localstack.processes import ProcessRecord
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings

# More GPUs per node than the one-GPU demo pools, so an owner's quota of 16, not the
# machine, is what holds the sweep back. The nodes declare GPUs they do not have.
POOLS = """
[[pool]]
name = "gpu-spot"
capacity = "spot"
gpus = 8
cpus = 8
price_per_hour_usd = 0.34
boot_time_s = 10
max_nodes = 3

[[pool]]
name = "gpu-on-demand"
capacity = "on-demand"
gpus = 8
cpus = 8
price_per_hour_usd = 0.85
boot_time_s = 10
max_nodes = 1
"""
QUICK = "import time\ntime.sleep(3)\n"
OWNER = "bench"


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def request(job_id: str, *, gpus: int = 1, priority: int = 5, owner: str = OWNER) -> JobRequested:
    return JobRequested(
        job_id=job_id,
        owner=owner,
        entrypoint=("python", "-c", QUICK),
        worker=Bundle(gpus=gpus, cpus=0.1),
        capacity=CapacityClass.SPOT,
        priority=priority,
    )


async def answers_of(
    client: SpotrainClient, requests: Sequence[JobRequested], timeout_s: float
) -> tuple[list[float], int, int]:
    """Publish all at once; each request's answer latency, how many had none, and how many
    answers came more than once. 1. of the module's list."""
    wanted = {r.job_id for r in requests}
    first: dict[str, float] = {}
    seen: dict[str, int] = {}
    bus = client._bus  # a benchmark listens on the raw subjects
    published: dict[str, float] = {}
    all_answered = asyncio.Event()

    async def on_answer(msg: Any) -> None:
        job_id = getattr(decode(msg.data).data, "job_id", None)
        if job_id in wanted:
            seen[job_id] = seen.get(job_id, 0) + 1
            first.setdefault(job_id, time.perf_counter())
            if len(first) == len(wanted):
                all_answered.set()

    subs = [
        await bus.client.subscribe(subject_for(model, bus.prefix), cb=on_answer)
        for model in (JobAccepted, JobRejected)
    ]
    try:
        for r in requests:
            published[r.job_id] = time.perf_counter()
            await bus.publish(new_event(r, source="bench", time=client._clock.now()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_answered.wait(), timeout=timeout_s)
        await asyncio.sleep(1.0)  # a second answer, if any, comes by now
    finally:
        for sub in subs:
            await sub.unsubscribe()
    latencies = [first[j] - published[j] for j in first]
    return latencies, len(wanted) - len(first), sum(1 for n in seen.values() if n > 1)


def head_rss_mb(settings: LocalStackSettings) -> float:
    """RSS of the Ray head's process tree (GCS, raylet, dashboard and its agents, the job
    supervisors it hosts)."""
    import psutil  # noqa: PLC0415  # comes with Ray

    record = ProcessRecord.load(settings.run_dir / "ray-head.json")
    assert record is not None
    root = psutil.Process(record.pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / 1024**2


def restart_scaler(settings: LocalStackSettings, budget_per_hour_usd: float) -> None:
    record = ProcessRecord.load(settings.run_dir / "scaler.json")
    if record is not None:
        kill_node(record)
        # This process started it: reaped, or its PID would still look alive to `up`.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(record.pid, 0)
    os.environ["SPOTRAIN_SCALER_BUDGET_PER_HOUR_USD"] = str(budget_per_hour_usd)
    for _ in range(30):
        try:
            stack.up(settings)
        except stack.StackError:
            time.sleep(1)  # the killed scaler's port is not free yet
            continue
        return
    stack.up(settings)


async def until(
    client: SpotrainClient, ok: Callable[[list[JobRecord]], bool], timeout_s: float
) -> list[JobRecord]:
    deadline = time.perf_counter() + timeout_s
    while True:
        records = await client.jobs()
        if ok(records):
            return records
        if time.perf_counter() > deadline:
            msg = "timed out"
            raise SystemExit(msg)
        await asyncio.sleep(0.5)


async def cancel_all(client: SpotrainClient, records: Sequence[JobRecord]) -> None:
    """Cancel each (as its owner) and wait until every one has ended."""
    for record in records:
        await client.cancel(record.job_id, record.request.owner)
    job_ids = {record.job_id for record in records}
    await until(client, lambda rs: all(not r.is_active for r in rs if r.job_id in job_ids), 300)


async def answers_and_head(
    client: SpotrainClient, settings: LocalStackSettings, args: argparse.Namespace
) -> dict[str, float]:
    """1. and 2.: everything held (budget $0/h), so nothing but the queue is measured."""
    figures: dict[str, float] = {}
    single = []
    for n in range(5):
        latencies, _, _ = await answers_of(client, [request(f"single-{n}")], 30)
        single.extend(latencies)
    figures["single_answer_s"] = statistics.median(single)
    figures["queue_head_rss_mb_idle"] = head_rss_mb(settings)
    held = [request(f"held-{n:04d}", owner=f"{OWNER}-{n % 10}") for n in range(args.queued)]
    await client.submit_many(held, answer_timeout_s=120)
    records = await until(client, lambda rs: len(rs) >= args.queued, 120)
    figures["queue_jobs_queued"] = sum(1 for r in records if r.state is JobState.QUEUED)
    figures[f"queue_head_rss_mb_queued_{args.queued}"] = head_rss_mb(settings)
    await cancel_all(client, [r for r in records if r.is_active])
    burst = [request(f"burst-{n:04d}", owner=f"{OWNER}-{n % 10}") for n in range(args.burst)]
    latencies, lost, doubled = await answers_of(client, burst, 300)
    figures["queue_answer_p50_s"] = percentile(latencies, 0.5)
    figures["queue_answer_p99_s"] = percentile(latencies, 0.99)
    figures["queue_lost"] = lost
    figures["queue_duplicates"] = doubled
    records = [r for r in await client.jobs() if r.job_id.startswith("burst-")]
    await cancel_all(client, [r for r in records if r.is_active])
    return figures


async def order(
    client: SpotrainClient, settings: LocalStackSettings, args: argparse.Namespace
) -> dict[str, float]:
    """3.: jobs of random priorities (each a whole node) held, then one node to share."""
    rng = random.Random(30)  # noqa: S311  # a benchmark's reproducible draw
    priorities = [rng.randint(1, 9) for _ in range(args.order)]
    ordered = [
        request(f"order-{n:02d}", gpus=8, priority=priority)
        for n, priority in enumerate(priorities)
    ]
    for r in ordered:
        await client.submit(r)
        await asyncio.sleep(0.01)  # distinct queueing times: age breaks ties
    restart_scaler(settings, budget_per_hour_usd=0.5)
    done = await until(
        client,
        lambda rs: all(not r.is_active for r in rs if r.job_id.startswith("order-")),
        60 + 30 * args.order,
    )
    mine = [r for r in done if r.job_id.startswith("order-") and r.attempts]
    starts = {r.job_id: r.attempts[-1].started_at for r in mine}
    # The platform's rule: priority, then age (when the platform accepted it).
    rank = {r.job_id: (-r.request.priority, r.accepted_at) for r in mine}
    violations = sum(
        1
        for a, started_a in starts.items()
        for b, started_b in starts.items()
        if started_a and started_b and started_a < started_b and rank[b] < rank[a]
    )
    return {"queue_order_violations": violations}


async def sweep(
    client: SpotrainClient, settings: LocalStackSettings, args: argparse.Namespace
) -> dict[str, float]:
    """4.: a sweep under an owner quota of 16, on 24 GPUs of spot."""
    restart_scaler(settings, budget_per_hour_usd=1.1)
    points = [request(f"sweep-{n:03d}", owner="sweeper") for n in range(args.sweep)]
    answers = await client.submit_many(points, answer_timeout_s=120)
    accepted = sum(1 for a in answers.values() if a is not None and isinstance(a.data, JobAccepted))
    most = 0
    deadline = time.perf_counter() + 60 + 10 * args.sweep
    while True:
        records = [r for r in await client.jobs() if r.job_id.startswith("sweep-")]
        most = max(most, sum(1 for r in records if r.state is JobState.RUNNING))
        if all(not r.is_active for r in records) or time.perf_counter() > deadline:
            break
        await asyncio.sleep(0.2)
    return {
        "queue_sweep_accepted": accepted,
        "queue_sweep_max_running": most,
        "queue_sweep_succeeded": sum(1 for r in records if r.state is JobState.SUCCEEDED),
    }


async def all_running(
    client: SpotrainClient, settings: LocalStackSettings, args: argparse.Namespace
) -> dict[str, float]:
    """5.: quick jobs from the burst to all RUNNING, nodes up, against Ray's own API."""
    batch = [request(f"run-{n:03d}", gpus=0, owner="runner") for n in range(args.running)]

    def all_started(records: list[JobRecord]) -> bool:
        started = [
            r for r in records if r.job_id.startswith("run-") and r.attempts
            and r.attempts[-1].started_at is not None
        ]  # fmt: skip
        return len(started) >= args.running

    began = time.perf_counter()
    await client.submit_many(batch, answer_timeout_s=60)
    await until(client, all_started, 300)
    took = time.perf_counter() - began
    await until(client, lambda rs: all(not r.is_active for r in rs), 300)
    direct = await asyncio.to_thread(ray_direct, settings.dashboard_url, args.running)
    return {"queue_all_running_s": took, "ray_direct_all_running_s": direct}


async def measure(settings: LocalStackSettings, args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    async with await SpotrainClient.connect(BusSettings(nats_url=settings.nats_url)) as client:
        steps = {f.__name__: f for f in (answers_and_head, order, sweep, all_running)}
        for name in args.steps or list(steps):
            figures |= await steps[name](client, settings, args)
            print(f"{name}: {figures}", flush=True)
    return figures


def ray_direct(dashboard: str, count: int) -> float:
    """The same quick jobs straight to Ray's Job API (on the nodes the platform left up)."""
    from ray.job_submission import JobSubmissionClient  # noqa: PLC0415  # slow to import

    ray = JobSubmissionClient(dashboard)
    started = time.perf_counter()
    for n in range(count):
        ray.submit_job(
            entrypoint=f"python -c {json.dumps(QUICK)}",
            submission_id=f"direct-{n:03d}",
            entrypoint_num_cpus=0.1,
            entrypoint_resources={"spotrain-capacity-spot": 0.001},
        )
    seen = set()
    while len(seen) < count:
        for n in range(count):
            if f"direct-{n:03d}" in seen:
                continue
            status = ray.get_job_status(f"direct-{n:03d}")
            if str(status) in ("RUNNING", "SUCCEEDED", "JobStatus.RUNNING", "JobStatus.SUCCEEDED"):
                seen.add(f"direct-{n:03d}")
        if time.perf_counter() - started > 300:
            break
        time.sleep(0.1)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=200)
    parser.add_argument("--order", type=int, default=8)
    parser.add_argument("--sweep", type=int, default=100)
    parser.add_argument("--running", type=int, default=20)
    parser.add_argument(
        "--steps", nargs="*", help="Some of answers_and_head, order, sweep, all_running."
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home_dir:
        home = Path(home_dir)
        pools = home / "pools.toml"
        pools.write_text(POOLS)
        os.environ |= {
            "SPOTRAIN_SCALER_POOLS_FILE": str(pools),
            "SPOTRAIN_SCALER_BUDGET_PER_HOUR_USD": "0",
            "SPOTRAIN_SCALER_SETTLE_S": "5",
            "SPOTRAIN_SUBMITTER_MAX_GPUS_PER_OWNER": "16",
            "RAY_JOB_START_TIMEOUT_SECONDS": "60",
        }
        settings = isolated_stack(home / "stack")
        stack.up(settings)
        try:
            figures = asyncio.run(measure(settings, args))
        finally:
            stack.down(settings)
    if "single_answer_s" in figures:
        print(f"single_request_answer_s: {figures.pop('single_answer_s'):.3f}  (baseline)")
    for name, value in figures.items():
        print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")


if __name__ == "__main__":
    main()
