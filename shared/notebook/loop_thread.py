"""Coroutines run from synchronous code that may sit inside a running event loop.

A Jupyter kernel executes cells inside its own asyncio loop, so a magic or `watch()` cannot
call `asyncio.run`; each coroutine here gets a fresh loop in a daemon thread instead, and the
calling thread stays free to render and to receive the kernel's interrupt.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class LoopThread(Generic[T]):
    """One coroutine on its own event loop in a daemon thread: start, join, or cancel it."""

    def __init__(self, factory: Callable[[], Coroutine[Any, Any, T]], *, name: str) -> None:
        self._factory = factory
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._result: list[T] = []
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def join(self, timeout_s: float | None = None) -> T:
        """The coroutine's result, or its exception re-raised in this thread.

        Interruptible: a KeyboardInterrupt reaches the caller, and the coroutine goes on until
        `cancel` is called.
        """
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"{self._thread.name} still runs after {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self._result[0]

    def cancel(self, *, wait_s: float = 5.0) -> None:
        """Cancel the coroutine and give it `wait_s` to close what it opened."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                return  # the loop closed in between: the coroutine is over already
        self._thread.join(wait_s)

    def _main(self) -> None:
        async def run() -> T:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            self._ready.set()
            return await self._factory()

        try:
            self._result.append(asyncio.run(run()))
        except BaseException as error:  # noqa: BLE001  # handed to the joining thread, not lost
            self._error = error
        finally:
            self._ready.set()


def run_blocking(factory: Callable[[], Coroutine[Any, Any, T]], *, name: str = "spotrain") -> T:
    """Run a coroutine to the end from synchronous code, whether or not a loop is running here.

    On KeyboardInterrupt the coroutine is cancelled, then the interrupt goes on.
    """
    runner = LoopThread(factory, name=name)
    runner.start()
    try:
        return runner.join()
    except KeyboardInterrupt:
        runner.cancel()
        raise
