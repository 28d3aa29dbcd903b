"""A JetStream call through a cluster's leader election: the one place that knows which
answers mean "no leader yet, ask again"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors

T = TypeVar("T")


async def through_failover(timeout_s: float, call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """A JetStream API call (or a few, as one), again while the cluster answers nothing
    or 503: a stream whose leader's server was lost elects another within seconds, and a
    stream just created on other servers of a cluster has no responder on its subjects
    until its interest reaches the server this client speaks to. Up to `timeout_s`; the
    bus's own calls wait `publish_timeout_s`, as a publish does through a server's
    restart."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call(*args)
        except (
            nats.errors.TimeoutError,
            nats.js.errors.ServiceUnavailableError,
            nats.js.errors.NoStreamResponseError,
        ):
            if time.monotonic() > deadline:
                raise
        except nats.js.errors.APIError as error:
            if not cluster_busy(error) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


CLUSTER_UNAVAILABLE = 10008
"""JetStream's error code while its cluster has no leader: 'temporarily unavailable'."""


def cluster_busy(error: nats.js.errors.APIError) -> bool:
    # nats-py raises some of its errors (a key's lost compare-and-set) without the
    # server's codes.
    err_code = getattr(error, "err_code", None)
    return err_code == CLUSTER_UNAVAILABLE or getattr(error, "code", None) == 503
