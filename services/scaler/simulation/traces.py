"""Reading the traces the simulator replays: GPU job traces (the Philly CSV) and spot
market traces (the JSON of `../shared/traces/spot`)."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


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


@dataclass(frozen=True, slots=True)
class SpotTrace:
    """How many nodes of one spot pool could be held at each tick (the JSON of
    `../shared/traces/spot`: `{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`)."""

    name: str
    gap_s: int
    counts: tuple[int, ...]

    @property
    def hours(self) -> float:
        return len(self.counts) * self.gap_s / 3600


def read_spot_trace(path: Path) -> SpotTrace:
    """A spot market trace; anything but the documented JSON is a ValueError naming the file."""
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected an object with 'metadata' and 'data'")
    metadata, data = document.get("metadata"), document.get("data")
    gap = metadata.get("gap_seconds") if isinstance(metadata, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or gap <= 0 or gap != int(gap):
        raise ValueError(f"{path}: metadata.gap_seconds must be a whole number of seconds > 0")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: data must be a non-empty list of node counts")
    for i, count in enumerate(data):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{path}: data[{i}] is {count!r}, not a count of nodes (int >= 0)")
    return SpotTrace(name=path.stem, gap_s=int(gap), counts=tuple(data))
