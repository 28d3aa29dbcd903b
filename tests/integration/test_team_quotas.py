"""Team quotas across two submitter replicas on a real nats-server: both admit at once,
each with its own lock and connection, and the team's quota holds because every hold is
written by compare-and-set on the one `holds` value of the teams bucket. Ray is faked:
the quota is the submitter's, and tests/e2e runs the same admission on real Ray."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.submitter.adapters.kv_job_store import KvJobStore
from services.submitter.adapters.team_holds import KvTeamHolds
from services.submitter.adapters.teams_file import TeamsFile
from services.submitter.handlers import Deps, admit_waiting, on_job_requested, track_attempts
from services.submitter.model import RayJobState
from services.submitter.policy import Quotas
from shared.events.types import CapacityClass
from shared.jobs import AttemptState, JobRecord, JobState, jobs_bucket
from shared.messaging import BusSettings
from shared.messaging.jetstream import JetStreamBus
from shared.policy.teams import TeamHolds, teams_bucket
from shared.pools import OwnersSpend, PoolsStatus, PoolStatus
from tests.events import NOW, job_requested
from tests.fakes.clock import FixedClock
from tests.fakes.submitter import FakeProgress, FakeRay, FakeWorkspaces, FixedPools, place_queued
from tests.integration.test_cost_cli import spotrain

pytestmark = pytest.mark.integration

TEAMS = """
[teams.vision]
members = ["alice", "bob"]
[teams.vision.quota.spot]
guaranteed_gpus = 4
borrow_gpus = 2

