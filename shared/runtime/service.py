"""Run one service: its consumers and tickers in a TaskGroup, a staged stop on SIGTERM.

Stop order: stop fetching, let in-flight handlers finish within the grace period (cancel
what is left; their messages are redelivered), then drain the NATS connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import structlog
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.leases import LeaseTimes, leases_bucket
from shared.logs import configure_logging
from shared.messaging import BusSettings, EventBus, Subscription
from shared.messaging.delivery import declare_dead_letters
from shared.messaging.jetstream import BusSettingsError, JetStreamBus
from shared.messaging.metrics import BUS_CONNECTED, SERVICE_LEADING
from shared.runtime.http import start_http_endpoint
from shared.runtime.leadership import (
    LeaderLease,
    Leadership,
    LeasesOwnedElsewhereError,
    claim_leases,
)
from shared.setting_errors import setting_error_line

log = structlog.get_logger()


@dataclass(frozen=True)
class Ticker:
    """Periodic work, e.g. a reconciliation loop; a failing tick is logged, not fatal."""

    name: str
    interval_s: float
    tick: Callable[[], Awaitable[None]]
    leader_only: bool = False
    """Work that must happen once: done by the replica that holds the service's lease."""
    slow_after_s: float | None = None
    """A tick still running after this long is said in the log once (`ticker.slow`, with
    what it is waiting on) and waited for: a pass that hangs shows where, rather than a
    service that silently stops acting. None: `SLOW_TICKS` intervals, `SLOW_AFTER_MIN_S` at
    least."""

    def slow_after(self) -> float:
        if self.slow_after_s is not None:
            return self.slow_after_s
        return max(SLOW_TICKS * self.interval_s, SLOW_AFTER_MIN_S)


SLOW_TICKS = 30
SLOW_AFTER_MIN_S = 60.0


@dataclass(frozen=True)
class Watch:
    """A long-running loop over an outside source (a Pub/Sub subscription, a Kubernetes
    watch, a folder); it returns once `stop` is set. One that fails is started again after
    a pause, since outside sources drop connections as a matter of course."""

    name: str
    run: Callable[[asyncio.Event], Awaitable[None]]
    restart_after_s: float = 2.0
    leader_only: bool = False
    """Runs only while this replica holds the service's lease; stopped when it loses it."""


@dataclass(frozen=True)
class ServiceDefinition:
    """What a service's bootstrap hands to the runtime."""

    name: str
    subscriptions: Sequence[Subscription] = ()
    tickers: Sequence[Ticker] = field(default_factory=tuple)
    watches: Sequence[Watch] = field(default_factory=tuple)
    leadership: Leadership | None = None
    """Bound to the service's lease by the runtime: what its actions ask just before they
    act (`Leadership.leading`)."""


class RuntimeSettings(BaseSettings):
    """Settings every service has; each service reads them under its own env prefix."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    http_host: str = "127.0.0.1"
    http_port: int = Field(0, ge=0, le=65535)
    """The `/metrics` and `/healthz` port; 0 picks a free one."""
    grace_period_s: float = Field(20, gt=0)
    log_level: str = "info"
    log_json: bool = True
    replica: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}", min_length=1
    )
    """This replica's name in its service's lease (the pod's name on GKE)."""
    release: str | None = Field(None, min_length=1)
    """The installation this replica belongs to (the chart's namespace/release): it claims
    the leases bucket, and a replica of another installation is refused at start."""
    lease_duration_s: float = Field(4.0, gt=0)
    """How long the lease stays unchanged before another replica takes it over."""
    lease_renew_deadline_s: float = Field(3.0, gt=0)
    lease_renew_every_s: float = Field(1.0, gt=0)

    def lease_times(self) -> LeaseTimes:
        return LeaseTimes(
            duration_s=self.lease_duration_s,
            renew_deadline_s=self.lease_renew_deadline_s,
            renew_every_s=self.lease_renew_every_s,
        )


Bootstrap = Callable[[EventBus, AsyncExitStack], Awaitable[ServiceDefinition]]


async def serve(
    name: str,
    bootstrap: Bootstrap,
    *,
    bus_settings: BusSettings,
    runtime: RuntimeSettings,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or `stop`), then shut down in stages."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log_ = log.bind(service=name)
    declare_dead_letters(name)
    async with AsyncExitStack() as stack:
        bus = await JetStreamBus.connect(bus_settings, name=name)
        stack.push_async_callback(bus.close)
        await bus.ensure_stream()
        definition = await bootstrap(bus, stack)
        # Before the endpoint says it is up: a bucket another installation claimed stops it.
        lease = await _lease_of(name, bus, runtime, definition)
        consumers_stop = asyncio.Event()

        def is_healthy() -> bool:
            BUS_CONNECTED.labels(name).set(1 if bus.is_connected else 0)
            return bus.is_connected and not consumers_stop.is_set()

        server = await start_http_endpoint(runtime.http_host, runtime.http_port, is_healthy)
        stack.push_async_callback(server.wait_closed)
        stack.callback(server.close)
        port = server.sockets[0].getsockname()[1]
        log_.info("service.started", http_port=port, nats_url=bus_settings.nats_url)

        lease_stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            keeping = group.create_task(lease.keep(lease_stop)) if lease else None
            tasks = [
                group.create_task(bus.consume(s, consumers_stop)) for s in definition.subscriptions
            ]
            tasks += [
                group.create_task(_every(t, consumers_stop, lease)) for t in definition.tickers
            ]
            tasks += [
                group.create_task(_keep(w, consumers_stop, lease)) for w in definition.watches
            ]
            await stop.wait()
            log_.info("service.stopping", grace_period_s=runtime.grace_period_s)
            consumers_stop.set()
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=runtime.grace_period_s)
                for task in late:
                    task.cancel()
                if late:
                    log_.warning("service.grace_period_expired", cancelled=len(late))
            # Handed over once this replica's last leader-only work is done, not before.
            lease_stop.set()
            if keeping is not None:
                await keeping
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(signum)
    log_.info("service.stopped")


