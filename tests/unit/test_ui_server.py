"""The web page's server against an in-memory platform: bad input gets a clear page and no
stack trace, cancel is offered and taken only on the viewer's own jobs, and an open page
hears of its job's changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shared.events import Event, EventData, new_event
from shared.events.data import (
    JobProgress,
    JobRequested,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
)
from shared.events.types import CapacityClass
from shared.jobs import AttemptState, JobRecord, JobState
from shared.policy.teams import TeamHolds, Teams, TeamsStatus
from shared.pools import NodeSightings, PoolsStatus
from shared.ui.board import Board
from shared.ui.server import Page, Viewing, app
from tests.fakes.clock import FixedClock
from tests.unit.test_records_desk import TEAMS
from tests.unit.test_ui_views import attempt, record

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


class Platform:
    def __init__(self, records: list[JobRecord], teams: Teams | None = None) -> None:
        self.records = {r.job_id: r for r in records}
        self.cancelled: list[tuple[str, str]] = []
        self.teams_file = teams

    async def jobs(self) -> list[JobRecord]:
        return list(self.records.values())

    async def pools(self) -> PoolsStatus | None:
        return None

    async def teams(self) -> TeamsStatus | None:
        if self.teams_file is None:
            return None
        return TeamsStatus(teams=self.teams_file, holds=TeamHolds(), at=NOW)

    async def sightings(self) -> NodeSightings | None:
        # Every node seen alive now: the ledger bills them up to now.
        nodes = {f"node-{job_id}": NOW for job_id in self.records}
        return NodeSightings(updated_at=NOW, pass_interval_s=5, seen=nodes)

    async def cancel(self, job_id: str, requested_by: str) -> None:
        self.cancelled.append((job_id, requested_by))


async def no_logs(submission_id: str) -> str | None:
    return None


def running(job_id: str, owner: str) -> JobRecord:
    return record(
        job_id,
        owner=owner,
        attempts=(attempt(1, AttemptState.RUNNING, started_at=NOW - timedelta(seconds=30)),),
    )


@pytest.fixture
def platform() -> Platform:
    return Platform([running("mine", "alice"), running("bobs", "bob")])


@pytest.fixture
async def page(platform: Platform) -> Page:
    page = Page(Board(), platform, FixedClock(NOW), viewer="alice", logs=no_logs)
    await page.load()
    return page


@pytest.fixture
async def client(page: Page) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    async with TestClient(TestServer(app(page))) as client:
        yield client


async def test_an_unknown_job_is_a_page_saying_so(client: TestClient) -> None:  # type: ignore[type-arg]
    response = await client.get("/jobs/no-such-job")

    assert response.status == 404
    body = await response.text()
    assert "no job no-such-job that you may see" in body
    assert "Traceback" not in body


async def test_a_malformed_filter_is_a_page_saying_what_is_wrong(client: TestClient) -> None:  # type: ignore[type-arg]
    response = await client.get("/jobs?state=bogus")

    assert response.status == 400
    assert "state must be one of" in await response.text()


async def test_a_failure_inside_is_one_line_not_a_trace(
    client: TestClient,  # type: ignore[type-arg]
    page: Page,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(viewing: object) -> None:
        raise RuntimeError("secret detail /etc/passwd")

    monkeypatch.setattr(page, "ledger", broken)

    response = await client.get("/jobs")

    assert response.status == 500
    body = await response.text()
    assert "the page failed: RuntimeError" in body
    assert "secret detail" not in body
    assert "Traceback" not in body


async def test_cancel_is_offered_on_the_viewers_own_job_only(client: TestClient) -> None:  # type: ignore[type-arg]
    mine = await (await client.get("/jobs/mine")).text()
    bobs = await (await client.get("/jobs/bobs")).text()

    assert 'id="cancel"' in mine
    assert 'id="cancel"' not in bobs


async def test_cancel_is_taken_from_the_page_on_the_viewers_own_job_only(
    client: TestClient,  # type: ignore[type-arg]
    platform: Platform,
) -> None:
    from_elsewhere = await client.post("/jobs/mine/cancel")
    on_bobs = await client.post("/jobs/bobs/cancel", headers={"HX-Request": "true"})
    on_mine = await client.post("/jobs/mine/cancel", headers={"HX-Request": "true"})

    assert (from_elsewhere.status, on_bobs.status, on_mine.status) == (403, 403, 200)
    assert "not yours to cancel" in await on_bobs.text()
    assert platform.cancelled == [("mine", "alice")]


async def test_a_finished_job_offers_no_cancel(page: Page, client: TestClient) -> None:  # type: ignore[type-arg]
    page.board.put_record(
        record("done", owner="alice", state=JobState.SUCCEEDED).model_copy(
            update={"updated_at": NOW + timedelta(seconds=1)}
        )
    )

    assert 'id="cancel"' not in await (await client.get("/jobs/done")).text()


async def test_an_open_job_page_hears_of_its_jobs_events_only(
    page: Page,
    client: TestClient,  # type: ignore[type-arg]
) -> None:
    response = await client.get("/events?job=mine")
    await asyncio.sleep(0.05)  # the stream is open once the server has its queue
    assert len(page.changes.queues) == 1

    for job_id in ("bobs", "mine"):
        progress = JobProgress(job_id=job_id, attempt=1, step=10, metrics={"loss": 0.5})
        page.take(new_event(progress, source="test", time=NOW, subject=job_id))
    line = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)

    assert line == b'event: job\ndata: "mine"\n\n'
    response.close()


async def test_the_record_a_page_shows_is_the_one_written_after_the_jobs_event(
    page: Page,
    client: TestClient,  # type: ignore[type-arg]
) -> None:
    """The submitter publishes a transition's events, then writes the record: the page
    hears both, and shows the record as written, never one read at the event."""
    response = await client.get("/events?job=mine")
    await asyncio.sleep(0.05)
    done = page.board.records["mine"].model_copy(
        update={"state": JobState.SUCCEEDED, "updated_at": NOW + timedelta(seconds=1)}
    )

    page.take(new_event(JobSucceeded(job_id="mine", attempt=1), source="t", time=NOW))
    first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
    page.written(done)
    second = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
    page.written(done)  # heard twice: nothing new to say

    assert first == second == b'event: job\ndata: "mine"\n\n'
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(response.content.readuntil(b"\n\n"), 0.5)
    summary = await (await client.get("/jobs/mine/summary")).text()
    assert 'id="state">succeeded' in summary
    response.close()


async def test_a_client_that_drops_its_stream_is_let_go(
    page: Page,
    client: TestClient,  # type: ignore[type-arg]
) -> None:
    response = await client.get("/events")
    await asyncio.sleep(0.05)
    response.close()
    progress = JobProgress(job_id="mine", attempt=1, step=10, metrics={"loss": 0.5})
    for _ in range(3):
        page.take(new_event(progress, source="test", time=NOW, subject="mine"))
        await asyncio.sleep(0.3)

    assert page.changes.queues == set()
    assert (await client.get("/jobs")).status == 200


async def test_the_list_says_how_many_jobs_match(client: TestClient) -> None:  # type: ignore[type-arg]
    body = await (await client.get("/jobs?owner=bob")).text()

    assert 'data-matching="1"' in body
    assert 'data-job="bobs"' in body
    assert 'data-job="mine"' not in body


# --- behind a sign-in: each page is the signed-in person's ---------------------------------

SIGNED_IN = "X-Auth-Request-User"


def billed(job_id: str, owner: str, team: str, experiment: str) -> list[Event[EventData]]:
    """A job's request, and an attempt started on a node that ran a minute."""
    request = JobRequested(
        job_id=job_id, owner=owner, experiment=experiment, entrypoint=("python", "t.py")
    )
    launched = NodeLaunched(
        node=f"node-{job_id}",
        pool="gpu-spot",
        capacity=CapacityClass.SPOT,
        gpus=1,
        cpus=4,
        price_per_hour_usd=3.6,
        launched_at=NOW - timedelta(seconds=120),
    )
    started = JobStarted(
        job_id=job_id, attempt=1, submission_id=f"{job_id}-1", nodes=(f"node-{job_id}",)
    )
    ended = JobSucceeded(job_id=job_id, attempt=1)
    return [
        new_event(launched, source="t", time=NOW - timedelta(seconds=120)),
        new_event(request, source="t", time=NOW - timedelta(seconds=110), subject=job_id),
        new_event(started, source="t", time=NOW - timedelta(seconds=100), subject=job_id),
        new_event(ended, source="t", time=NOW - timedelta(seconds=40), subject=job_id),
    ]


