"""Helpers for end-to-end tests: a local stack of its own, driven through the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.client import SpotrainClient
from shared.jobs import JobRecord
from shared.localstack.processes import ProcessRecord
from shared.localstack.settings import isolated_stack

CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]


def spotrain(
    env: dict[str, str], *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout_s, check=False
    )


def stack_env(home: Path) -> dict[str, str]:
    """A stack of its own: its own state directory and free ports for everything."""
    return {**os.environ, **isolated_stack(home).environment()}


def sessions(home: Path) -> dict[str, int]:
    return {
        path.stem: ProcessRecord(**json.loads(path.read_text())).pid
        for path in (home / "run").glob("*.json")
    }


def demo_figures(stdout: str) -> dict[str, str]:
    """The `name: value` lines the demo ends with."""
    names = ("preemptions", "resume_after_loss_s", "steps_lost", "result_matches_uninterrupted")
    figures = {}
    for line in stdout.splitlines():
        name, _, value = line.partition(": ")
        if name in names:
            figures[name] = value.strip()
    return figures


def prometheus_url(env: dict[str, str]) -> str:
    return f"http://127.0.0.1:{env['SPOTRAIN_LOCAL_PROMETHEUS_PORT']}"


def query_range(url: str, promql: str, start: float, end: float) -> list[dict[str, Any]]:
    """A range query of the stack's Prometheus: its series, each with its `values`."""
    params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "2"}
    return prometheus_get(f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}")


def prometheus_get(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310  # the stack's own
        body = json.load(response)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def until(
    client: SpotrainClient,
    job_id: str,
    what: str,
    ok: Callable[[JobRecord], bool],
    timeout_s: float = 120,
) -> JobRecord:
    """The job's record once `ok` holds, read four times a second; fails naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = await client.job(job_id)
        if record is not None and ok(record):
            return record
        assert time.monotonic() < deadline, f"{job_id}: no {what}: {record}"
        await asyncio.sleep(0.25)
