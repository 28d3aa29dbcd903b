"""Does the ledger stop when the nodes stop? On a real local stack of its own: jobs launch
real pool nodes, the stack is stopped twice with `spotrain down` and once by SIGKILL of
every one of its processes at once, then started again and left a minute. The ledger's
total (`spotrain cost`, through the SDK, exact) is set against the node lifetimes as they
were lived: each node from its provider record (launch) to the moment its processes were
gone, watched from outside every 5 ms.

The baseline, in the same run: the ledger as it was before it knew when nodes stopped
unwatched (a node with no end billed up to now, and no end but the scaler's own releases):
the same events, less the ends that `down` and the restarted scaler announce.

    python bench/cost_truth.py [--jobs 2] [--job-s 8] [--wait-s 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from shared.client import SpotrainClient
from shared.events.data import NodeLaunched, NodeReleased, ReleaseReason
from shared.localstack import stack
from shared.localstack.nodes import NodeFolder, kill_node
from shared.localstack.processes import ProcessRecord, is_running
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings
from shared.policy.cost import ledger
from shared.policy.cost.attribution import exact, seconds

CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]
SLEEP = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"
UNWATCHED_ENDS = (ReleaseReason.STACK_STOPPED, ReleaseReason.GONE_WHILE_UNWATCHED)


@dataclass
class Life:
    pool: str
    started: datetime
    ended: datetime | None = None


class NodeWatch:
    """The truth, from outside: each node's launch record, and when its processes went."""

    def __init__(self, folder: NodeFolder) -> None:
        self._folder = folder
        self.lives: dict[str, Life] = {}
        self._records: dict[str, ProcessRecord] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.look()

    def look(self) -> None:
        now = datetime.now(UTC)
        for path in self._folder.path.glob("*.json"):
            record = ProcessRecord.load(path)
            if record is None or record.name in self.lives:
                continue
            # The provider's start record, written as the node starts (its process record
            # comes just after: a node without either was never started).
            started = self._folder.started_at(record.name)
            if started is None:
                continue
            self.lives[record.name] = Life(self._folder.pool_of(record.name), started)
            self._records[record.name] = record
        for name, life in self.lives.items():
            if life.ended is None and not is_running(self._records[name]):
                life.ended = now

    def running(self) -> list[str]:
        return [name for name, life in self.lives.items() if life.ended is None]


def cli(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"spotrain {' '.join(args)} failed: {result.stderr or result.stdout}")
    return result.stdout


def run_jobs(env: dict[str, str], workdir: Path, jobs: int, job_s: float) -> None:
    """Jobs that each need a whole spot node, so that nodes launch and do work."""
    ids = [
        cli(env, "submit", "sleep.py", "--gpus", "2", "--spot", "--workdir", str(workdir),
            "--experiment", "cost-truth", "--", str(job_s)).split()[-1]
        for _ in range(jobs)
    ]  # fmt: skip
    for job_id in ids:
        cli(env, "watch", job_id)


def kill_everything(settings: LocalStackSettings, folder: NodeFolder) -> datetime:
    """SIGKILL every process of the stack in one sweep: services, Ray, NATS, the nodes."""
    records = [r for p in settings.run_dir.glob("*.json") if (r := ProcessRecord.load(p))]
    records += [node.record for node in folder.nodes()]
    for record in records:
        kill_node(record)
    return datetime.now(UTC)


async def events(settings: BusSettings) -> list[Any]:
    async with await SpotrainClient.connect(settings) as client:
        return list(await client.cost_events())


async def ledger_total(settings: BusSettings) -> Fraction:
    async with await SpotrainClient.connect(settings) as client:
        return (await client.costs()).attribution.cost_usd


def baseline_total(stored: list[Any], now: datetime) -> Fraction:
    """The ledger before this work: no end but the scaler's own, open nodes to now."""
    kept = [
        e
        for e in stored
        if not (isinstance(e.data, NodeReleased) and e.data.reason in UNWATCHED_ENDS)
    ]
    return ledger(kept, now=now).attribution.cost_usd


def provider_total(watch: NodeWatch, prices: dict[str, float], now: datetime) -> Fraction:
    return sum(
        (
            seconds((life.ended or now) - life.started) * exact(prices[life.pool]) / 3600
            for life in watch.lives.values()
        ),
        Fraction(0),
    )


@dataclass
class Measured:
    watch: NodeWatch
    stored: list[Any]
    now: datetime
    total: Fraction
    base: Fraction
    restarted: Fraction
    restarted_base: Fraction


