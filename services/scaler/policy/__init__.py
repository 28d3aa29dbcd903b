"""The scaler's decisions, pure: no I/O, no clock (`now` is an argument), no ids.

- `packing`: pool sizes from pending demand, free room and the budget, and which queued
  attempt takes which room on which node (`placement_order`, the platform's order); a deadline job's
  choice between spot, on-demand and waiting is `shared.policy.deadline`'s, the one policy the
  scaler (queued jobs), the checkpointer (running jobs) and the simulator share.
"""

from services.scaler.policy.packing import (
    eligible_pools,
    node_views,
    placement_order,
    plan,
    preemption_risk,
    summarize,
)

__all__ = [
    "eligible_pools",
    "node_views",
    "placement_order",
    "plan",
    "preemption_risk",
    "summarize",
]
