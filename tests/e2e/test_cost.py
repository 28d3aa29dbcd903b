"""`spotrain cost` on the local stack: a job runs, another is preempted without notice, and
the figures match the node-seconds the scaler recorded on the bus."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import pytest

from shared.client import SpotrainClient
from shared.events.data import JobStarted, JobSucceeded, NodeLaunched, NodeLost, NodeReleased
from shared.jobs import JobState
from shared.messaging import BusSettings
from shared.policy.cost.attribution import exact, seconds
from shared.pools import NodeSightings
from tests.cli import ENTRY as SPOTRAIN
from tests.e2e.stack import spotrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCRIPT = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"


async def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", SPOTRAIN, *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=120,
        check=False,
    )


async def submit(env: dict[str, str], workdir: Path, experiment: str, *args: str) -> str:
    result = await run(
        env,
        "submit", "sleep.py", "--gpus", "1", "--spot", "--experiment", experiment,
        "--workdir", str(workdir), *args,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout.split()[-1]


async def bill(client: SpotrainClient, now: datetime) -> Fraction:
    """What the provider bills up to `now`, straight from the node events; a node still up
    up to the scaler's last sighting of it, as the ledger bills it."""
    sightings = await client.sightings()
    seen = dict(sightings.seen) if sightings is not None else {}
    launched: dict[str, NodeLaunched] = {}
    ended: dict[str, datetime] = {}
    for event in await client.cost_events():
        data = event.data
        if isinstance(data, NodeLaunched):
            launched.setdefault(data.node, data)
        elif isinstance(data, NodeReleased | NodeLost):
            end = data.released_at if isinstance(data, NodeReleased) else data.lost_at
            end = end or event.time
            ended[data.node] = min(ended.get(data.node, end), end)
    return sum(
        (
            seconds(min(ended.get(n.node, seen.get(n.node, n.launched_at)), now) - n.launched_at)
            * exact(n.price_per_hour_usd)
            / 3600
            for n in launched.values()
        ),
        Fraction(0),
    )


async def node_story(client: SpotrainClient, seen_before: NodeSightings | None) -> str:
    """Every node event and both sightings, for a failure to say which node moved how."""
    lines = [f"sightings before: {seen_before}", f"sightings now: {await client.sightings()}"]
    for event in await client.cost_events():
        if isinstance(event.data, NodeLaunched | NodeReleased | NodeLost):
            lines.append(f"{event.time.isoformat()} {event.source} {event.data!r}")
    return "\n".join(lines)


async def test_cost_matches_the_node_seconds_recorded(
    local_stack: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    (tmp_path / "sleep.py").write_text(SCRIPT)
    experiment = f"cost-{uuid.uuid4().hex[:6]}"
    settings = BusSettings(nats_url=local_stack["SPOTRAIN_NATS_URL"])

    done = await submit(local_stack, tmp_path, experiment, "--wait", "--", "3")
    doomed = await submit(local_stack, tmp_path, experiment, "--max-restarts", "0", "--", "300")
    async with await SpotrainClient.connect(settings) as client:
        nodes: tuple[str, ...] = ()
        while not nodes:
            assert time.monotonic() - started < 50, await client.job(doomed)
            await asyncio.sleep(0.5)
            record = await client.job(doomed)
            if record is not None and record.state is JobState.RUNNING and record.current:
                nodes = record.current.nodes
        [node] = nodes
        preempted = spotrain(local_stack, "preempt", node, "--notice", "0")
        assert preempted.returncode == 0, preempted.stderr
        while (record := await client.job(doomed)) is not None and record.is_active:
            assert time.monotonic() - started < 55, record
            await asyncio.sleep(0.5)

        seen_before = await client.sightings()
        before = await bill(client, datetime.now(UTC))
        by_pool = await run(local_stack, "cost", "--by", "pool", "--json")
        after = await bill(client, datetime.now(UTC))
        assert by_pool.returncode == 0, by_pool.stderr
        billed = sum(Fraction(str(row["cost_usd"])) for row in json.loads(by_pool.stdout))
        slack = Fraction(len(json.loads(by_pool.stdout)), 1_000_000)  # rounding per row
        assert before - slack <= billed <= after + slack, await node_story(client, seen_before)

        jobs = await run(local_stack, "cost", "--experiment", experiment, "--json")
        assert jobs.returncode == 0, jobs.stderr
        rows = {row["job"]: row for row in json.loads(jobs.stdout)}
        assert set(rows) == {done, doomed}
        # The finished job: half a 2-GPU node from its start to its end, nothing lost.
        history = await client.history(done)
        start = next(e.time for e in history if isinstance(e.data, JobStarted))
        end = next(e.time for e in history if isinstance(e.data, JobSucceeded))
        launches = [e.data for e in await client.cost_events() if isinstance(e.data, NodeLaunched)]
        [started_on] = next(e.data.nodes for e in history if isinstance(e.data, JobStarted))
        node_of = next(n for n in launches if n.node == started_on)
        share = Fraction(1, node_of.gpus)
        expected = seconds(end - start) * share * exact(node_of.price_per_hour_usd) / 3600
        assert rows[done]["cost_usd"] == pytest.approx(float(expected), abs=2e-6)
        assert rows[done]["waste_usd"] == 0
        assert rows[done]["saving_vs_on_demand_usd"] > 0, "spot is cheaper than on-demand"
        # The preempted job had no restart left: all it did is lost.
        assert rows[doomed]["cost_usd"] > 0
        assert rows[doomed]["waste_usd"] == rows[doomed]["cost_usd"]
    assert time.monotonic() - started < 60