@pytest.fixture
async def signed_in() -> AsyncIterator[tuple[Page, TestClient]]:  # type: ignore[type-arg]
    jobs = [
        ("alices", "alice", "vision", "detector"),
        ("bobs", "bob", "vision", "detector"),
        ("carols", "carol", "nlp", "secret-llm"),
    ]
    records = [
        running(job_id, owner).model_copy(update={"team": team}) for job_id, owner, team, _ in jobs
    ]
    page = Page(
        Board(),
        Platform(records, TEAMS),
        FixedClock(NOW),
        viewer="unused",
        logs=no_logs,
        viewer_header=SIGNED_IN,
    )
    for job_id, owner, team, experiment in jobs:
        for event in billed(job_id, owner, team, experiment):
            page.board.add(event)
    await page.load()
    async with TestClient(TestServer(app(page))) as client:
        yield page, client


def as_person(name: str) -> dict[str, str]:
    return {SIGNED_IN: name}


async def test_nobody_signed_in_gets_a_page_saying_so_and_nothing_else(
    signed_in: tuple[Page, TestClient],  # type: ignore[type-arg]
) -> None:
    _, client = signed_in
    nobody = await client.get("/jobs")
    forged = await client.get("/jobs", headers=as_person("alice bob"))

    assert nobody.status == 401
    body = await nobody.text()
    assert "nobody signed in" in body
    assert "alices" not in body
    assert forged.status == 400


