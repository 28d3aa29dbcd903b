"""Live progress of a job: `watch(job)` in a notebook or a terminal, and the typed API under it.

- `follow_progress(client, job_id)`: an async iterator of `JobView`s, one per event of the
  job, ending with its last; the building block for any display (notebook, bot, dashboard).
- `watch(job)`: blocks, shows one line updated in place (a notebook display, or `\\r` on a
  terminal), and returns the job's final `JobRecord`. `await watch_async(job)` is the same
  without blocking the kernel's event loop.

Cost: `watch` asks the platform's ledger (`LedgerCosts`), or the `CostSource` passed as
`cost=`, what the job has cost so far, and the line shows it once it is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sys
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, TextIO

from shared.client import PlatformError, SpotrainClient
from shared.clock import Clock, SystemClock
from shared.events import Event, EventData
from shared.jobs import JobRecord
from shared.messaging import BusSettings
from shared.notebook.loop_thread import LoopThread
from shared.notebook.progress import JobView, advance, render_html, render_text
from shared.policy.cost import job_costs

DEFAULT_REFRESH_S = 1.0
"""How often the line is redrawn between events, so that `queued 12s` keeps counting."""
COST_REFRESH_S = 10.0
RECORD_SETTLE_S = 5.0
"""The submitter publishes a job's last event, then writes its record: wait this long for it."""


class HasJobId(Protocol):
    """Anything that names a job: a `SubmittedJob`, a `JobRecord`."""

    @property
    def job_id(self) -> str: ...


JobRef = str | HasJobId


def job_id_of(job: JobRef) -> str:
    return job if isinstance(job, str) else job.job_id


class CostSource(Protocol):
    """What a job has cost so far, in USD; None while unknown.

    The hook for pricing: asked when the job changes phase or attempt, when it ends, and at
    most every `COST_REFRESH_S` in between, so it may read the bus or a bucket. It must not
    raise for a job it cannot price; it returns None.
    """

    async def cost_usd(self, job_id: str) -> float | None: ...


class JobEvents(Protocol):
    """What `follow_progress` needs of a client; `SpotrainClient` is one."""

    def follow(self, job_id: str) -> AsyncGenerator[Event[EventData], None]:
        """The job's events, stored ones first, then live; ends after its last event."""
        ...


async def follow_progress(
    client: JobEvents, job_id: str, *, cost: CostSource | None = None
) -> AsyncGenerator[JobView, None]:
    """The job's progress as it happens: a `JobView` after each of its events, from the first.

    Ends after the job's last event (succeeded, failed, cancelled, rejected). Use it inside
    `contextlib.aclosing` when you may stop before the end.
    """
    view = JobView(job_id=job_id)
    priced_at = float("-inf")
    async with contextlib.aclosing(client.follow(job_id)) as events:
        async for event in events:
            previous, view = view, advance(view, event)
            if cost is not None and (
                view.phase is not previous.phase
                or view.attempt != previous.attempt
                or time.monotonic() - priced_at >= COST_REFRESH_S
            ):
                view = replace(view, cost_usd=await cost.cost_usd(job_id))
                priced_at = time.monotonic()
            yield view


async def final_record(
    client: SpotrainClient, job_id: str, *, settle_s: float = RECORD_SETTLE_S
) -> JobRecord:
    """The job's record once it shows the end; after `settle_s`, whatever it shows then."""
    deadline = time.monotonic() + settle_s
    while True:
        record = await client.job(job_id)
        if record is not None and (not record.is_active or time.monotonic() >= deadline):
            return record
        if time.monotonic() >= deadline:
            raise PlatformError(f"job {job_id} ended, but its record is missing")
        await asyncio.sleep(0.1)


def watch(
    job: JobRef,
    *,
    settings: BusSettings | None = None,
    cost: CostSource | None = None,
    refresh_s: float = DEFAULT_REFRESH_S,
) -> JobRecord:
    """Show the job's live progress until it ends; return its final record.

    Blocks; interrupting it (the kernel's stop button, Ctrl-C) stops watching, not the job.
    Raises `PlatformError` when the stack cannot be reached or no such job exists.
    """
    job_id = job_id_of(job)
    updates: queue.SimpleQueue[_Update] = queue.SimpleQueue()
    runner = LoopThread(
        lambda: _produce(job_id, settings, cost, updates.put), name=f"spotrain-watch-{job_id}"
    )
    tracker = _Tracker(default_screen(), SystemClock())
    runner.start()
    try:
        while True:
            try:
                batch = [updates.get(timeout=refresh_s)]
            except queue.Empty:
                tracker.tick()
                continue
            while not updates.empty():
                batch.append(updates.get_nowait())
            if (record := tracker.take(batch)) is not None:
                return record
    except KeyboardInterrupt:
        runner.cancel()
        tracker.stop("stopped watching; the job goes on")
        raise


