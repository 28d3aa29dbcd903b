"""Cost rows: the attribution summed by job, experiment, owner or pool. Pure.

In the job, experiment and owner views, idle capacity is a row of its own per pool, so the
rows add up to the bill; filtered to one experiment, idle rows are left out (idle capacity
belongs to no experiment). In the pool view, a pool's row is its whole bill, idle included.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from typing import Any

from shared.policy.cost.attribution import ZERO, Charge
from shared.policy.cost.ledger import Ledger


class GroupBy(StrEnum):
    JOB = "job"
    EXPERIMENT = "experiment"
    OWNER = "owner"
    POOL = "pool"


@dataclass(frozen=True)
class CostRow:
    key: str | None
    """The job, experiment, owner or pool; None for jobs without an experiment, and for
    idle capacity."""
    cost_usd: Fraction = ZERO
    gpu_seconds: Fraction = ZERO
    waste_usd: Fraction = ZERO
    on_demand_usd: Fraction = ZERO
    idle_usd: Fraction = ZERO
    idle_pool: str | None = None
    """Set on a row of idle capacity (job, experiment and owner views)."""

    @property
    def gpu_hours(self) -> Fraction:
        return self.gpu_seconds / 3600

    @property
    def saving_vs_on_demand_usd(self) -> Fraction:
        return self.on_demand_usd - self.cost_usd

    def plus(self, charge: Charge) -> CostRow:
        return CostRow(
            key=self.key,
            cost_usd=self.cost_usd + charge.cost_usd,
            gpu_seconds=self.gpu_seconds + charge.gpu_seconds,
            waste_usd=self.waste_usd + charge.waste_usd,
            on_demand_usd=self.on_demand_usd + charge.on_demand_usd,
            idle_usd=self.idle_usd + (charge.cost_usd if charge.idle else ZERO),
            idle_pool=self.idle_pool,
        )

    def as_json(self, by: GroupBy) -> dict[str, Any]:
        """One object for tools: the key under the view's name, then the figures in USD."""
        row: dict[str, Any] = {by.value: self.key}
        if by is not GroupBy.POOL:
            row["idle"] = self.idle_pool is not None
            if self.idle_pool is not None:
                row["pool"] = self.idle_pool
        row |= {
            "cost_usd": _usd(self.cost_usd),
            "gpu_hours": round(float(self.gpu_hours), 6),
            "waste_usd": _usd(self.waste_usd),
            "saving_vs_on_demand_usd": _usd(self.saving_vs_on_demand_usd),
        }
        if by is GroupBy.POOL:
            row["idle_usd"] = _usd(self.idle_usd)
        return row


def cost_rows(ledger: Ledger, by: GroupBy, experiment: str | None = None) -> list[CostRow]:
    """The rows of one view, the most expensive first, idle capacity last."""
    jobs = ledger.inputs.jobs
    rows: dict[tuple[str | None, str | None], CostRow] = {}
    for charge in ledger.attribution.charges:
        info = jobs.get(charge.job_id) if charge.job_id is not None else None
        if experiment is not None and (info is None or info.experiment != experiment):
            continue
        if by is GroupBy.POOL:
            key: tuple[str | None, str | None] = (charge.pool, None)
        elif info is None:
            key = (None, charge.pool)
        elif by is GroupBy.JOB:
            key = (info.job_id, None)
        elif by is GroupBy.EXPERIMENT:
            key = (info.experiment, None)
        else:
            key = (info.owner, None)
        rows[key] = rows.get(key, CostRow(key=key[0], idle_pool=key[1])).plus(charge)
    return sorted(
        rows.values(),
        key=lambda r: (r.idle_pool is not None, r.idle_pool or "", -r.cost_usd, r.key or ""),
    )


def job_costs(ledger: Ledger) -> dict[str, CostRow]:
    """Each job's cost so far (what `spotrain ls` and `show` print)."""
    by_job: dict[str, CostRow] = defaultdict(lambda: CostRow(key=None))
    for charge in ledger.attribution.charges:
        if charge.job_id is not None:
            by_job[charge.job_id] = by_job[charge.job_id].plus(charge)
    return {job: replace(row, key=job) for job, row in by_job.items()}


def total(rows: Iterable[CostRow]) -> CostRow:
    """The sum of rows (a table's footer)."""
    result = CostRow(key=None)
    for row in rows:
        result = CostRow(
            key=None,
            cost_usd=result.cost_usd + row.cost_usd,
            gpu_seconds=result.gpu_seconds + row.gpu_seconds,
            waste_usd=result.waste_usd + row.waste_usd,
            on_demand_usd=result.on_demand_usd + row.on_demand_usd,
            idle_usd=result.idle_usd + row.idle_usd,
        )
    return result


def _usd(amount: Fraction) -> float:
    """Dollars to the micro-dollar: enough for a second of the cheapest node."""
    return round(float(amount), 6)


def format_usd(amount: Fraction | float) -> str:
    """Dollars for people: cents from a dollar up, hundredths of a cent below."""
    value = float(amount)
    if value == 0:
        return "$0"
    if abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}"
