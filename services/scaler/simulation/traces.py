"""Reading the traces the simulator replays: GPU job traces (the Philly CSV) and spot
market traces (the JSON of `../shared/traces/spot`)."""

from __future__ import annotations

import csv
import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.spot_traces import SpotTrace, read_spot_trace


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    arrival_s: float
    gpus: int
    duration_s: float
    deadline_s: float | None = None
    """When its result is needed (seconds on the trace's clock), if it is."""


def with_deadlines(
    trace: Sequence[TraceJob], share: float, low: float, high: float, *, seed: int = 0
) -> list[TraceJob]:
    """The trace with a deadline on a `share` of its jobs (drawn with the seed): arrival +
    slack x duration, the slack uniform in [low, high]."""
    draw = random.Random(seed)  # noqa: S311  # a reproducible replay, not a secret
    jobs = []
    for job in trace:
        chosen = draw.random() < share
        slack = draw.uniform(low, high)
        deadline_s = job.arrival_s + slack * job.duration_s if chosen else None
        jobs.append(dataclasses.replace(job, deadline_s=deadline_s))
    return jobs


def read_trace(path: Path, limit: int | None = None) -> list[TraceJob]:
    """Jobs from a CSV of the Philly trace's format: job id, arrival s, topology, shape,
    size (GPUs), duration s; a first line starting with `#` is a header. Sorted by arrival."""
    jobs = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].lstrip().startswith("#"):
                continue
            if len(row) < 6:
                raise ValueError(f"{path}: expected 6 columns, got {row!r}")
            try:
                jobs.append(TraceJob(row[0].strip(), float(row[1]), int(row[4]), float(row[5])))
            except ValueError:
                raise ValueError(f"{path}: not a number where one belongs in {row!r}") from None
            if limit is not None and len(jobs) >= limit:
                break
    jobs.sort(key=lambda j: j.arrival_s)
    return jobs


__all__ = ["SpotTrace", "TraceJob", "read_spot_trace", "read_trace", "with_deadlines"]
