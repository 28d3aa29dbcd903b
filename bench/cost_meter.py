"""How long the scaler's cost-accrued metrics take per pass as history grows, beside the
baseline of attributing from scratch (what `spotrain cost` does: fold every event, then
attribute).

A synthetic history: --nodes spot and on-demand nodes launched and released over a day,
--jobs jobs of 1-4 attempts placed on them (a third of the attempts preempted and
resumed). The meter folds each event once, in the pass after it arrived; a pass then turns
the fold into inputs, attributes them and builds the samples, all in a thread off the
scaler's event loop (the loop only hands over the list of new events). A node that ended is
attributed once and remembered, so passes after the first redo only the live nodes (here,
by the end of the day, none). Medians of
--rounds. Ends with `name: value` lines.

    python bench/cost_meter.py [--jobs 10000] [--nodes 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from services.scaler.metrics import cost_samples
from shared.events import Event, new_event
from shared.events.data import (
    InterruptionCause,
    JobInterrupted,
    JobRequested,
    JobResumed,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
    NodeReleased,
    ReleaseReason,
)
from shared.events.types import Bundle, CapacityClass
from shared.policy.cost import CostFold, attributed, ledger
from shared.policy.cost.attribution import SettledMemo

START = datetime(2026, 11, 30, tzinfo=UTC)
DAY_S = 86_400


def history(jobs: int, nodes: int) -> list[Event[Any]]:
    rng = random.Random(11)  # noqa: S311  # a reproducible workload, not a secret
    events: list[tuple[float, Any]] = []
    names = []
    for i in range(nodes):
        spot = i % 3 != 0
        launched = rng.uniform(0, DAY_S * 0.8)
        name = f"{'spot' if spot else 'od'}-{i}"
        names.append((name, launched))
        events.append(
            (
                launched,
                NodeLaunched(
                    node=name,
                    pool="gpu-spot" if spot else "gpu-on-demand",
                    capacity=CapacityClass.SPOT if spot else CapacityClass.ON_DEMAND,
                    gpus=8,
                    cpus=96,
                    price_per_hour_usd=7.2 if spot else 24.5,
                    on_demand_pool="gpu-on-demand",
                    on_demand_price_per_hour_usd=24.5,
                    launched_at=START + timedelta(seconds=launched),
                ),
            )
        )
        released = launched + rng.uniform(600, DAY_S * 0.2)
        events.append(
            (
                released,
                NodeReleased(
                    node=name,
                    pool="gpu-spot" if spot else "gpu-on-demand",
                    reason=ReleaseReason.SCALED_DOWN,
                    released_at=START + timedelta(seconds=released),
                ),
            )
        )
    for j in range(jobs):
        job_id = f"job-{j}"
        at = rng.uniform(0, DAY_S * 0.8)
        events.append(
            (
                at,
                JobRequested(
                    job_id=job_id,
                    owner=f"owner-{j % 40}",
                    experiment=f"exp-{j % 300}",
                    entrypoint=("python", "train.py"),
                    worker=Bundle(gpus=rng.choice((1, 2, 4))),
                ),
            )
        )
        for attempt in range(1, rng.choice((1, 1, 2, 4)) + 1):
            node, launched = rng.choice(names)
            start = max(at, launched) + rng.uniform(1, 60)
            events.append(
                (
                    start,
                    JobStarted(
                        job_id=job_id,
                        attempt=attempt,
                        submission_id=f"{job_id}-{attempt}",
                        nodes=(node,),
                    ),
                )
            )
            at = start + rng.uniform(60, 3600)
            events.append(
                (
                    at,
                    JobInterrupted(
                        job_id=job_id, attempt=attempt, node=node, cause=InterruptionCause.PREEMPTED
                    ),
                )
            )
            events.append(
                (
                    at + 1,
                    JobResumed(
                        job_id=job_id,
                        attempt=attempt + 1,
                        from_step=attempt * 100,
                        steps_lost=rng.randint(0, 50),
                        capacity=CapacityClass.SPOT,
                    ),
                )
            )
        events.append((at + 2, JobSucceeded(job_id=job_id, attempt=attempt + 1)))
    events.sort(key=lambda pair: pair[0])
    return [
        new_event(data, source="bench", time=START + timedelta(seconds=t)) for t, data in events
    ]


def median_ms(work: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        work()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    events = history(args.jobs, args.nodes)
    now = START + timedelta(seconds=DAY_S)
    fold = CostFold()

    def fold_all() -> None:
        for event in events:
            fold.add(event)

    fold_ms = median_ms(fold_all, 1)

    settled: SettledMemo = {}
    passes = [now]

    def meter_pass() -> object:
        # Ten seconds later each time, as the scaler's passes come; what ended stays settled.
        passes.append(passes[-1] + timedelta(seconds=10))
        return cost_samples(attributed(fold.inputs({}), now=passes[-1], settled=settled))

    def from_scratch() -> object:
        return cost_samples(ledger(events, now=now))

    print(f"events: {len(events)}  (jobs {args.jobs}, nodes {args.nodes})")
    figures = {
        "fold_all_events_once_ms": fold_ms,
        "meter_first_pass_in_thread_ms": median_ms(meter_pass, 1),
        "meter_next_pass_in_thread_ms": median_ms(meter_pass, args.rounds),
        "baseline_from_scratch_ms": median_ms(from_scratch, args.rounds),
    }
    for name, value in figures.items():
        print(f"{name}: {value:.1f}")


if __name__ == "__main__":
    main()
