"""Job trace families drawn from published distributions of public GPU cluster traces, so
the scaler is tuned on workloads of several shapes and judged on ones it never saw.

A family is a job shape (how many GPUs, how long) and an arrival pattern (steady, a daily
cycle, a weekly cycle with a Monday surge; jobs alone or in sweeps). Each shape comes from
one trace, as its authors published it or as computed from its released data:

- **Philly** (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN
  Training Workloads", USENIX ATC 2019; trace CC BY 4.0): computed from
  `../shared/traces/philly.csv` (111,549 jobs): GPUs 1/2/4/8/>8 = 86.65/2.26/4.92/5.12/
  1.04%; durations fitted lognormal, mu 7.09, sigma 2.51 (ln s; the fit's median is
  1,200 s, the data's 1,321 s).
- **Alibaba PAI** (Weng et al., "MLaaS in the Wild: Workload Analysis and Scheduling in
  Large-Scale Heterogeneous GPU Clusters", NSDI 2022; `alibaba/clusterdata`
  cluster-trace-gpu-v2020, CC BY 4.0): read off the analysis notebook's figures (per task):
  GPUs <=1/2/4/>4 = 82/5/4/9%; durations lognormal, mu 6.28, sigma 2.32 (median ~530 s);
  submissions by hour 2.5x peak to trough, weekdays 1.34x weekends.
- **SenseTime Helios** (Hu et al., "Characterization and Prediction of Deep Learning
  Workloads in Large-Scale GPU Datacenters", SC 2021, doi 10.1145/3458817.3476223;
  HeliosData CC BY 4.0): GPUs 1/2/4/8/>8 = 72.2/2.5/5.8/14.2/5.3% (the four clusters'
  CDFs, weighted by jobs); durations fitted lognormal, mu 5.45, sigma 2.64 (the fit's
  median is 233 s; the figures' 201 s, the paper's 206 s); the Venus cluster's
  submissions by hour of day and day of week, and their burstiness (variance over mean 15
  per 10 min), computed from its 10-minute counts.

The numbers read off figures are estimates (checked against Philly's own data on the same
plot: quantiles within 12%); what matters here is the shape, not the third digit.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from services.scaler.simulation.traces import TraceJob

DAY_S = 86_400.0
HOUR_S = 3_600.0


@dataclass(frozen=True, slots=True)
class JobShape:
    """How many GPUs a job asks for (with its share) and how long it runs (lognormal in ln
    seconds, clipped)."""

    source: str
    gpus: tuple[tuple[int, float], ...]
    mu: float
    sigma: float
    shortest_s: float = 10.0
    longest_s: float = 2 * DAY_S


@dataclass(frozen=True, slots=True)
class Arrivals:
    """When jobs come: a rate by hour of day and by weekday (each relative to its mean),
    a surge on Monday mornings, and sweeps (a user's jobs of one shape, seconds apart)."""

    hourly: tuple[float, ...] = (1.0,) * 24
    weekly: tuple[float, ...] = (1.0,) * 7
    """Monday first."""
    monday_surge: float = 1.0
    """How many times the usual rate arrives on Monday from 9:00 to 12:00."""
    sweep_mean: float = 1.0
    """The mean number of jobs per sweep (geometric): 1 is jobs alone."""


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    shape: JobShape
    arrivals: Arrivals
    jobs_per_day: float
    days: int = 14
    max_duration_s: float | None = None
    """Keep only jobs under this (a family of short jobs)."""


PHILLY = JobShape(
    source="philly",
    gpus=((1, 86.65), (2, 2.26), (4, 4.92), (8, 5.12), (16, 1.04)),
    mu=7.09,
    sigma=2.51,
)
PAI = JobShape(source="pai", gpus=((1, 82.0), (2, 5.0), (4, 4.0), (8, 9.0)), mu=6.28, sigma=2.32)
HELIOS = JobShape(
    source="helios",
    gpus=((1, 72.2), (2, 2.5), (4, 5.8), (8, 14.2), (16, 5.3)),
    mu=5.45,
    sigma=2.64,
)

PAI_HOURLY = (
    1.45, 1.0, 0.75, 0.6, 0.65, 0.75, 0.85, 0.95, 1.05, 1.2, 1.45, 1.45,
    1.1, 1.0, 1.1, 1.2, 1.3, 1.45, 1.2, 1.0, 0.95, 0.9, 0.85, 0.8,
)  # fmt: skip
"""Estimated from the notebook's hourly medians (UTC+8): a trough of ~440 at 3 am, ~1,100
at midnight, 10-11 am and 5 pm."""
PAI_WEEKLY = (1.05, 1.11, 1.07, 1.11, 1.04, 0.79, 0.83)
VENUS_HOURLY = (
    0.90, 0.66, 0.60, 0.38, 0.27, 0.21, 0.19, 0.22, 0.37, 0.80, 1.29, 1.47,
    1.16, 1.30, 1.56, 1.66, 1.73, 1.73, 1.28, 1.31, 1.34, 1.36, 1.15, 1.04,
)  # fmt: skip
VENUS_WEEKLY = (1.02, 1.10, 1.27, 1.20, 0.95, 0.68, 0.77)

FAMILIES = (
    Family("philly-steady", PHILLY, Arrivals(), jobs_per_day=400),
    Family(
        "pai-diurnal",
        PAI,
        Arrivals(hourly=PAI_HOURLY, weekly=PAI_WEEKLY, sweep_mean=2.0),
        jobs_per_day=800,
    ),
    Family(
        "helios-weekly",
        HELIOS,
        Arrivals(hourly=VENUS_HOURLY, weekly=VENUS_WEEKLY, monday_surge=3.0, sweep_mean=8.0),
        jobs_per_day=800,
    ),
    Family(
        "helios-short-bursty",
        HELIOS,
        Arrivals(hourly=VENUS_HOURLY, weekly=VENUS_WEEKLY, monday_surge=3.0, sweep_mean=8.0),
        jobs_per_day=1500,
        max_duration_s=HOUR_S,
    ),
)
"""Each job shape under a pattern it was not tuned on, and the short-job, bursty, weekly
shape the scaler had never seen (the issue's)."""

SWEEP_GAP_S = 5.0
"""Jobs of one sweep arrive this far apart, on average."""
SWEEP_SPREAD = 0.3
"""A sweep's jobs run about as long as each other: this sigma (ln) around its own draw."""


def family(name: str) -> Family:
    for known in FAMILIES:
        if known.name == name:
            return known
    names = ", ".join(f.name for f in FAMILIES)
    raise ValueError(f"no trace family {name!r}: known are {names}")


def rate_at(arrivals: Arrivals, t_s: float) -> float:
    """The arrival rate at `t_s` relative to the mean (t 0 is a Monday, 00:00)."""
    day = int(t_s // DAY_S) % 7
    hour = int(t_s % DAY_S // HOUR_S)
    surge = arrivals.monday_surge if day == 0 and 9 <= hour < 12 else 1.0
    hourly = arrivals.hourly[hour] / (sum(arrivals.hourly) / 24)
    weekly = arrivals.weekly[day] / (sum(arrivals.weekly) / 7)
    return hourly * weekly * surge


def generate(chosen: Family, *, seed: int = 0) -> list[TraceJob]:
    """The family's jobs over its days, drawn with the seed (the same seed, the same trace).
    Sweeps start as a Poisson process thinned by the pattern's rate; each sweep is a
    geometric number of jobs of one GPU count, each running about as long as the sweep's
    own draw."""
    draw = random.Random(seed)  # noqa: S311  # a reproducible replay, not a secret
    arrivals = chosen.arrivals
    peak = max(rate_at(arrivals, h * HOUR_S) for h in range(7 * 24))
    sweeps_per_s = chosen.jobs_per_day / DAY_S / arrivals.sweep_mean
    sizes = [gpus for gpus, _ in chosen.shape.gpus]
    weights = [share for _, share in chosen.shape.gpus]
    horizon_s = chosen.days * DAY_S
    jobs: list[TraceJob] = []
    t_s = 0.0
    while True:
        t_s += draw.expovariate(sweeps_per_s * peak)
        if t_s >= horizon_s:
            break
        if draw.random() * peak > rate_at(arrivals, t_s):
            continue
        count = _geometric(draw, arrivals.sweep_mean)
        gpus = draw.choices(sizes, weights)[0]
        centre = draw.gauss(chosen.shape.mu, chosen.shape.sigma)
        at_s = t_s
        for _ in range(count):
            spread = draw.gauss(0.0, SWEEP_SPREAD) if count > 1 else 0.0
            duration_s = _clip(math.exp(centre + spread), chosen.shape)
            if chosen.max_duration_s is None or duration_s < chosen.max_duration_s:
                jobs.append(TraceJob(f"{chosen.name}-{len(jobs)}", at_s, gpus, duration_s))
            at_s += draw.expovariate(1 / SWEEP_GAP_S)
    jobs.sort(key=lambda j: j.arrival_s)
    return jobs


def _geometric(draw: random.Random, mean: float) -> int:
    """At least one; mean `mean`."""
    if mean <= 1:
        return 1
    p = 1 / mean
    return 1 + int(math.log(1 - draw.random()) / math.log(1 - p))


def _clip(duration_s: float, shape: JobShape) -> float:
    return min(max(duration_s, shape.shortest_s), shape.longest_s)


def describe(jobs: Sequence[TraceJob]) -> dict[str, float]:
    """A trace's shape in a few numbers, to set beside its source's."""
    if not jobs:
        return {"jobs": 0}
    durations = sorted(j.duration_s for j in jobs)
    gpu_s = sum(j.gpus * j.duration_s for j in jobs)
    span_s = max(j.arrival_s for j in jobs) - min(j.arrival_s for j in jobs)
    return {
        "jobs": len(jobs),
        "duration_p50_s": durations[len(durations) // 2],
        "one_gpu_share": sum(1 for j in jobs if j.gpus == 1) / len(jobs),
        "mean_busy_gpus": gpu_s / span_s if span_s > 0 else 0.0,
    }
