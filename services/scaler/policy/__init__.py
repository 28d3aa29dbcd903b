"""The scaler's decisions, pure: no I/O, no clock (`now` is an argument), no ids.

- `packing`: pool sizes from pending demand, free room and the budget;
- `deadline`: per job, spot, on-demand or wait, so that it finishes by its deadline at
  the least cost, from its pace and what has been seen of the spot market.
"""

from services.scaler.policy.packing import (
    eligible_pools,
    node_views,
    plan,
    preemption_risk,
    summarize,
)

__all__ = ["eligible_pools", "node_views", "plan", "preemption_risk", "summarize"]