async def _lease_of(
    name: str, bus: EventBus, runtime: RuntimeSettings, definition: ServiceDefinition
) -> LeaderLease | None:
    """The service's lease, where it has work that must happen once."""
    once = [t.leader_only for t in definition.tickers] + [w.leader_only for w in definition.watches]
    if not any(once):
        return None
    kv = await bus.declare_bucket(leases_bucket(bus.prefix))
    if runtime.release is not None:
        await claim_leases(kv, leases_bucket(bus.prefix), runtime.release)
    lease = LeaderLease(kv, name, runtime.replica, times=runtime.lease_times())
    if definition.leadership is not None:
        definition.leadership.bind(lease)
    SERVICE_LEADING.labels(name, runtime.replica).set_function(lambda: float(lease.leading))
    return lease


async def _every(ticker: Ticker, stop: asyncio.Event, lease: LeaderLease | None = None) -> None:
    while not stop.is_set():
        follower = ticker.leader_only and lease is not None and not lease.leading
        if not follower:
            try:
                await _tick(ticker)
            except Exception:  # the next tick is the retry
                log.exception("ticker.failed", ticker=ticker.name)
        # A follower looks again as often as the lease is renewed: it acts within a
        # renewal of taking it over.
        wait_s = lease.times.renew_every_s if follower and lease else ticker.interval_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=wait_s)


async def _tick(ticker: Ticker) -> None:
    """One tick, said in the log if it runs past `slow_after()`; cancelled with its caller."""
    running = asyncio.ensure_future(ticker.tick())
    try:
        done, _ = await asyncio.wait({running}, timeout=ticker.slow_after())
        if not done:
            log.warning(
                "ticker.slow",
                ticker=ticker.name,
                running_s=ticker.slow_after(),
                awaiting=awaiting(running),
            )
        await running
    except asyncio.CancelledError:
        running.cancel()
        raise


def awaiting(task: asyncio.Future[None]) -> str:
    """The chain of coroutines a task is suspended in, outermost first (`reconcile >
    all > latest_entries`): where a tick that does not end waits."""
    names = []
    step: object = task.get_coro() if isinstance(task, asyncio.Task) else None
    while (code := getattr(step, "cr_code", None)) is not None:
        names.append(code.co_qualname)
        step = getattr(step, "cr_await", None)
    return " > ".join(names)


async def _keep(watch: Watch, stop: asyncio.Event, lease: LeaderLease | None = None) -> None:
    while not stop.is_set():
        if watch.leader_only and lease is not None and not lease.leading:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=lease.times.renew_every_s)
            continue
        try:
            if watch.leader_only and lease is not None:
                await _while_leading(watch, stop, lease)
            else:
                await watch.run(stop)
        except Exception:  # the source dropped us; start over after a pause
            log.exception("watch.failed", watch=watch.name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=watch.restart_after_s)


async def _while_leading(watch: Watch, stop: asyncio.Event, lease: LeaderLease) -> None:
    """Run the watch until `stop`, or until this replica no longer leads."""
    own_stop = asyncio.Event()
    running: asyncio.Future[None] = asyncio.ensure_future(watch.run(own_stop))
    try:
        while not running.done():
            if stop.is_set() or not lease.leading:
                own_stop.set()
                break
            await asyncio.wait({running}, timeout=lease.times.renew_every_s / 2)
        await running
    finally:
        if not running.done():
            running.cancel()


def run(
    name: str,
    bootstrap: Bootstrap,
    settings: Callable[[], RuntimeSettings],
) -> None:
    """The body of a service's `__main__`: settings, logging, the loop. A setting that is
    wrong is one line on stderr, naming the variable, and exit status 2."""
    try:
        runtime, bus_settings = settings(), BusSettings()
    except ValidationError as error:
        print(f"{name}: error: {setting_error_line(error)}", file=sys.stderr)  # before logging
        raise SystemExit(2) from None
    configure_logging(json=runtime.log_json, level=runtime.log_level)
    try:
        asyncio.run(serve(name, bootstrap, bus_settings=bus_settings, runtime=runtime))
    except (BusSettingsError, LeasesOwnedElsewhereError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
