"""The service runtime: a real service process, its endpoints, and a staged shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from contextlib import AsyncExitStack
from typing import Any

import pytest

from shared.events import Event, decode, subject_for
from shared.events.data import JobRejected, JobRequested
from shared.localstack.ports import free_port
from shared.messaging import BusSettings, EventBus, RedeliveryPolicy, Subscription
from shared.messaging.jetstream import JetStreamBus
from shared.runtime import RuntimeSettings, ServiceDefinition, Watch, serve
from tests.async_helpers import eventually
from tests.events import job_requested

pytestmark = pytest.mark.integration


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310  # local test server
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
    except OSError:
        return 0, ""


async def test_a_service_process_serves_health_and_metrics_and_stops_on_sigterm(
    bus_settings: BusSettings, jetstream_bus: JetStreamBus
) -> None:
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
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        await eventually(lambda: _get(f"http://127.0.0.1:{port}/healthz")[0] == 200, timeout_s=20)
        # Over the quota, so the submitter answers without needing Ray.
        await jetstream_bus.publish(job_requested("job-served", worker={"gpus": 16}))

        async def rejected() -> bool:
            stored = await jetstream_bus.read(subject_for(JobRejected, jetstream_bus.prefix))
            return [decode(m.data).subject for m in stored] == ["job-served"]

        await eventually(rejected)
        status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert (
            'spotrain_events_handled_total{outcome="ack",service="submitter",'
            'type="spotrain.job.requested.v1"} 1.0'
        ) in metrics
        assert _get(f"http://127.0.0.1:{port}/nothing-here")[0] == 404

        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.to_thread(process.communicate, timeout=15)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0
    lines = output.decode().splitlines()
    assert any('"event": "service.stopped"' in line for line in lines)
    assert all(line.startswith("{") for line in lines), "service logs are JSON lines"


async def test_a_second_installation_on_the_same_bus_and_prefix_is_refused_at_start(
    bus_settings: BusSettings,
) -> None:
    """Two installations on one NATS with one prefix would share each service's leader:
    the first claims the leases bucket, the second exits with one line naming the fix."""
    port = free_port()
    env = {
        **os.environ,
        "SPOTRAIN_NATS_URL": bus_settings.nats_url,
        "SPOTRAIN_SUBJECT_PREFIX": bus_settings.subject_prefix,
        "SPOTRAIN_SUBMITTER_HTTP_PORT": str(port),
        "SPOTRAIN_SUBMITTER_RELEASE": "ml/spotrain",
    }
    first = subprocess.Popen(  # noqa: ASYNC220  # started once; the loop never waits on it
        [sys.executable, "-m", "services.submitter"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: _get(f"http://127.0.0.1:{port}/healthz")[0] == 200, timeout_s=20)
        other = {**env, "SPOTRAIN_SUBMITTER_HTTP_PORT": "0"}
        other["SPOTRAIN_SUBMITTER_RELEASE"] = "research/spotrain"
        second = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.submitter"],
            env=other,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2, second.stderr
    # One line besides the JSON log: the service never said it started.
    [line] = [line for line in second.stderr.splitlines() if not line.startswith("{")]
    assert '"service.started"' not in second.stderr
    assert line.startswith("submitter: error: the leases bucket ")
    assert "'ml/spotrain'" in line
    assert "SPOTRAIN_SUBJECT_PREFIX" in line


def _runtime(grace_period_s: float) -> RuntimeSettings:
    return RuntimeSettings(http_port=0, grace_period_s=grace_period_s, log_json=True)


async def test_shutdown_waits_for_the_in_flight_handler(bus_settings: BusSettings) -> None:
    started, finished = asyncio.Event(), asyncio.Event()

    async def slow(event: Event[Any]) -> None:
        started.set()
        await asyncio.sleep(0.5)
        finished.set()

    async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
        await bus.publish(job_requested("job-slow"))
        return ServiceDefinition(
            name="svc", subscriptions=[Subscription(service="svc", routes={JobRequested: slow})]
        )

    stop = asyncio.Event()
    service = asyncio.create_task(
        serve("svc", bootstrap, bus_settings=bus_settings, runtime=_runtime(10), stop=stop)
    )
    await asyncio.wait_for(started.wait(), timeout=10)
    stop.set()
    await asyncio.wait_for(service, timeout=10)
    assert finished.is_set()


async def test_a_handler_past_the_grace_period_is_cancelled_and_redelivered(
    bus_settings: BusSettings,
) -> None:
    calls: list[str] = []
    hang = asyncio.Event()

    async def stuck(event: Event[Any]) -> None:
        calls.append(event.data.job_id)
        if len(calls) == 1:
            await hang.wait()

    async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
        if not calls:
            await bus.publish(job_requested("job-stuck"))
        return ServiceDefinition(
            name="svc",
            subscriptions=[
                Subscription(
                    service="svc", routes={JobRequested: stuck}, redelivery=RedeliveryPolicy()
                )
            ],
        )

    fast_redelivery = bus_settings.model_copy(update={"ack_wait_s": 1.0})
    stop = asyncio.Event()
    service = asyncio.create_task(
        serve("svc", bootstrap, bus_settings=fast_redelivery, runtime=_runtime(0.3), stop=stop)
    )
    await eventually(lambda: len(calls) == 1)
    stop.set()
    await asyncio.wait_for(service, timeout=5)

    again = asyncio.Event()
    service = asyncio.create_task(
        serve("svc", bootstrap, bus_settings=fast_redelivery, runtime=_runtime(1), stop=again)
    )
    await eventually(lambda: len(calls) == 2, timeout_s=10)
    again.set()
    await asyncio.wait_for(service, timeout=5)
    assert calls == ["job-stuck", "job-stuck"]


async def test_a_watch_that_fails_is_started_again_and_ends_with_the_service(
    bus_settings: BusSettings,
) -> None:
    runs: list[str] = []

    async def flaky(stop: asyncio.Event) -> None:
        runs.append("started")
        if len(runs) == 1:
            msg = "the source dropped the connection"
            raise ConnectionError(msg)
        await stop.wait()
        runs.append("stopped")

    async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
        return ServiceDefinition(
            name="svc", watches=[Watch(name="flaky", run=flaky, restart_after_s=0.05)]
        )

    stop = asyncio.Event()
    service = asyncio.create_task(
        serve("svc", bootstrap, bus_settings=bus_settings, runtime=_runtime(5), stop=stop)
    )
    await eventually(lambda: runs == ["started", "started"])
    stop.set()
    await asyncio.wait_for(service, timeout=10)
    assert runs == ["started", "started", "stopped"]
