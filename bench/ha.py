"""Issue 33's figures: no single point of failure, on local stacks of their own with a
three-server NATS cluster (`--nats-cluster 3`), one replica of each service beside two.

1. Burst answers: `--burst` requests published at once (each refused at admission, a GPU
   count past the per-job limit, so that no node is bought), the latency of each answer,
   p50 and p99, with one replica of each service and with two (`burst_answer_p99_s_*`).
2. Failover, two replicas: each service's leader SIGKILLed, and the time from the kill to
   the next replica's taking the lease (its `lease.taken` line, after which its leader-only
   work runs within a renewal), beside the lease's own duration (`failover_s_<service>`).
3. Events lost: `--marks` events published, each waiting for the cluster's acknowledgement,
   while the stream's leader's server is SIGKILLed halfway; then brought back. Counted:
   events acknowledged and not in the stream afterwards (`events_lost`).
4. Double actions: `--jobs` quick jobs submitted around the kills of the submitter's and
   the scaler's leaders; counted: Ray submissions past one per attempt, and attempts past
   one per job (`double_actions`).

Goals: failover <= 5 s, 0 lost, 0 doubled.

    python bench/ha.py [--burst 300] [--marks 400] [--jobs 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from platform_queue import answers_of, percentile

from shared.client import SpotrainClient
from shared.events.data import JobRequested
from shared.events.types import Bundle
from shared.jobs import TERMINAL_STATES, JobState
from shared.localstack import stack
from shared.localstack.processes import ProcessRecord
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings
from shared.messaging.dead_letters import MSG_ID
from shared.messaging.jetstream import JetStreamBus
from shared.runtime.service import RuntimeSettings

SERVICES = ("submitter", "scaler", "preemption_watcher", "checkpointer")
MARKS = "spotrain.bench.mark"


def cluster(home: Path, replicas: int) -> LocalStackSettings:
    return isolated_stack(home).model_copy(update={"nats_servers": 3, "service_replicas": replicas})


def bus_settings(settings: LocalStackSettings) -> BusSettings:
    return BusSettings(nats_url=settings.nats_url, replicas=3, publish_timeout_s=30)


async def burst(settings: LocalStackSettings, count: int, label: str) -> list[float]:
    """Each answer's latency for `count` requests at once."""
    async with await SpotrainClient.connect(bus_settings(settings)) as client:
        requests = [
            JobRequested(
                job_id=f"{label}-{n}",
                owner="bench",
                entrypoint=("python", "-c", "pass"),
                worker=Bundle(gpus=16),  # past the per-job limit: refused, no node bought
            )
            for n in range(count)
        ]
        latencies, unanswered, doubled = await answers_of(client, requests, timeout_s=120)
    if unanswered or doubled:
        print(f"  {label}: {unanswered} unanswered, {doubled} answered twice")
    return latencies


def leaders(settings: LocalStackSettings) -> dict[str, tuple[str, int]]:
    found = {}
    for status in stack.status(settings):
        service = status.name.split("-")[0]
        if status.leads and status.pid is not None:
            found[service] = (status.name, status.pid)
    return found