async def watch_async(
    job: JobRef,
    *,
    settings: BusSettings | None = None,
    cost: CostSource | None = None,
    refresh_s: float = DEFAULT_REFRESH_S,
) -> JobRecord:
    """`watch` for code that runs in an event loop: `record = await watch_async(job)`."""
    job_id = job_id_of(job)
    updates: asyncio.Queue[_Update] = asyncio.Queue()
    tracker = _Tracker(default_screen(), SystemClock())
    producer = asyncio.create_task(_produce(job_id, settings, cost, updates.put_nowait))
    try:
        while True:
            try:
                batch = [await asyncio.wait_for(updates.get(), refresh_s)]
            except TimeoutError:
                tracker.tick()
                continue
            while not updates.empty():
                batch.append(updates.get_nowait())
            if (record := tracker.take(batch)) is not None:
                return record
    except asyncio.CancelledError:
        tracker.stop("stopped watching; the job goes on")
        raise
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)


# --- what the producer sends and how the line is drawn ------------------------------------


@dataclass(frozen=True)
class _Ended:
    record: JobRecord


@dataclass(frozen=True)
class _Failed:
    error: Exception


_Update = JobView | _Ended | _Failed


async def _produce(
    job_id: str,
    settings: BusSettings | None,
    cost: CostSource | None,
    put: Callable[[_Update], None],
) -> None:
    """Follow the job on its own connection and hand each view to `put`; never raises."""
    try:
        async with await SpotrainClient.connect(settings) as client:
            if await client.job(job_id) is None and not await client.history(job_id):
                raise PlatformError(f"no job {job_id}")
            cost = cost or LedgerCosts(client)
            async with contextlib.aclosing(follow_progress(client, job_id, cost=cost)) as views:
                async for view in views:
                    put(view)
            put(_Ended(await final_record(client, job_id)))
    except Exception as error:  # noqa: BLE001  # re-raised by the watcher, in its own thread
        put(_Failed(error))


class LedgerCosts:
    """The job's cost so far from the platform's own ledger (`shared.policy.cost`)."""

    def __init__(self, client: SpotrainClient) -> None:
        self._client = client

    async def cost_usd(self, job_id: str) -> float | None:
        row = job_costs(await self._client.costs()).get(job_id)
        return float(row.cost_usd) if row is not None else None


class ProgressScreen(Protocol):
    """Where the line goes: redrawn in place by `show`, left as it is by `close`."""

    def show(self, view: JobView, now: datetime) -> None: ...

    def close(self, view: JobView | None, now: datetime, note: str | None = None) -> None: ...


class NotebookScreen:
    """One display in the notebook's output, updated in place (text and HTML)."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, view: JobView, now: datetime) -> None:
        from IPython.display import display  # noqa: PLC0415  # only inside a kernel

        bundle = {"text/plain": render_text(view, now), "text/html": render_html(view, now)}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)  # type: ignore[no-untyped-call]  # IPython's display is untyped
        else:
            self._handle.update(bundle, raw=True)

    def close(self, view: JobView | None, now: datetime, note: str | None = None) -> None:
        if view is not None:
            self.show(view, now)
        if note:
            print(note, file=sys.stderr)


class TextScreen:
    """A terminal line redrawn with `\\r`; without a terminal, a line per change of phase."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._live = stream.isatty()
        self._width = 0
        self._shown: tuple[object, ...] | None = None

    def show(self, view: JobView, now: datetime) -> None:
        line = render_text(view, now)
        if self._live:
            self._stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            key = (view.phase, view.attempt, view.detail)
            if key == self._shown:
                return
            self._shown = key
            self._stream.write(line + "\n")
        self._stream.flush()

    def close(self, view: JobView | None, now: datetime, note: str | None = None) -> None:
        if view is not None:
            self.show(view, now)
        if self._live:
            self._stream.write("\n")
        if note:
            self._stream.write(note + "\n")
        self._stream.flush()


def default_screen() -> ProgressScreen:
    """A notebook display inside a Jupyter kernel; text on stdout anywhere else."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        return NotebookScreen()
    return TextScreen(sys.stdout)


class _Tracker:
    """The watcher's state between updates: the latest view, drawn on its screen."""

    def __init__(self, screen: ProgressScreen, clock: Clock) -> None:
        self._screen = screen
        self._clock = clock
        self.view: JobView | None = None

    def take(self, batch: Sequence[_Update]) -> JobRecord | None:
        """Apply a batch of updates and draw once; the final record when the job ended."""
        for update in batch:
            match update:
                case JobView():
                    self.view = update
                case _Ended(record=record):
                    self._screen.close(self.view, self._clock.now())
                    return record
                case _Failed(error=error):
                    self._screen.close(self.view, self._clock.now())
                    raise error
        self.tick()
        return None

    def tick(self) -> None:
        if self.view is not None:
            self._screen.show(self.view, self._clock.now())

    def stop(self, note: str) -> None:
        self._screen.close(self.view, self._clock.now(), note)
