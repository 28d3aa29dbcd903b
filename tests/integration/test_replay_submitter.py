"""Replaying `job.requested` to the submitter, for real: the requests reach its handlers a
second time, and no second record, Ray submission or answer comes of it."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from services.submitter.adapters.kv_job_store import KvJobStore
from services.submitter.handlers import SERVICE, SUBSCRIPTIONS, Deps
from services.submitter.policy import Quotas
from shared.events import Event, EventData, decode, subject_for
from shared.events.data import JobAccepted, JobQueued, JobRejected
from shared.jobs import jobs_bucket, refusals_bucket
from shared.localstack.ports import free_port
from shared.messaging import BusSettings, Subscription, bind_routes
from shared.messaging.jetstream import JetStreamBus
from tests.async_helpers import consuming, eventually
from tests.events import job_requested
from tests.fakes.clock import FixedClock
from tests.fakes.submitter import FakeProgress, FakeRay, FakeWorkspaces, place_queued
from tests.integration.test_replay_events import events_cli, instant

pytestmark = pytest.mark.integration

ANSWERS = (JobAccepted, JobRejected, JobQueued)


async def stored_types(bus: JetStreamBus, *models: type[EventData]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for model in models:
        for message in await bus.read(subject_for(model, bus.prefix)):
            counts[f"{model.aggregate}.{model.event}:{decode(message.data).subject}"] += 1
    return counts


async def test_replayed_requests_reach_the_submitter_and_start_nothing_twice(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, tmp_path: Path
) -> None:
    """The submitter's own handlers and job store (a real key-value bucket), Ray faked."""
    store = await KvJobStore.open(jetstream_bus, jobs_bucket(jetstream_bus.prefix))
    ray = FakeRay()
    deps = Deps(
        bus=jetstream_bus,
        clock=FixedClock(),
        store=store,
        ray=ray,
        workspaces=FakeWorkspaces(tmp_path),
        progress=FakeProgress(),
        quotas=Quotas(max_gpus_per_job=4, max_gpus_per_owner=8),
        checkpoint_root="file:///checkpoints",
    )
    delivered: list[str] = []
    routes = bind_routes(SUBSCRIPTIONS, deps)
    handle = routes[type(job_requested().data)]

    async def counted(event: Event[Any]) -> None:
        delivered.append(event.data.job_id)
        await handle(event)

    subscription = Subscription(
        service=SERVICE, routes={**routes, type(job_requested().data): counted}
    )
    requests = [
        job_requested("job-1", worker={"gpus": 2}),
        job_requested("job-2", worker={"gpus": 8}),
    ]
    async with consuming(jetstream_bus, subscription):
        since = await instant(jetstream_bus)
        await jetstream_bus.publish_many(requests)
        expected = {"job.accepted:job-1": 1, "job.queued:job-1": 1, "job.rejected:job-2": 1}

        async def answered() -> bool:
            return await stored_types(jetstream_bus, *ANSWERS) == expected

        await eventually(answered)
        assert await place_queued(deps) == ["job-1"]  # the scaler's part
        await eventually(lambda: len(ray.submitted) == 1)
        before = {job: await store.get(job) for job in ("job-1", "job-2")}

        result = await asyncio.to_thread(
            events_cli,
            bus_settings,
            "replay",
            "--since",
            since,
            "--type",
            "job.requested",
            "--to",
            SERVICE,
        )
        assert result.returncode == 0, result.stderr
        await eventually(lambda: sorted(delivered) == ["job-1", "job-1", "job-2", "job-2"])
        await asyncio.sleep(0.3)  # what a second handling would publish, it has by now

    assert [plan.submission_id for plan, _ in ray.submitted] == ["job-1-1"]
    assert {job: await store.get(job) for job in ("job-1", "job-2")} == before, "same revisions"
    assert await stored_types(jetstream_bus, *ANSWERS) == expected


def _metric(port: int, line_start: str) -> float | None:
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = re.search(rf"^{re.escape(line_start)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def test_the_submitter_service_takes_a_replay_and_answers_once(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings
) -> None:
    """The real service process, Ray unreachable: over-quota requests are answered without
    Ray. Its consumer takes the replay subjects; the answer is not published twice."""
    port = free_port()
    env = {
        **os.environ,
        "SPOTRAIN_NATS_URL": bus_settings.nats_url,
        "SPOTRAIN_SUBJECT_PREFIX": bus_settings.subject_prefix,
        "SPOTRAIN_SUBMITTER_HTTP_PORT": str(port),
    }
    process = subprocess.Popen(  # noqa: ASYNC220  # started once; the loop never waits on it
        [sys.executable, "-m", "services.submitter"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    handled = (
        'spotrain_events_handled_total{outcome="ack",service="submitter",'
        'type="spotrain.job.requested.v1"}'
    )
    try:
        since = await instant(jetstream_bus)
        await jetstream_bus.publish(job_requested("job-big", worker={"gpus": 16}))
        await eventually(lambda: _metric(port, handled) == 1.0, timeout_s=30)
        # Refused, its record is among the refusals, not the jobs.
        refusals = refusals_bucket(jobs_bucket(jetstream_bus.prefix))
        kv = await jetstream_bus.client.jetstream().key_value(refusals)
        revision = (await kv.get("job-big")).revision

        result = await asyncio.to_thread(
            events_cli, bus_settings, "replay", "--since", since, "--to", "submitter"
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode().strip().endswith(": 1 spotrain.job.requested.v1")
        await eventually(lambda: _metric(port, handled) == 2.0, timeout_s=15)
        assert (await kv.get("job-big")).revision == revision
        assert await stored_types(jetstream_bus, JobAccepted, JobRejected) == {
            "job.rejected:job-big": 1
        }
    finally:
        process.terminate()
        process.wait(timeout=15)