def measure(args: argparse.Namespace) -> Measured:
    with tempfile.TemporaryDirectory() as home:
        settings = isolated_stack(Path(home) / "stack")
        env = {**os.environ, "SPOTRAIN_NATS_URL": settings.nats_url,
               "SPOTRAIN_LOCAL_HOME": str(settings.home)}  # fmt: skip
        os.environ.update(env)  # the stack's services inherit it
        bus = BusSettings(nats_url=settings.nats_url)
        workdir = Path(home) / "project"
        workdir.mkdir()
        (workdir / "sleep.py").write_text(SLEEP)
        folder = NodeFolder(settings.node_dir)
        try:
            with NodeWatch(folder) as watch:
                for cycle in (1, 2):
                    stack.up(settings)
                    run_jobs(env, workdir, args.jobs, args.job_s)
                    stack.down(settings)
                    print(f"cycle {cycle}: {len(watch.lives)} nodes so far, stopped by down")
                stack.up(settings)
                run_jobs(env, workdir, args.jobs, args.job_s)
                time.sleep(2)
                killed_at = kill_everything(settings, folder)
                watch.look()
                print(f"cycle 3: killed every process at {killed_at:%H:%M:%S.%f}")
                time.sleep(3)
                stack.up(settings)
                restarted = asyncio.run(ledger_total(bus))
                restarted_base = baseline_total(asyncio.run(events(bus)), datetime.now(UTC))
                time.sleep(args.wait_s)
                now = datetime.now(UTC)
                stored = asyncio.run(events(bus))
                total = asyncio.run(ledger_total(bus))
                assert not watch.running(), f"nodes still up: {watch.running()}"
        finally:
            stack.down(settings)
    return Measured(
        watch, stored, now, total, baseline_total(stored, now), restarted, restarted_base
    )


def report(m: Measured) -> None:
    prices = {
        e.data.pool: e.data.price_per_hour_usd for e in m.stored if isinstance(e.data, NodeLaunched)
    }
    truth = provider_total(m.watch, prices, m.now)
    closed = [e.data for e in m.stored if isinstance(e.data, NodeReleased)]
    reasons = {r.value: sum(1 for c in closed if c.reason is r) for r in ReleaseReason}
    print(f"nodes: {len(m.watch.lives)}; their ends on the bus: {reasons}")
    billed = {b.node: b.node_seconds for b in ledger(m.stored, now=m.now).attribution.bills}
    ends = {c.node: c for c in closed}
    header = f"{'node':14}{'closed as':22}{'end known from':16}"
    print(f"{header}{'lived s':>10}{'billed s':>10}{'diff s':>9}")
    for name, life in sorted(m.watch.lives.items()):
        lived = seconds((life.ended or m.now) - life.started)
        end = ends.get(name)
        print(
            f"{name:14}{end.reason.value if end else 'open':22}"
            f"{end.end_source.value if end else '-':16}{float(lived):>10.3f}"
            f"{float(billed.get(name, 0)):>10.3f}{float(billed.get(name, 0) - lived):>9.3f}"
        )
    print(f"{'':28}{'ledger':>14}{'baseline':>14}")
    print(f"{'total, $':28}{float(m.total):>14.6f}{float(m.base):>14.6f}")
    print(f"{'provider (lived), $':28}{float(truth):>14.6f}{float(truth):>14.6f}")
    err_pct = float(abs(m.total - truth) / truth * 100)
    base_pct = float(abs(m.base - truth) / truth * 100)
    print(f"{'error, %':28}{err_pct:>14.4f}{base_pct:>14.4f}")
    grew, base_grew = float(m.total - m.restarted), float(m.base - m.restarted_base)
    print(f"{'grew while stopped, $':28}{grew:>14.6f}{base_grew:>14.6f}")
    print(f"cost_ledger_usd: {float(m.total):.6f}")
    print(f"cost_provider_usd: {float(truth):.6f}")
    print(f"cost_ledger_error_pct: {err_pct:.4f}")
    print(f"cost_growth_while_stopped_usd: {grew:.6f}")
    print(f"baseline_cost_ledger_usd: {float(m.base):.6f}")
    print(f"baseline_cost_ledger_error_pct: {base_pct:.4f}")
    print(f"baseline_cost_growth_while_stopped_usd: {base_grew:.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="jobs per cycle, a node each")
    parser.add_argument("--job-s", type=float, default=20.0)
    parser.add_argument("--wait-s", type=float, default=60.0, help="left running at the end")
    report(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