def lease_taken_at(settings: LocalStackSettings, service: str, after: float) -> float | None:
    """When another replica of `service` logged taking the lease, after `after` (epoch s)."""
    taken = []
    for log in settings.log_dir.glob(f"{service}*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"lease.taken"' not in line:
                continue
            try:
                at = datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
            except (ValueError, KeyError):
                continue
            if at > after:
                taken.append(at)
    return min(taken) if taken else None


async def failovers(settings: LocalStackSettings) -> dict[str, float]:
    figures = {}
    for service in SERVICES:
        name, pid = (await asyncio.to_thread(leaders, settings))[service]
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (taken := lease_taken_at(settings, service, killed_at)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica of {service} took over from {name}")
            await asyncio.sleep(0.1)
        figures[service] = taken - killed_at
        await asyncio.to_thread(stack.up, settings)  # the killed replica back, following
    return figures


async def events_lost(settings: LocalStackSettings, count: int) -> int:
    bus = await JetStreamBus.connect(bus_settings(settings), name="bench-ha")
    try:
        info = await bus.client.jetstream().stream_info("SPOTRAIN")
        leader = info.cluster.leader if info.cluster else None
        acknowledged = set()
        for n in range(count):
            if n == count // 2 and leader is not None:
                [server] = [s for s in settings.nats if s.name == leader]
                record = ProcessRecord.load(settings.run_dir / f"{server.component}.json")
                if record is not None:
                    os.kill(record.pid, signal.SIGKILL)
            mark = f"mark-{n}"
            await bus.publish_raw(MARKS, mark.encode(), {MSG_ID: mark})
            acknowledged.add(mark)
        await asyncio.to_thread(stack.up, settings)
        stored = {m.data.decode() for m in await bus.read(MARKS)}
    finally:
        await bus.close()
    return len(acknowledged - stored)


def ray_submissions(settings: LocalStackSettings) -> dict[str, int]:
    with urllib.request.urlopen(f"{settings.dashboard_url}/api/jobs/", timeout=10) as response:  # noqa: S310  # the stack's own Ray
        submissions = json.load(response)
    counted: dict[str, int] = {}
    for job in submissions:
        key = f"{job['metadata'].get('job_id')}#{job['metadata'].get('attempt')}"
        counted[key] = counted.get(key, 0) + 1
    return counted


async def double_actions(settings: LocalStackSettings, jobs: int) -> int:
    async with await SpotrainClient.connect(bus_settings(settings)) as client:
        requests = [
            JobRequested(
                job_id=f"twice-{n}",
                owner="bench",
                entrypoint=("python", "-c", "import time; time.sleep(2)"),
                worker=Bundle(gpus=0, cpus=1),
            )
            for n in range(jobs)
        ]
        for n, request in enumerate(requests):
            await client.submit(request, answer_timeout_s=60)
            if n in (1, 3):  # the submitter's leader, then the scaler's, killed mid-stream
                service = "submitter" if n == 1 else "scaler"
                _, pid = (await asyncio.to_thread(leaders, settings))[service]
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 300
        while True:
            records = [await client.job(r.job_id) for r in requests]
            if all(r is not None and r.state in TERMINAL_STATES for r in records):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the jobs did not end in 300 s")
            await asyncio.sleep(1)
    failed = [r.job_id for r in records if r is not None and r.state is not JobState.SUCCEEDED]
    if failed:
        print(f"  jobs not succeeded: {failed}")
    extra_attempts = sum(len(r.attempts) - 1 for r in records if r is not None)
    extra_submissions = sum(n - 1 for n in ray_submissions(settings).values() if n > 1)
    await asyncio.to_thread(stack.up, settings)
    return extra_attempts + extra_submissions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=300)
    parser.add_argument("--marks", type=int, default=400)
    parser.add_argument("--jobs", type=int, default=6)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ha-") as scratch:
        os.environ["SPOTRAIN_SCALER_IDLE_TIMEOUT_S"] = "120"
        for replicas in (1, 2):
            settings = cluster(Path(scratch) / f"replicas-{replicas}", replicas)
            stack.up(settings)
            try:
                latencies = asyncio.run(burst(settings, args.burst, f"burst{replicas}"))
                figures[f"burst_answer_p50_s_replicas_{replicas}"] = percentile(latencies, 0.5)
                figures[f"burst_answer_p99_s_replicas_{replicas}"] = percentile(latencies, 0.99)
                if replicas == 2:
                    for service, seconds in asyncio.run(failovers(settings)).items():
                        figures[f"failover_s_{service}"] = seconds
                    figures["events_lost"] = asyncio.run(events_lost(settings, args.marks))
                    figures["double_actions"] = asyncio.run(double_actions(settings, args.jobs))
            finally:
                stack.down(settings)
    duration = RuntimeSettings().lease_duration_s  # the runtime's default: the baseline
    print()
    print(f"burst of {args.burst} requests, answer latency (s):")
    print(f"  {'replicas':>8}  {'p50':>6}  {'p99':>6}")
    for replicas in (1, 2):
        p50 = figures[f"burst_answer_p50_s_replicas_{replicas}"]
        p99 = figures[f"burst_answer_p99_s_replicas_{replicas}"]
        print(f"  {replicas:>8}  {p50:6.3f}  {p99:6.3f}")
    print(f"failover, leader SIGKILLed -> the next one leads (lease duration {duration:g} s):")
    for service in SERVICES:
        print(f"  {service:20} {figures[f'failover_s_{service}']:5.2f}")
    print()
    print(f"lease_duration_s: {duration:g}")
    for service in SERVICES:
        print(f"failover_s_{service}: {figures[f'failover_s_{service}']:.2f}")
    for replicas in (1, 2):
        print(
            f"burst_answer_p99_s_replicas_{replicas}: "
            f"{figures[f'burst_answer_p99_s_replicas_{replicas}']:.3f}"
        )
    print(f"events_lost: {int(figures['events_lost'])}")
    print(f"double_actions: {int(figures['double_actions'])}")


if __name__ == "__main__":
    main()