async def test_a_person_sees_their_own_and_their_teams_jobs_and_nothing_of_another_team(
    signed_in: tuple[Page, TestClient],  # type: ignore[type-arg]
) -> None:
    _, client = signed_in
    alice = as_person("alice")

    listed = await (await client.get("/jobs", headers=alice)).text()
    carols = await client.get("/jobs/carols", headers=alice)
    costs = await (await client.get("/experiments", headers=alice)).text()
    chart = await (await client.get("/experiments/experiments.json", headers=alice)).json()
    by_owner = await (await client.get("/experiments/owners.json", headers=alice)).json()

    assert 'data-job="alices"' in listed
    assert 'data-job="bobs"' in listed
    assert "carols" not in listed
    assert carols.status == 404
    assert "no job carols that you may see" in await carols.text()
    assert "secret-llm" not in costs
    assert 'data-experiment="others"' in costs
    assert "secret-llm" not in json.dumps(chart)
    assert "carol" not in json.dumps(by_owner)
    carol = await (await client.get("/jobs", headers=as_person("carol"))).text()
    assert 'data-job="carols"' in carol
    assert "alices" not in carol


async def test_cancel_is_offered_to_the_owner_and_the_teams_admin_only(
    signed_in: tuple[Page, TestClient],  # type: ignore[type-arg]
) -> None:
    page, client = signed_in

    def offered(person: str) -> bool:
        return page.may_cancel(page.board.records["alices"], Viewing(person, everything=False))

    assert [offered(p) for p in ("alice", "jane.doe", "bob")] == [True, True, False]
    by_bob = await client.post(
        "/jobs/alices/cancel", headers={**as_person("bob"), "HX-Request": "true"}
    )
    by_admin = await client.post(
        "/jobs/alices/cancel", headers={**as_person("jane.doe"), "HX-Request": "true"}
    )
    assert (by_bob.status, by_admin.status) == (403, 200)
    assert page.platform.cancelled == [("alices", "jane.doe")]  # type: ignore[attr-defined]


async def test_an_open_page_hears_nothing_of_another_teams_jobs(
    signed_in: tuple[Page, TestClient],  # type: ignore[type-arg]
) -> None:
    page, client = signed_in
    response = await client.get("/events", headers=as_person("carol"))
    await asyncio.sleep(0.05)

    for job_id in ("alices", "bobs", "carols"):
        progress = JobProgress(job_id=job_id, attempt=1, step=10, metrics={"loss": 0.5})
        page.take(new_event(progress, source="test", time=NOW, subject=job_id))
    line = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)

    assert line == b'event: jobs\ndata: "carols"\n\n'
    response.close()
