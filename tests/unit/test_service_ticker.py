"""A service's periodic work (`Ticker`): a tick that hangs says where, once, and goes on
being waited for; a failing tick is logged and the next one runs."""

from __future__ import annotations

import asyncio

import structlog

from shared.runtime.service import Ticker, _every


async def _stuck_in(release: asyncio.Event) -> None:
    await release.wait()


async def test_a_tick_that_runs_past_its_limit_is_said_once_with_where_it_waits() -> None:
    release, stop = asyncio.Event(), asyncio.Event()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 1:
            await _stuck_in(release)
        else:
            stop.set()

    ticker = Ticker(name="reconcile", interval_s=0.01, tick=tick, slow_after_s=0.05)
    with structlog.testing.capture_logs() as logs:
        loop = asyncio.create_task(_every(ticker, stop))
        await asyncio.sleep(0.2)
        release.set()
        await asyncio.wait_for(loop, timeout=5)

    slow = [e for e in logs if e["event"] == "ticker.slow"]
    assert len(slow) == 1, logs
    assert slow[0]["ticker"] == "reconcile"
    assert slow[0]["awaiting"].endswith(".tick > _stuck_in > Event.wait"), slow[0]
    assert ticks == 2, "the stuck tick was waited for, then the next one ran"


async def test_a_stuck_tick_is_cancelled_with_its_loop() -> None:
    started, never = asyncio.Event(), asyncio.Event()
    cancelled = False

    async def tick() -> None:
        nonlocal cancelled
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled = True
            raise

    ticker = Ticker(name="reconcile", interval_s=1, tick=tick, slow_after_s=10)
    loop = asyncio.create_task(_every(ticker, asyncio.Event()))
    await started.wait()
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    await asyncio.sleep(0)
    assert cancelled


async def test_a_failing_tick_is_logged_and_the_next_one_runs() -> None:
    stop = asyncio.Event()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 1:
            raise RuntimeError("the cluster did not answer")
        stop.set()

    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(_every(Ticker("reconcile", 0.01, tick), stop), timeout=5)

    assert [e["event"] for e in logs] == ["ticker.failed"]
    assert ticks == 2


def test_the_default_limit_is_many_intervals_and_never_under_a_minute() -> None:
    async def tick() -> None: ...

    assert Ticker("reconcile", 2.0, tick).slow_after() == 60.0
    assert Ticker("costs", 10.0, tick).slow_after() == 300.0
