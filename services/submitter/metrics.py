"""The submitter's metrics: jobs by state and each active job's training progress, from the
records of every tracking pass; outcomes, attempts and recovery time as they happen.
Names: docs/metrics.md."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import Counter, Histogram

from shared.events.data import InterruptionCause, ResizeReason
from shared.jobs import TERMINAL_STATES, AttemptState, JobRecord, JobState
from shared.runtime.metrics import GaugeSpec, register_snapshot

JOB = ("job_id", "experiment", "owner")

JOBS = GaugeSpec("spotrain_jobs", "Job records by state.", ("state",))
JOB_STEP = GaugeSpec("spotrain_job_step", "The last training step an active job reported.", JOB)
JOB_TOTAL_STEPS = GaugeSpec(
    "spotrain_job_total_steps", "The steps an active job's run will take, when it says.", JOB
)
JOB_ETA = GaugeSpec(
    "spotrain_job_eta_seconds", "Time an active job needs to finish at its attempt's pace.", JOB
)
JOB_ATTEMPT = GaugeSpec("spotrain_job_attempt", "An active job's current attempt number.", JOB)
JOB_WORKERS = GaugeSpec(
    "spotrain_job_workers", "How many workers a multi-node job's attempt has now.", JOB
)
JOB_METRIC = GaugeSpec(
    "spotrain_job_metric",
    "The last value of each metric an active job's training reported.",
    (*JOB, "metric"),
)
SPECS = (JOBS, JOB_STEP, JOB_TOTAL_STEPS, JOB_ETA, JOB_ATTEMPT, JOB_WORKERS, JOB_METRIC)

FINISHED = Counter(
    "spotrain_jobs_finished_total",
    "Jobs that ended, by outcome (succeeded, failed, cancelled, rejected).",
    ["outcome"],
)
ATTEMPTS_STARTED = Counter(
    "spotrain_attempts_started_total",
    "Attempts Ray started, by pool and capacity.",
    ["pool", "capacity"],
)
ATTEMPTS_LOST = Counter(
    "spotrain_attempts_lost_total", "Attempts whose capacity went away, by cause.", ["cause"]
)
HOLD_CONFLICTS = Counter(
    "spotrain_team_hold_conflicts_total",
    "Team-quota writes that lost a compare-and-set to another submitter replica's, and were"
    " decided again.",
)
GIVE_WAY_ASKED = Counter(
    "spotrain_give_way_asked_total",
    "Jobs asked to checkpoint and stop for other work, by cause (reclaimed, priority).",
    ["cause"],
)
RESIZES = Counter(
    "spotrain_worker_resizes_total",
    "Multi-node attempts that went on with fewer workers (shrank) or took more (grew).",
    ["reason"],
)
RECOVERY_SECONDS = Histogram(
    "spotrain_recovery_seconds",
    "From a lost attempt's end to its successor running on Ray.",
    buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200),
)

RECORDS = register_snapshot(SPECS)

Samples = dict[GaugeSpec, list[tuple[Sequence[str], float]]]

NO_EXPERIMENT = "(none)"


def declare() -> None:
    """Every outcome and cause from 0 at start: "none yet" reads as 0, not as no series."""
    for state in TERMINAL_STATES:
        FINISHED.labels(state.value)
    for cause in InterruptionCause:
        ATTEMPTS_LOST.labels(cause.value)
    for reason in (ResizeReason.SHRANK, ResizeReason.GREW, ResizeReason.MOVED):
        RESIZES.labels(reason.value)


def record_samples(records: Iterable[JobRecord]) -> Samples:
    """Jobs by state (every state, zero included, so a panel shows a line from the start),
    and where each active job's current attempt is."""
    samples: Samples = {spec: [] for spec in SPECS}
    by_state = dict.fromkeys(JobState, 0)
    for record in records:
        by_state[record.state] += 1
        attempt = record.current
        if not record.is_active or attempt is None:
            continue
        labels = (record.job_id, record.request.experiment or NO_EXPERIMENT, record.request.owner)
        samples[JOB_ATTEMPT].append((labels, float(attempt.number)))
        if attempt.workers is not None and attempt.state is AttemptState.RUNNING:
            samples[JOB_WORKERS].append((labels, float(attempt.workers)))
        if attempt.state is not AttemptState.RUNNING or attempt.step is None:
            continue
        samples[JOB_STEP].append((labels, float(attempt.step)))
        if attempt.total_steps is not None:
            samples[JOB_TOTAL_STEPS].append((labels, float(attempt.total_steps)))
        if attempt.eta_s is not None:
            samples[JOB_ETA].append((labels, attempt.eta_s))
        for name, value in sorted(attempt.metrics.items()):
            samples[JOB_METRIC].append(((*labels, name), value))
    samples[JOBS] = [((state.value,), float(count)) for state, count in by_state.items()]
    return samples
