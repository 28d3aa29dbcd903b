"""The pools' status as the scaler's `pools` bucket holds it: written by the scaler alone,
read by `spotrain pools` and dashboards."""

from __future__ import annotations

from pydantic import AwareDatetime

from shared.events.types import CapacityClass, Frozen

STATUS_KEY = "status"


def pools_bucket(prefix: str) -> str:
    return f"{prefix}-pools"


class PoolStatus(Frozen):
    pool: str
    capacity: CapacityClass
    price_per_hour_usd: float
    nodes: int
    ready: int
    gpus_total: int
    gpus_free: int
    pending_jobs: int
    pending_gpus: int
    target: int
    min_nodes: int
    max_nodes: int


class PoolsStatus(Frozen):
    updated_at: AwareDatetime
    budget_per_hour_usd: float
    cost_per_hour_usd: float
    pools: tuple[PoolStatus, ...]
    blocked_jobs: int
