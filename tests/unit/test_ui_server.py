"""The web page's server against an in-memory platform: bad input gets a clear page and no
stack trace, cancel is offered and taken only on the viewer's own jobs, and an open page
hears of its job's changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shared.events import new_event
from shared.events.data import JobProgress
from shared.jobs import AttemptState, JobRecord, JobState
from shared.pools import NodeSightings, PoolsStatus
from shared.teams import TeamsStatus
from shared.ui.board import Board
from shared.ui.server import Page, app
from tests.fakes.clock import FixedClock
from tests.unit.test_ui_views import attempt, record

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


class Platform:
    def __init__(self, records: list[JobRecord]) -> None:
        self.records = {r.job_id: r for r in records}
        self.cancelled: list[tuple[str, str]] = []

    async def jobs(self) -> list[JobRecord]:
        return list(self.records.values())

    async def job(self, job_id: str) -> JobRecord | None:
        return self.records.get(job_id)

    async def pools(self) -> PoolsStatus | None:
        return None

    async def teams(self) -> TeamsStatus | None:
        return None

    async def sightings(self) -> NodeSightings | None:
        return None

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
    def broken() -> None:
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
        await page.take(new_event(progress, source="test", time=NOW, subject=job_id))
    line = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)

    assert line == b'event: job\ndata: "mine"\n\n'
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
        await page.take(new_event(progress, source="test", time=NOW, subject="mine"))
        await asyncio.sleep(0.3)

    assert page.changes.queues == set()
    assert (await client.get("/jobs")).status == 200


async def test_the_list_says_how_many_jobs_match(client: TestClient) -> None:  # type: ignore[type-arg]
    body = await (await client.get("/jobs?owner=bob")).text()

    assert 'data-matching="1"' in body
    assert 'data-job="bobs"' in body
    assert 'data-job="mine"' not in body