[teams.nlp]
members = ["carol"]
[teams.nlp.quota.spot]
guaranteed_gpus = 2
"""


@pytest.fixture
async def replicas(
    jetstream_bus: JetStreamBus, bus_settings: BusSettings, tmp_path: Path
) -> AsyncIterator[tuple[Deps, Deps]]:
    teams_file = tmp_path / "teams.toml"
    teams_file.write_text(TEAMS)
    other = await JetStreamBus.connect(bus_settings, name="submitter-2")
    made = []
    for bus in (jetstream_bus, other):
        made.append(
            Deps(
                bus=bus,
                clock=FixedClock(),
                store=await KvJobStore.open(bus, jobs_bucket(bus.prefix)),
                ray=FakeRay(),
                workspaces=FakeWorkspaces(tmp_path),
                progress=FakeProgress(),
                quotas=Quotas(max_gpus_per_job=8, max_gpus_per_owner=64),
                checkpoint_root="file:///checkpoints",
                teams=TeamsFile(teams_file),
                holds=await KvTeamHolds.open(bus, teams_bucket(bus.prefix)),
            )
        )
    yield made[0], made[1]
    await other.close()


def ray(deps: Deps) -> FakeRay:
    assert isinstance(deps.ray, FakeRay)
    return deps.ray


async def holds_of(deps: Deps) -> TeamHolds:
    assert deps.holds is not None
    holds, _ = await deps.holds.read()
    return holds


async def test_two_replicas_admitting_at_once_keep_the_teams_quota(
    replicas: tuple[Deps, Deps],
) -> None:
    one, two = replicas
    requests = [
        job_requested(
            f"v-{n}",
            owner="alice" if n % 2 else "bob",
            worker={"gpus": 1},
            capacity=CapacityClass.SPOT,
        )
        for n in range(12)
    ] + [
        job_requested(f"n-{n}", owner="carol", worker={"gpus": 1}, capacity=CapacityClass.SPOT)
        for n in range(3)
    ]
    await asyncio.gather(
        *(on_job_requested(r, one if n % 2 else two) for n, r in enumerate(requests))
    )
    records = [r for r, _ in await one.store.all()]
    live = [r for r in records if holding(r)]
    by_team: dict[str | None, int] = {}
    for record in live:
        by_team[record.team] = by_team.get(record.team, 0) + record.gpus
    # vision takes its 4 and may borrow nlp's idle 2; nlp's requests race it for those, and
    # take back what vision borrowed (a job not on a node yet gives way at once): whoever
    # wins, the 6 GPUs the teams share are all held, and not one more.
    assert sum(by_team.values()) == 6
    assert by_team.get("vision", 0) >= 4
    holds = await holds_of(one)
    assert {h.job_id for h in holds.holds.values()} == {r.job_id for r in live}, (
        "a hold for each admitted job, and only for those"
    )
    gave_way = [r for r in records if r.current is not None and r.current.give_way is not None]
    assert all(r.team == "vision" for r in gave_way), "only borrowed work is taken back"
    waiting = [r for r in records if r.waiting_for is not None]
    assert len(waiting) + len(live) + len(gave_way) == len(requests)
    assert all(r.state is JobState.QUEUED and not r.attempts for r in waiting)
    # Jobs asked to give way while queued had nothing in Ray: nothing to stop, nothing lost.
    assert all(r.current is not None and r.current.state is AttemptState.LOST for r in gave_way)
    await place_queued(one)  # the scaler's part: each admitted job is placed, once
    submitted = [p.submission_id for d in replicas for p, _ in ray(d).submitted]
    assert len(submitted) == len(set(submitted)) == len(live)

    # The admitted jobs end on whichever replica ran them; both replicas then hand the
    # freed quota out at once, and again no more than the quota runs.
    for deps in replicas:
        for plan, _ in ray(deps).submitted:
            if plan.submission_id in {f"{r.job_id}-1" for r in live}:
                ray(deps).set(plan.submission_id, RayJobState.SUCCEEDED)
    await asyncio.gather(track_attempts(one), track_attempts(two))
    assert (await holds_of(one)).holds == {}, "every ended job gave its GPUs back"
    await asyncio.gather(admit_waiting(one), admit_waiting(two))
    records = [r for r, _ in await one.store.all()]
    now_running = [r for r in records if holding(r)]
    assert sum(r.gpus for r in now_running) == 6
    holds = await holds_of(one)
    assert {h.job_id for h in holds.holds.values()} == {r.job_id for r in now_running}


def holding(record: JobRecord) -> bool:
    """Admitted and holding its GPUs: a live attempt not asked to give way."""
    attempt = record.current
    return (
        record.is_active
        and record.waiting_for is None
        and attempt is not None
        and attempt.state in (AttemptState.QUEUED, AttemptState.SUBMITTED, AttemptState.RUNNING)
        and attempt.give_way is None
    )


async def test_spotrain_teams_shows_each_teams_use(
    replicas: tuple[Deps, Deps], bus_settings: BusSettings
) -> None:
    one, _ = replicas
    for n in range(7):
        await on_job_requested(
            job_requested(f"v-{n}", worker={"gpus": 1}, capacity=CapacityClass.SPOT), one
        )
    await admit_waiting(one)
    done = await asyncio.to_thread(spotrain, bus_settings, "teams", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["team"]: row for row in json.loads(done.stdout)}
    assert rows["vision"]["members"] == 2
    assert (rows["vision"]["held_gpus"], rows["vision"]["borrowed_gpus"]) == (6, 2)
    assert rows["vision"]["waiting_jobs"] == 1
    assert (rows["nlp"]["held_gpus"], rows["nlp"]["lent_gpus"]) == (0, 2)
    table = await asyncio.to_thread(spotrain, bus_settings, "teams")
    assert table.returncode == 0, table.stderr
    assert "vision" in table.stdout
    assert "nlp" in table.stdout


async def test_spotrain_teams_without_teams_says_so_in_one_line(
    bus_settings: BusSettings, jetstream_bus: JetStreamBus
) -> None:
    done = await asyncio.to_thread(spotrain, bus_settings, "teams")
    assert done.returncode == 1
    assert done.stderr.startswith("spotrain: error: no teams: the submitter runs without")
    assert done.stderr.count("\n") == 1


async def test_two_replicas_admitting_at_once_keep_the_teams_budget(
    replicas: tuple[Deps, Deps], tmp_path: Path
) -> None:
    """Each admitted job reserves its worst case in the holds: $60 of budget left, $10 a
    job, so six of twelve requests sent to both replicas at once run, the rest wait."""
    budgeted = tmp_path / "budget.toml"
    budgeted.write_text(
        '[teams.vision]\nmembers = ["alice"]\nmonthly_budget_usd = 100\n'
        "[teams.vision.quota.spot]\nguaranteed_gpus = 100\n"
    )
    spend = OwnersSpend(since=NOW.replace(day=1), at=NOW, by_owner={"alice": 40.0})
    status = PoolsStatus(
        updated_at=NOW, budget_per_hour_usd=100, cost_per_hour_usd=0, blocked_jobs=0,
        pools=(
            PoolStatus(
                pool="gpu-spot", capacity=CapacityClass.SPOT, price_per_hour_usd=2.0, nodes=0,
                ready=0, gpus_total=0, gpus_free=0, pending_jobs=0, pending_gpus=0, target=0,
                min_nodes=0, max_nodes=9, gpus_per_node=2,
            ),
        ),
    )  # fmt: skip
    one, two = (
        dataclasses.replace(d, teams=TeamsFile(budgeted), pools=FixedPools(status, spend))
        for d in replicas
    )
    requests = [
        job_requested(f"b-{n}", worker={"gpus": 1}, capacity=CapacityClass.SPOT, max_hours=10)
        for n in range(12)
    ]
    await asyncio.gather(
        *(on_job_requested(r, one if n % 2 else two) for n, r in enumerate(requests))
    )
    records = await one.store.all()
    admitted = [r for r, _ in records if holding(r)]
    assert len(admitted) == 6
    holds = await holds_of(one)
    assert sum(h.worst_case_usd for h in holds.holds.values()) == pytest.approx(60.0)
    waiting = [r.waiting_for for r, _ in records if r.waiting_for is not None]
    assert len(waiting) == 6
    assert all("over the budget of $100.00" in w for w in waiting)
