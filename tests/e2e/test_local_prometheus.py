"""`spotrain up --prometheus`: a real Prometheus scrapes the four services and Ray's nodes
(test_local_stack checks that `spotrain down` stops it with the rest)."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from shared.localstack.settings import LocalStackSettings
from shared.localstack.stack import SERVICES, StackError, prometheus_binary
from tests.e2e.stack import prometheus_url, spotrain

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

SCRAPED_WITHIN_S = 30


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


def test_the_stacks_prometheus_scrapes_every_service_and_ray(local_stack: dict[str, str]) -> None:
    """Every service is up under its own `service` label, and a Ray node is up."""
    try:
        prometheus_binary(LocalStackSettings())
    except StackError as e:
        pytest.fail(f"{e} (make test does it)")
    url = prometheus_url(local_stack)
    status = spotrain(local_stack, "status")
    assert status.returncode == 0, status.stdout
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
