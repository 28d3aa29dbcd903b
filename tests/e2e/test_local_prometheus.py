"""`spotrain up --prometheus`: a real Prometheus scrapes the four services and Ray's nodes,
and `spotrain down` stops it with the rest."""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.localstack.ports import free_port
from shared.localstack.processes import session_processes
from shared.localstack.settings import LocalStackSettings
from shared.localstack.stack import SERVICES, StackError, prometheus_binary
from tests.e2e.stack import sessions, spotrain, stack_env

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

SCRAPED_WITHIN_S = 30


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "stack"
    yield home
    # Whatever happened in the test, leave nothing running (Prometheus included).
    spotrain({**os.environ, "SPOTRAIN_LOCAL_HOME": str(home)}, "down")


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310  # our own http URL
        return json.load(response)


def targets_up(prometheus_url: str) -> dict[str, list[dict[str, Any]]]:
    """The active targets Prometheus reports healthy, by job."""
    found: dict[str, list[dict[str, Any]]] = {}
    for target in get(f"{prometheus_url}/api/v1/targets?state=active")["data"]["activeTargets"]:
        if target["health"] == "up":
            found.setdefault(target["labels"]["job"], []).append(target)
    return found


def test_up_prometheus_scrapes_services_and_ray_until_down(home: Path) -> None:
    """Every service is up under its own `service` label, a Ray node is up, and `down`
    stops Prometheus with everything else."""
    try:
        prometheus_binary(LocalStackSettings())
    except StackError as e:
        pytest.fail(f"{e} (make test does it)")
    env = {**stack_env(home), "SPOTRAIN_LOCAL_PROMETHEUS_PORT": str(free_port())}
    url = f"http://127.0.0.1:{env['SPOTRAIN_LOCAL_PROMETHEUS_PORT']}"

    up = spotrain(env, "up", "--prometheus")
    assert up.returncode == 0, up.stderr + up.stdout
    status = spotrain(env, "status")
    assert status.returncode == 0, status.stdout
    assert "prometheus" in status.stdout
    assert url in status.stdout

    deadline = time.monotonic() + SCRAPED_WITHIN_S
    up_by_job = targets_up(url)
    while len(up_by_job.get("spotrain", [])) < 4 or not up_by_job.get("ray"):
        assert time.monotonic() < deadline, f"not all scraped in {SCRAPED_WITHIN_S}s: {up_by_job}"
        time.sleep(0.5)
        up_by_job = targets_up(url)
    assert sorted(t["labels"]["service"] for t in up_by_job["spotrain"]) == sorted(SERVICES)

    query = urllib.parse.urlencode({"query": 'up{job="spotrain"}'})
    series = get(f"{url}/api/v1/query?{query}")["data"]["result"]
    assert sorted(s["metric"]["service"] for s in series) == sorted(SERVICES)
    assert [s["value"][1] for s in series] == ["1"] * 4

    leader = sessions(home)["prometheus"]
    down = spotrain(env, "down")
    assert down.returncode == 0, down.stderr
    assert "prometheus" in down.stdout
    assert session_processes(leader) == []
    assert "prometheus" not in sessions(home)
