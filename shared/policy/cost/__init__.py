"""Cost accounting: every node-second on the bill attributed to the attempts that held the
node, or to idle capacity; priced from the pools' configuration, a dated list-price catalog
and per-pool overrides. Pure: the client reads the events and passes the time.
"""

from shared.policy.cost.attribution import Attribution, Bill, Charge, Hold, NodeLife, attribute
from shared.policy.cost.ledger import (
    COST_EVENTS,
    CostFold,
    CostInputs,
    JobInfo,
    Ledger,
    attributed,
    fold,
    ledger,
    month_start,
    spend_by_owner,
)
from shared.policy.cost.pricing import (
    PoolPrice,
    PriceCatalog,
    PricingError,
    load_catalog,
    load_overrides,
    on_demand_counterpart,
)
from shared.policy.cost.report import CostRow, GroupBy, cost_rows, format_usd, job_costs, total

__all__ = [
    "COST_EVENTS",
    "Attribution",
    "Bill",
    "Charge",
    "CostFold",
    "CostInputs",
    "CostRow",
    "GroupBy",
    "Hold",
    "JobInfo",
    "Ledger",
    "NodeLife",
    "PoolPrice",
    "PriceCatalog",
    "PricingError",
    "attribute",
    "attributed",
    "cost_rows",
    "fold",
    "format_usd",
    "job_costs",
    "ledger",
    "load_catalog",
    "load_overrides",
    "month_start",
    "on_demand_counterpart",
    "spend_by_owner",
    "total",
]
