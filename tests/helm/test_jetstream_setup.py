"""The chart's JetStream hook, run as the rendered Job runs it, against a real nats-server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from services.scaler.adapters.kv_demand import KvDemandStore
from services.submitter.adapters.kv_job_store import KvJobStore
from shared.jobs import jobs_bucket, refusals_bucket
from shared.localstack.nats_server import NatsServer
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.pools import pools_bucket
from shared.workspace import uploads_bucket, workspaces_bucket
from tests.helm.chart import REQUIRED_SETS, Helm, Manifest, env_of, kinds

pytestmark = [pytest.mark.helm, pytest.mark.integration]


def _run_hook(job: Manifest, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = [*container["command"], *container["args"]]
    assert command[0] == "python"
    return subprocess.run(
        [sys.executable, *command[1:]],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


async def test_hook_declares_what_the_services_then_open_unchanged(
    helm: Helm, nats_server: NatsServer
) -> None:
    """Stream and buckets exist after the hook; a second run and each service's own
    declaration accept them as they are (a differing configuration would be refused)."""
    # The test's server asks for no credentials (the chart's credentials have tests of
    # their own).
    rendered = helm.render(
        sets={**REQUIRED_SETS, "natsCredentials.enabled": "false", "bus.replicas": "1"}
    )
    (job,) = kinds(rendered, "Job")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRAIN_")}
    env |= env_of(job["spec"]["template"]["spec"]["containers"][0])
    env |= {"SPOTRAIN_NATS_URL": nats_server.url, "SPOTRAIN_SUBJECT_PREFIX": prefix}
    for attempt in ("install", "upgrade"):
        result = _run_hook(job, env)
        assert result.returncode == 0, (attempt, result.stderr)
        assert "jetstream.declared" in result.stdout + result.stderr

    settings = BusSettings(nats_url=nats_server.url, subject_prefix=prefix, connect_timeout_s=5)
    bus = await JetStreamBus.connect(settings, name="test")
    try:
        await bus.ensure_stream()
        js = bus.client.jetstream()
        info = await js.stream_info(settings.stream)
        assert info.config.subjects == [f"{prefix}.>"]
        await KvJobStore.open(bus, jobs_bucket(prefix))
        await KvDemandStore.open(bus, pools_bucket(prefix))
        for bucket in (
            jobs_bucket(prefix),
            refusals_bucket(jobs_bucket(prefix)),
            pools_bucket(prefix),
        ):
            await js.key_value(bucket)  # raises BucketNotFoundError if the hook left it out
        # The object stores too: declared by the platform, never on first use.
        for store in (workspaces_bucket(prefix), uploads_bucket(prefix)):
            await js.object_store(store)
    finally:
        await bus.close()


def test_hook_fails_loudly_when_nats_is_unreachable(minimal: list[Manifest]) -> None:
    """The Job fails (and the install with it) rather than letting services start blind."""
    (job,) = kinds(minimal, "Job")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRAIN_")}
    env |= {
        "SPOTRAIN_NATS_URL": "nats://127.0.0.1:9",
        "SPOTRAIN_CONNECT_TIMEOUT_S": "1",
    }
    result = _run_hook(job, env)
    assert result.returncode != 0
    assert "cannot reach NATS" in result.stderr


def test_hook_refuses_more_copies_than_the_cluster_has_servers_in_one_line(
    minimal: list[Manifest], nats_server: NatsServer
) -> None:
    """The chart's default, three copies, against a single server: the install fails with
    one line naming the setting, not a hang or a traceback."""
    (job,) = kinds(minimal, "Job")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTRAIN_")}
    env |= env_of(job["spec"]["template"]["spec"]["containers"][0])
    env |= {"SPOTRAIN_NATS_URL": nats_server.url, "SPOTRAIN_SUBJECT_PREFIX": "tcopies"}
    env.pop("SPOTRAIN_NATS_CREDS_FILE", None)
    result = _run_hook(job, env)
    assert result.returncode != 0
    [line] = [line for line in result.stderr.splitlines() if "error" in line]
    assert line.startswith("jetstream-setup: error: SPOTRAIN_REPLICAS=3: ")
    assert "Traceback" not in result.stderr
