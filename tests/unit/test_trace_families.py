"""Trace families drawn from published distributions: each holds its source's shape."""

from __future__ import annotations

import math
import statistics

import pytest

from services.scaler.simulation.families import (
    DAY_S,
    FAMILIES,
    HOUR_S,
    Family,
    describe,
    family,
    generate,
    rate_at,
)
from services.scaler.simulation.traces import TraceJob

Drawn = tuple[Family, list[TraceJob]]


@pytest.fixture(scope="module", params=[f.name for f in FAMILIES])
def drawn(request: pytest.FixtureRequest) -> Drawn:
    chosen = family(request.param)
    return chosen, generate(chosen)


def test_the_same_seed_draws_the_same_trace() -> None:
    chosen = family("pai-diurnal")
    assert generate(chosen, seed=3)[:50] == generate(chosen, seed=3)[:50]
    assert generate(chosen, seed=3)[:50] != generate(chosen, seed=4)[:50]


def test_each_family_keeps_its_sources_gpu_shares(drawn: Drawn) -> None:
    chosen, jobs = drawn
    total = sum(share for _, share in chosen.shape.gpus)
    for gpus, share in chosen.shape.gpus:
        seen = sum(1 for j in jobs if j.gpus == gpus) / len(jobs)
        # Sweeps draw one size for many jobs: the shares hold within a few points.
        assert seen == pytest.approx(share / total, abs=0.05), gpus


def test_each_family_keeps_its_sources_median_duration(
    drawn: Drawn,
) -> None:
    chosen, jobs = drawn
    median = statistics.median(j.duration_s for j in jobs)
    if chosen.max_duration_s is None:
        assert median == pytest.approx(math.exp(chosen.shape.mu), rel=0.2)
    else:
        assert median < chosen.max_duration_s
        assert max(j.duration_s for j in jobs) < chosen.max_duration_s
    assert min(j.duration_s for j in jobs) >= chosen.shape.shortest_s
    assert describe(jobs)["jobs"] == len(jobs)


def test_arrivals_follow_the_week() -> None:
    """Helios's Venus cluster: busier on Wednesday than on Saturday, at 4 pm than at 5 am,
    and three times as busy on a Monday morning as the same hour on Tuesday would be."""
    chosen = family("helios-weekly")
    jobs = generate(chosen)
    per_day = [0] * 7
    per_hour = [0] * 24
    for job in jobs:
        per_day[int(job.arrival_s // DAY_S) % 7] += 1
        per_hour[int(job.arrival_s % DAY_S // HOUR_S)] += 1
    assert per_day[2] > 1.4 * per_day[5]
    assert per_hour[16] > 4 * per_hour[5]
    monday_10 = rate_at(chosen.arrivals, 10 * HOUR_S)
    tuesday_10 = rate_at(chosen.arrivals, DAY_S + 10 * HOUR_S)
    assert monday_10 / tuesday_10 == pytest.approx(3.0 * 1.02 / 1.10)


def test_a_steady_family_has_no_cycle() -> None:
    steady = family("philly-steady").arrivals
    assert {rate_at(steady, h * HOUR_S) for h in range(7 * 24)} == {1.0}


def test_an_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="philly-steady"):
        family("nope")
