"""Waiting for asynchronous effects without sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from shared.messaging import EventBus, Subscription


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout_s: float = 10,
    interval_s: float = 0.02,
) -> None:
    """Poll `check` until it is true; fail the test with a clear message otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            msg = f"condition not met within {timeout_s}s"
            raise AssertionError(msg)
        await asyncio.sleep(interval_s)


@asynccontextmanager
async def consuming(bus: EventBus, subscription: Subscription) -> AsyncIterator[asyncio.Event]:
    """Run a consumer for the body of the `with`; stop it and wait for it at the end."""
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(subscription, stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)
