"""A spot market on this machine: `spotrain up --spot-market POOL=FILE[,SPEEDUP]` makes the
local provider follow a real trace, as a cloud zone's spot capacity comes and goes. While
the trace's count is below the nodes held, growth fails (a stock-out); when it drops below
the nodes held, the newest of them get the pool's notice and are killed at its deadline
(a preemption wave). One trace hour passes in 3600/SPEEDUP seconds, from the `up` that set
the market; a later `up` keeps it, `down` ends it.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, Field

from shared.policy.deadline import SpotAdvice
from shared.spot_traces import SpotMarketOption, SpotTrace, read_spot_trace

MARKET_FILE = "spot-markets.json"
DEFAULT_NOTICE_S = 10.0
"""Wall seconds between a preemption notice and the kill: GCE gives 30 s; the local
market's trace runs faster, but a checkpoint takes the time it takes."""


class MarketPool(BaseModel):
    pool: str
    file: Path
    speedup: float = Field(gt=0)


class MarketConfig(BaseModel):
    """What `up` wrote for the scaler's local provider (`<run dir>/spot-markets.json`)."""

    started_at: AwareDatetime
    notice_s: float = Field(DEFAULT_NOTICE_S, ge=0)
    pools: tuple[MarketPool, ...]


@dataclass(frozen=True)
class LocalMarket:
    pool: str
    trace: SpotTrace
    speedup: float
    started_at: datetime
    notice_s: float

    def available(self, now: datetime) -> int:
        """How many nodes of the pool the market lets be held now."""
        elapsed_s = (now - self.started_at).total_seconds() * self.speedup
        return self.trace.count_at(elapsed_s)

    def advice(self, now: datetime, held: int) -> SpotAdvice:
        """The local equivalent of Compute Engine's capacity advice, read off the trace
        (where the cloud's is a forecast, this one is exact): obtainable when the market
        lets one more node be held now; an uptime of 60 min when the nodes it lets be held
        now stay for the next hour of this stack's time, else 10 min (the cloud's two)."""
        now_count = self.available(now)
        kept = max(1, min(now_count, held + 1))
        elapsed_s = (now - self.started_at).total_seconds() * self.speedup
        hour_s = 3600 * self.speedup
        ticks = max(1, math.ceil(hour_s / self.trace.gap_s))
        stays = all(
            self.trace.count_at(elapsed_s + k * self.trace.gap_s) >= kept for k in range(ticks + 1)
        )
        return SpotAdvice(
            obtainability=1.0 if now_count > held else 0.0,
            uptime_h=1.0 if stays else 10 / 60,
        )


def load_markets(config: MarketConfig) -> dict[str, LocalMarket]:
    return {
        p.pool: LocalMarket(
            pool=p.pool,
            trace=read_spot_trace(p.file),
            speedup=p.speedup,
            started_at=config.started_at,
            notice_s=config.notice_s,
        )
        for p in config.pools
    }


def room_to_grow(available: int, held: int) -> int:
    """How many more nodes the market lets the pool start now. Pure."""
    return max(0, available - held)


def to_preempt(available: int, held: Sequence[str], noticed: Sequence[str]) -> list[str]:
    """The nodes to give a notice now: the newest of those held past what the market
    allows, not counting those already given one (names end in their launch order). Pure."""
    excess = len(held) - available - len(noticed)
    if excess <= 0:
        return []
    candidates = sorted((n for n in held if n not in noticed), key=_launch_order, reverse=True)
    return candidates[:excess]


def _launch_order(name: str) -> tuple[int, str]:
    head, _, number = name.rpartition("-")
    return (int(number), head) if number.isdigit() else (-1, name)


def check_market_pools(options: Sequence[SpotMarketOption]) -> None:
    """Each market must be of a spot pool the scaler's pools file defines, once: a
    ValueError names the first that is not."""
    capacities = _pool_capacities()
    seen: set[str] = set()
    for option in options:
        capacity = capacities.get(option.pool)
        if capacity is None:
            known = ", ".join(sorted(capacities)) or "none"
            msg = f"--spot-market {option.pool}: no such pool (pools: {known})"
            raise ValueError(msg)
        if capacity != "spot":
            msg = f"--spot-market {option.pool}: it is an {capacity} pool, not a spot one"
            raise ValueError(msg)
        if option.pool in seen:
            msg = f"--spot-market {option.pool}: given twice"
            raise ValueError(msg)
        seen.add(option.pool)


def _pool_capacities() -> dict[str, str]:
    """The pools the stack's scaler will run, as its settings find them: the file named by
    SPOTRAIN_SCALER_POOLS_FILE, else the scaler's packaged pools.local.toml (read as data:
    the CLI imports no service)."""
    named = os.environ.get("SPOTRAIN_SCALER_POOLS_FILE")
    if named:
        text = Path(named).read_text()
    else:
        text = resources.files("services.scaler").joinpath("pools.local.toml").read_text()
    return {
        str(pool.get("name")): str(pool.get("capacity"))
        for pool in tomllib.loads(text).get("pool", [])
    }


def market_config(options: Sequence[SpotMarketOption], now: datetime) -> MarketConfig:
    return MarketConfig(
        started_at=now,
        pools=tuple(MarketPool(pool=o.pool, file=o.file, speedup=o.speedup) for o in options),
    )


@dataclass(frozen=True)
class StockOut:
    """A stretch of a market with no node to be had, between two with some."""

    dry_from: datetime
    wet_from: datetime


def next_stock_out(market: LocalMarket, after: datetime, *, within_s: float) -> StockOut | None:
    """The first stock-out that begins after `after`, while the pool had a node to hold
    just before, and ends within `within_s` of `after`; None if the trace has none. Pure."""
    tick_s = market.trace.gap_s / market.speedup
    elapsed_s = (after - market.started_at).total_seconds()
    first = max(0, math.ceil(elapsed_s / tick_s))
    ticks = math.ceil(within_s / tick_s)
    dry_from = None
    for tick in range(first, first + ticks + 1):
        at = market.started_at + timedelta(seconds=tick * tick_s)
        held = market.trace.count_at(tick * market.trace.gap_s)
        if dry_from is None and held == 0 and tick > first:
            before = market.trace.count_at((tick - 1) * market.trace.gap_s)
            dry_from = at if before > 0 else None
        elif dry_from is not None and held > 0:
            return StockOut(dry_from=dry_from, wet_from=at)
    return None


def market_retry_s(retry_s: float, markets: Mapping[str, LocalMarket]) -> float:
    """The scaler's wait after a stock-out, in a market's time: a market sped up x20 runs a
    stock-out's hour in 3 minutes, and a scaler that waited its usual 5 minutes would miss
    the capacity coming back. Scaled by the fastest market; never below a second. Pure."""
    if not markets:
        return retry_s
    fastest = max(market.speedup for market in markets.values())
    return max(1.0, retry_s / max(fastest, 1.0))
