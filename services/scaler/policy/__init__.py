"""The scaler's decisions, pure: no I/O, no clock (`now` is an argument), no ids.

- `packing`: pool sizes from pending demand, free room and the budget; a deadline job's
  choice between spot, on-demand and waiting is `shared.deadline`'s, the one policy the
  scaler (queued jobs), the checkpointer (running jobs) and the simulator share.
"""

from services.scaler.policy.packing import (
    eligible_pools,
    node_views,
    plan,
    preemption_risk,
    summarize,
)

__all__ = ["eligible_pools", "node_views", "plan", "preemption_risk", "summarize"]
