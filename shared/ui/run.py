"""The page's process: connect, read what the stream holds, follow it, serve.

Wiring only: the board, the views and the routes are the other modules'.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import nats.js.errors
from aiohttp import web
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.client import SpotrainClient, current_user
from shared.clock import SystemClock
from shared.events import decode
from shared.jobs import JobRecord, jobs_bucket
from shared.logs import configure_logging, deferred_logger
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.ports import EventBus, StreamRecord
from shared.messaging.settings import BusSettings
from shared.ui.board import Board
from shared.ui.server import Page, app

log = deferred_logger()

VIEWS_EVERY_S = 3.0
"""How often the scaler's and the submitter's views (pools, queue, teams, node sightings)
are read again: they write them every few seconds."""

FOLLOW_OVERLAP_S = 30.0
"""The follower starts this far before the backlog is read: what the stream stores in
between is read twice, and the board takes each event once."""


class UiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTRAIN_UI_", extra="ignore", frozen=True)

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=7460, ge=0, le=65535)
    viewer: str | None = None
    """Whom the page shows the platform to: the login name of whoever runs it by default
    (the local stack's owner), who reads everything."""
    viewer_header: str | None = None
    """Behind a sign-in proxy: the header it sets to the person signed in (oauth2-proxy's
    `X-Auth-Request-User`, say). Each page is then that person's: their own jobs and their
    team's. Only the proxy may reach the page (the chart's NetworkPolicy), or anyone could
    send the header."""
    ray_address: str | None = Field(default=None, validation_alias="SPOTRAIN_RAY_ADDRESS")
    """Ray's dashboard, for the attempts' output: the local stack's. None in the chart,
    where the page never reaches Ray's job API (`spotrain logs` reads it through the desk)."""
    log_json: bool = False


class RayLogs:
    """An attempt's output from Ray's job API (the stack's own Ray, with its token when it
    has one); None when Ray does not answer."""

    def __init__(self, address: str | None, session: aiohttp.ClientSession) -> None:
        self._address = address.rstrip("/") if address else None
        self._session = session
        self._headers = _ray_token_headers()

    async def __call__(self, submission_id: str) -> str | None:
        if self._address is None:
            return None
        url = f"{self._address}/api/jobs/{submission_id}/logs"
        try:
            async with self._session.get(
                url, headers=self._headers, timeout=aiohttp.ClientTimeout(total=5)
            ) as response:
                if response.status != 200:
                    return None
                return str((await response.json()).get("logs", ""))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None


def _ray_token_headers() -> dict[str, str]:
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if not token and path:
        with contextlib.suppress(OSError):
            token = Path(path).read_text(encoding="utf-8").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


async def feed(page: Page, bus: EventBus, stop: asyncio.Event) -> None:
    """The board from the stream: what it holds now, then what comes, job and node events.
    A page started before the submitter has declared the stream waits for it."""
    while True:
        try:
            await _feed(page, bus, stop)
            return
        except nats.js.errors.NotFoundError:
            log.info("ui.waiting_for_stream")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if stop.is_set():
                return


async def _feed(page: Page, bus: EventBus, stop: asyncio.Event) -> None:
    # One follower per aggregate, each filtered to one subject: what a reader's NATS
    # permissions allow, and the server starts a single-subject consumer by time exactly.
    subjects = [f"{bus.prefix}.{aggregate}.>" for aggregate in ("job", "node", "pool")]
    # Followed from before the backlog is read: nothing falls between the two.
    since = datetime.now(UTC) - timedelta(seconds=FOLLOW_OVERLAP_S)
    for subject in subjects:
        for message in await bus.read(subject):
            with contextlib.suppress(ValueError):
                page.board.add(decode(message.data))
    # The records' writes are heard before the records are read: a write in between is
    # taken either way, and the board keeps the newer of two.
    writes = await bus.listen(f"$KV.{jobs_bucket(bus.prefix)}.>", _written(page))
    try:
        await page.load()
        page.ready.set()
        async with asyncio.TaskGroup() as group:
            for subject in subjects:
                group.create_task(_follow(page, bus.follow([subject], stop, since=since)))
    finally:
        await writes.stop()


def _written(page: Page) -> Callable[[bytes], Awaitable[None]]:
    async def written(data: bytes) -> None:
        try:
            record = JobRecord.model_validate_json(data)
        except ValueError:
            return  # a deletion (no value), or a record of another version: read on load
        page.written(record)

    return written


async def _follow(page: Page, follower: AsyncGenerator[StreamRecord, None]) -> None:
    async with contextlib.aclosing(follower) as records:
        async for record in records:
            try:
                event = decode(record.data)
            except ValueError:
                continue  # its consumers dead-lettered it, and said so
            page.take(event)


async def refresh(page: Page, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), VIEWS_EVERY_S)
        try:
            await page.refresh_views()
        except Exception as error:  # noqa: BLE001  # a view read that failed is read next time
            log.warning("ui.views_unread", error=str(error))


async def serve(settings: UiSettings, bus_settings: BusSettings) -> None:
    bus = await JetStreamBus.connect(bus_settings, name="spotrain-ui")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with aiohttp.ClientSession() as session:
        page = Page(
            Board(),
            SpotrainClient(bus, SystemClock()),
            SystemClock(),
            viewer=settings.viewer or current_user(),
            logs=RayLogs(settings.ray_address, session),
            viewer_header=settings.viewer_header,
        )
        runner = web.AppRunner(app(page), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            async with asyncio.TaskGroup() as group:
                fed = group.create_task(feed(page, bus, stop))
                ready = asyncio.create_task(page.ready.wait())
                await asyncio.wait({fed, ready}, return_when=asyncio.FIRST_COMPLETED)
                ready.cancel()
                if fed.done():
                    fed.result()  # the stream could not be read: say why, serve nothing
                site = web.TCPSite(runner, settings.http_host, settings.http_port)
                await site.start()
                log.info(
                    "ui.serving",
                    url=f"http://{settings.http_host}:{settings.http_port}",
                    jobs=len(page.board.records),
                )
                group.create_task(refresh(page, stop))
                await stop.wait()
        finally:
            await runner.cleanup()
            await bus.close()


def main() -> None:
    settings = UiSettings()
    configure_logging(json=settings.log_json)
    asyncio.run(serve(settings, BusSettings()))
