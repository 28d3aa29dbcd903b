"""The checkpointer's metrics: notices and losses handled, checkpoints asked for, resumes and
give-ups, and how long a decision took after the signal. Names: docs/metrics.md."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from shared.events.data import MoveReason
from shared.events.types import CapacityClass

NOTICES = Counter(
    "spotrain_preemption_notices_total", "Preemption notices handled, by pool.", ["pool"]
)
LOSSES = Counter("spotrain_nodes_lost_total", "Node losses handled, by pool.", ["pool"])
CHECKPOINT_REQUESTS = Counter(
    "spotrain_checkpoint_requests_total", "CHECKPOINT_NOW requests written to running attempts."
)
RESUMES = Counter(
    "spotrain_resumes_total", "Attempts resumed from a checkpoint, by capacity.", ["capacity"]
)
MOVES = Counter(
    "spotrain_capacity_moves_total",
    "Running deadline jobs moved to other capacity, by reason.",
    ["reason"],
)
GIVE_UPS = Counter("spotrain_jobs_given_up_total", "Jobs that ran out of restarts.")
DECISION_SECONDS = Histogram(
    "spotrain_resume_decision_seconds",
    "From the loss signal's time (node lost, attempt interrupted) to the resume decision.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

UNKNOWN_POOL = "unknown"


def declare() -> None:
    """Resumes by every capacity from 0 at start: "none yet" reads as 0, not as no series."""
    for capacity in CapacityClass:
        RESUMES.labels(capacity.value)
    for reason in MoveReason:
        MOVES.labels(reason.value)
