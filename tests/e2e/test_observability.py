"""What a preempted training run looks like from outside: the demo (a real run on a spot node,
preempted with a notice, resumed from its checkpoint) on the local stack, then the real
Prometheus that scraped it. Every dashboard panel's query returns data, and the figures the
metrics give are the ones `spotrain cost` and the job record give."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from shared.client import SpotrainClient
from shared.jobs import JobRecord
from shared.messaging import BusSettings
from tests.e2e.stack import demo_figures, prometheus_get, prometheus_url, query_range, spotrain
from tests.helm.dashboards import (
    NEEDS_MULTI_NODE_JOB,
    NEEDS_REAL_GPUS,
    dashboard_files,
    load,
    panel_queries,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# Four scrapes (every 2 s on the local stack), as Grafana's $__rate_interval would be.
SUBSTITUTIONS = {"__rate_interval": "8s", "job_id": ".*"}
SETTLED_WITHIN_S = 30
"""The cost meter attributes every 10 s (plus the pass) and Prometheus scrapes every 2 s."""


def query(url: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
    return prometheus_get(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}")


def scalar(url: str, promql: str, at: float | None = None) -> float:
    """The one value of an aggregate (0 when nothing matches)."""
    result = query(url, promql, at)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else 0.0


async def job_record(env: dict[str, str], job_id: str) -> JobRecord:
    settings = BusSettings(nats_url=env["SPOTRAIN_NATS_URL"])
    async with await SpotrainClient.connect(settings) as client:
        record = await client.job(job_id)
    assert record is not None
    return record


def finite_points(series: list[dict[str, Any]]) -> int:
    return sum(1 for s in series for _, v in s["values"] if math.isfinite(float(v)))


def test_a_preempted_run_shows_in_every_dashboard_and_the_metrics_match_the_records(
    local_stack: dict[str, str],
) -> None:
    url = prometheus_url(local_stack)
    before = time.time()
    counted_before = {
        name: scalar(url, f"sum({name})", before)
        for name in (
            "spotrain_preemption_notices_total",
            "spotrain_resumes_total",
            "spotrain_recovery_seconds_count",
            "spotrain_checkpoint_requests_total",
        )
    }

    demo = spotrain(local_stack, "demo", "--notice", "5s", timeout_s=300)
    assert demo.returncode == 0, demo.stderr + demo.stdout
    figures = demo_figures(demo.stdout)
    assert "interrupted: preempted" in demo.stdout, "stopped on request, not by the kill"
    assert int(figures["steps_lost"]) <= 1
    assert figures["result_matches_uninterrupted"] == "true", demo.stdout
    [job_id] = re.findall(r"submitted (demo-\w+)", demo.stdout)

    # The dollars: the metric settles on what `spotrain cost` says for the experiment. Both are
    # read again until they agree: the demo may return before the submitter has closed the
    # attempt's record, and until then `cost` counts the open attempt up to the moment it asks.
    deadline = time.monotonic() + SETTLED_WITHIN_S
    while True:
        cost = spotrain(local_stack, "cost", "--by", "experiment", "--json")
        assert cost.returncode == 0, cost.stderr
        [row] = [r for r in json.loads(cost.stdout) if r["experiment"] == "preemption-demo"]
        exported = {
            figure: scalar(url, f'sum({metric}{{experiment="preemption-demo"}})')
            for figure, metric in (
                ("cost_usd", "spotrain_cost_usd"),
                ("waste_usd", "spotrain_waste_usd"),
                ("gpu_hours", "spotrain_gpu_hours"),
            )
        }
        if all(exported[f] == pytest.approx(row[f], abs=1e-5) for f in exported):
            break
        assert time.monotonic() < deadline, f"metrics {exported} never matched {row}"
        time.sleep(1)
    assert row["cost_usd"] > 0

    # The happenings: one notice, one checkpoint asked for, one resume, one recovery.
    end = time.time()
    for name, was in counted_before.items():
        assert scalar(url, f"sum({name})", end) >= was + 1, name

    # The job's progress while it ran, and its record at the end agree.
    record = asyncio.run(job_record(local_stack, job_id))
    final_step = record.attempts[-1].step
    assert final_step is not None
    steps = query_range(url, f'spotrain_job_step{{job_id="{job_id}"}}', before, end)
    reported = [float(v) for s in steps for _, v in s["values"]]
    assert reported, "its progress was scraped while it ran"
    assert 0 < max(reported) <= final_step
    attempts = query_range(url, f'spotrain_job_attempt{{job_id="{job_id}"}}', before, end)
    assert {float(v) for s in attempts for _, v in s["values"]} >= {1.0, 2.0}
    eta = query_range(url, f'spotrain_job_eta_seconds{{job_id="{job_id}"}}', before, end)
    assert finite_points(eta) > 0

    # Every panel of every dashboard has something to draw for the run just made.
    has_gpus = shutil.which("nvidia-smi") is not None
    empty = []
    for path in dashboard_files():
        for title, promql in panel_queries(load(path), SUBSTITUTIONS):
            points = finite_points(query_range(url, promql, before, end))
            if title in NEEDS_MULTI_NODE_JOB:
                continue  # this run is of one node; test_elastic's is of several
            if title in NEEDS_REAL_GPUS and not has_gpus:
                assert points == 0, f"{title}: device figures without a device? {promql}"
                continue
            if points == 0:
                empty.append(f"{path.stem} / {title}: {promql}")
    assert empty == [], "\n".join(empty)
