"""How fast the web page answers with 10,000 jobs in the store, beside `spotrain ls`.

A real nats-server holds a store as a busy platform's: --jobs job records in the jobs
bucket, and each job's events in the stream (requested, accepted, queued, started on one
of 40 spot nodes, four progress reports, succeeded). The page's real process
(`python -m shared.ui`) serves it, and a real headless Chromium (Debian's, through
Playwright) loads it. Measured, medians of --runs:
- ui_start_s: from the page's process start until it serves (it reads the whole stream);
- ui_first_render_s: the jobs page, from navigation until its rows are on screen;
- ui_job_page_s: a job's page, until its timeline and metric charts are drawn;
- ui_experiments_page_s: the experiments page, until its four charts are drawn;
- ui_update_s: from an event published on the bus to the open job page showing it;
- cli_ls_s: `spotrain ls --all` on the same store, process start to exit: the baseline.
Goals (issue 34): first render < 1 s, update < 0.5 s.

    python bench/ui.py [--jobs 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from playwright.async_api import Page, async_playwright

from shared.events import Event, EventData, new_event
from shared.events.data import (
    JobAccepted,
    JobProgress,
    JobQueued,
    JobRequested,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
)
from shared.events.types import Bundle, CapacityClass
from shared.jobs import Attempt, AttemptState, JobRecord, JobState, jobs_bucket
from shared.localstack.nats_server import NatsServer
from shared.localstack.ports import free_port
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from tests.browser import CHROMIUM_FLAGS, chromium

CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]
NODES = 40
OWNERS = ("alice", "bob", "carol", "dave", "erin")


def job_story(n: int, start: datetime) -> tuple[JobRecord, list[Event[EventData]]]:
    job_id = f"bench-{n:05d}"
    node = f"gpu-spot-{n % NODES}"
    at = start + timedelta(seconds=n * 6)
    request = JobRequested(
        job_id=job_id,
        owner=OWNERS[n % len(OWNERS)],
        experiment=f"sweep-{n % 50}",
        entrypoint=("python", "train.py"),
        worker=Bundle(gpus=1),
        capacity=CapacityClass.SPOT,
    )
    events: list[Event[EventData]] = [
        new_event(request, source="bench", time=at, subject=job_id),
        new_event(
            JobAccepted(job_id=job_id, owner=request.owner, experiment=request.experiment),
            source="bench",
            time=at,
            subject=job_id,
        ),
        new_event(
            JobQueued(
                job_id=job_id,
                attempt=1,
                bundles=(request.worker,),
                capacity=CapacityClass.SPOT,
                priority=5,
            ),
            source="bench",
            time=at,
            subject=job_id,
        ),
        new_event(
            JobStarted(
                job_id=job_id,
                attempt=1,
                submission_id=f"{job_id}-1",
                pool="gpu-spot",
                nodes=(node,),
            ),
            source="bench",
            time=at + timedelta(seconds=5),
            subject=job_id,
        ),
    ]
    for report in range(1, 5):
        events.append(
            new_event(
                JobProgress(
                    job_id=job_id,
                    attempt=1,
                    step=report * 100,
                    total_steps=400,
                    metrics={"loss": 1.0 / report},
                ),
                source="bench",
                time=at + timedelta(seconds=5 + report * 60),
                subject=job_id,
            )
        )
    ended = at + timedelta(seconds=300)
    events.append(
        new_event(
            JobSucceeded(job_id=job_id, attempt=1), source="bench", time=ended, subject=job_id
        )
    )
    record = JobRecord(
        request=request,
        request_event_id=events[0].id,
        state=JobState.SUCCEEDED,
        accepted_at=at,
        updated_at=ended,
        attempts=(
            Attempt(
                number=1,
                submission_id=f"{job_id}-1",
                state=AttemptState.SUCCEEDED,
                submitted_at=at,
                started_at=at + timedelta(seconds=5),
                ended_at=ended,
                step=400,
                total_steps=400,
                metrics={"loss": 0.25},
                nodes=(node,),
                pool="gpu-spot",
            ),
        ),
    )
    return record, events


async def fill(url: str, jobs: int) -> None:
    bus = await JetStreamBus.connect(BusSettings(nats_url=url), name="bench-fill")
    await bus.ensure_stream()
    bucket = await bus.declare_bucket(jobs_bucket(bus.prefix))
    start = datetime.now(UTC) - timedelta(seconds=jobs * 6 + 600)
    nodes: list[Event[EventData]] = [
        new_event(
            NodeLaunched(
                node=f"gpu-spot-{n}",
                pool="gpu-spot",
                capacity=CapacityClass.SPOT,
                gpus=1,
                cpus=8,
                price_per_hour_usd=0.35,
                on_demand_price_per_hour_usd=1.1,
                launched_at=start,
            ),
            source="bench",
            time=start,
        )
        for n in range(NODES)
    ]
    await bus.publish_many(nodes)
    for first in range(0, jobs, 500):
        batch = [job_story(n, start) for n in range(first, min(first + 500, jobs))]
        await bus.publish_many([event for _, events in batch for event in events])
        await asyncio.gather(
            *(bucket.put(record.job_id, record.model_dump_json().encode()) for record, _ in batch)
        )
    await bus.close()


def wait_serving(url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:  # noqa: S310  # ours
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the page did not come up")


async def timed_load(page: Page, url: str, ready: str) -> float:
    started = time.perf_counter()
    await page.goto(url, wait_until="commit")
    await page.wait_for_function(ready, polling="raf")
    return time.perf_counter() - started


CHARTS_DRAWN = """() => ['timeline', 'metric'].every(id => {
    const element = document.getElementById(id);
    return element && Number(element.dataset.drawn || 0) >= 1;
})"""


EXPERIMENT_CHARTS_DRAWN = """() => ['by-experiment', 'by-owner', 'by-team', 'spend'].every(id => {
    const element = document.getElementById(id);
    return element && Number(element.dataset.drawn || 0) >= 1;
})"""


async def measure_page(url: str, runs: int, nats_url: str) -> dict[str, float]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        page = await browser.new_page()
        await page.goto(f"{url}/jobs")  # the browser's own start is not the page's
        first_render = [
            await timed_load(
                page, f"{url}/jobs", "() => document.querySelectorAll('tr[data-job]').length >= 50"
            )
            for _ in range(runs)
        ]
        job_page = [
            await timed_load(page, f"{url}/jobs/bench-{n * 997 % 10000:05d}", CHARTS_DRAWN)
            for n in range(runs)
        ]
        experiments = [
            await timed_load(page, f"{url}/experiments", EXPERIMENT_CHARTS_DRAWN)
            for _ in range(runs)
        ]
        updates = await measure_updates(page, url, runs, nats_url)
        await browser.close()
    return {
        "ui_first_render_s": statistics.median(first_render),
        "ui_job_page_s": statistics.median(job_page),
        "ui_experiments_page_s": statistics.median(experiments),
        "ui_update_s": statistics.median(updates),
    }


async def measure_updates(page: Page, url: str, runs: int, nats_url: str) -> list[float]:
    """A progress report of a job whose page is open: from its publish to the chart
    holding its step."""
    bus = await JetStreamBus.connect(BusSettings(nats_url=nats_url), name="bench-update")
    job_id = "bench-00042"
    await page.goto(f"{url}/jobs/{job_id}")
    await page.wait_for_function(CHARTS_DRAWN, polling="raf")
    took = []
    for run in range(runs):
        step = 1000 + run
        event = new_event(
            JobProgress(job_id=job_id, attempt=1, step=step, metrics={"loss": 0.1}),
            source="bench",
            time=datetime.now(UTC),
            subject=job_id,
        )
        shown = f"""() => {{
            const chart = echarts.getInstanceByDom(document.getElementById('metric'));
            return chart && chart.getOption().series[0].data.some(p => p[0] === {step});
        }}"""
        started = time.perf_counter()
        await bus.publish(event)
        await page.wait_for_function(shown, polling="raf")
        took.append(time.perf_counter() - started)
        await asyncio.sleep(0.3)
    await bus.close()
    return took


def cli_ls(nats_url: str, runs: int) -> float:
    env = {**os.environ, "SPOTRAIN_NATS_URL": nats_url}
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        result = subprocess.run(
            [*CLI, "ls", "--all", "--output", "json"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        took.append(time.perf_counter() - started)
        if result.returncode != 0:
            raise SystemExit(f"spotrain ls failed: {result.stderr.strip()}")
        if result.stdout.count('"job":') < 50:
            raise SystemExit(f"spotrain ls listed too little: {result.stdout[:200]}")
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = NatsServer(Path(folder) / "nats")
        server.start()
        ui = None
        try:
            started = time.perf_counter()
            asyncio.run(fill(server.url, args.jobs))
            wrote_s = time.perf_counter() - started
            events = args.jobs * 9 + NODES
            print(f"store: {args.jobs} jobs, {events} events (written in {wrote_s:.1f} s)")
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            env = {
                **os.environ,
                "SPOTRAIN_NATS_URL": server.url,
                "SPOTRAIN_UI_HTTP_PORT": str(port),
                "SPOTRAIN_UI_VIEWER": "alice",
            }
            started = time.perf_counter()
            ui = subprocess.Popen(
                [sys.executable, "-m", "shared.ui"], env=env, stderr=subprocess.DEVNULL
            )
            wait_serving(url)
            ui_start = time.perf_counter() - started
            figures: dict[str, Any] = {"ui_start_s": ui_start}
            figures |= asyncio.run(measure_page(url, args.runs, server.url))
            figures["cli_ls_s"] = cli_ls(server.url, args.runs)
        finally:
            if ui is not None:
                ui.terminate()
                try:
                    ui.wait(10)
                except subprocess.TimeoutExpired:
                    ui.kill()
            server.stop()
    print()
    print(f"{'figure':<20} {'page':>8} {'spotrain ls':>12}")
    print(f"{'jobs list':<20} {figures['ui_first_render_s']:>8.3f} {figures['cli_ls_s']:>12.3f}")
    print(f"{'a job':<20} {figures['ui_job_page_s']:>8.3f} {'':>12}")
    print(f"{'experiments':<20} {figures['ui_experiments_page_s']:>8.3f} {'':>12}")
    print(f"{'event to screen':<20} {figures['ui_update_s']:>8.3f} {'':>12}")
    print()
    names = (
        "ui_start_s",
        "ui_first_render_s",
        "ui_job_page_s",
        "ui_experiments_page_s",
        "ui_update_s",
        "cli_ls_s",
    )
    for name in names:
        print(f"{name}: {figures[name]:.3f}")


if __name__ == "__main__":
    main()
