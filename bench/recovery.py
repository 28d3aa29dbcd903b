"""How fast a preempted job carries on, on a real local stack, beside how long Ray itself
takes to declare the lost node dead (what recovery driven by Ray's view would wait for).

Starts its own stack (free ports, a temporary state folder) and runs the `spotrain demo`
job: examples/train_digits.py on a spot node, preempted mid-run, --runs times without
notice and --notice-runs times with a 5 s notice. For each preemption:
- loss → `job.resumed` on the bus (with a notice: notice → `job.resumed`),
- loss → the next attempt RUNNING (`job.started`), and → its first reported step,
- loss → Ray's GCS reporting the node DEAD (the baseline),
- steps lost, and whether the final result equals an uninterrupted run's.
For reference (not measured here): SkyPilot polls a spot cluster's status every 15 s, and
its own recovery test allows 200 s.

    python bench/recovery.py [--runs 3] [--notice-runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from shared.cli.demo import DemoRun, Story, run_demo
from shared.localstack import stack
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.resources import NODE_LABEL

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_DEAD = 1  # ray.core.generated.gcs_pb2.GcsNodeInfo.GcsNodeState.DEAD


def ray_declared_dead(gcs_address: str, node: str, timeout_s: float = 60) -> datetime | None:
    """When Ray's GCS marked the node DEAD (its own record of it), once it has."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # noqa: PLC0415

    client: Any = GcsClient(address=gcs_address)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for info in client.get_all_node_info().values():
            if dict(info.labels).get(NODE_LABEL) == node and info.state == _DEAD:
                return datetime.fromtimestamp(info.end_time_ms / 1000, UTC)
        time.sleep(0.2)
    return None


def seconds(later: datetime | None, earlier: datetime) -> float:
    return (later - earlier).total_seconds() if later is not None else float("nan")


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(
    rows: dict[str, list[float]], matches: list[bool], notice_s: float, run: DemoRun
) -> None:
    def worst(key: str) -> float:
        return max(rows[key], default=float("nan"))

    print(f"preemptions_without_notice: {len(rows['resumed_after_loss'])}")
    print(f"preemptions_with_notice: {len(rows['resumed_after_notice'])}")
    print(f"notice_s: {notice_s:g}")
    print(f"checkpoint_interval_steps: {run.checkpoint_every}")
    print(f"resumed_after_loss_s_p50: {p50(rows['resumed_after_loss']):.3f}")
    print(f"resumed_after_loss_s_max: {worst('resumed_after_loss'):.3f}")
    print(f"resumed_after_notice_s_p50: {p50(rows['resumed_after_notice']):.3f}")
    print(f"running_after_loss_s_p50: {p50(rows['running_after_loss']):.2f}")
    print(f"first_step_after_loss_s_p50: {p50(rows['first_step_after_loss']):.2f}")
    print(f"steps_lost_without_notice_max: {worst('steps_lost'):.0f}")
    print(f"steps_lost_with_notice_max: {worst('steps_lost_notice'):.0f}")
    print(f"baseline_ray_node_dead_after_loss_s_p50: {p50(rows['ray_dead_after_loss']):.2f}")
    print(f"results_matching_uninterrupted: {sum(matches)}/{len(matches)}")
    print("reference_skypilot_status_poll_s: 15")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--notice-runs", type=int, default=2)
    parser.add_argument("--notice-s", type=float, default=5.0)
    args = parser.parse_args()
    console = Console(stderr=True)
    run = DemoRun()
    rows: dict[str, list[float]] = {
        key: []
        for key in (
            "resumed_after_loss",
            "resumed_after_notice",
            "running_after_loss",
            "first_step_after_loss",
            "ray_dead_after_loss",
            "steps_lost",
            "steps_lost_notice",
        )
    }
    matches: list[bool] = []
    with tempfile.TemporaryDirectory() as home:
        settings: LocalStackSettings = isolated_stack(Path(home) / "stack")
        os.environ["SPOTRAIN_NATS_URL"] = settings.nats_url
        os.environ["SPOTRAIN_LOCAL_HOME"] = str(settings.home)
        stack.up(settings)
        try:
            plans = [0.0] * args.runs + [args.notice_s] * args.notice_runs
            for number, notice_s in enumerate(plans, start=1):
                how = f"{notice_s:g}s notice" if notice_s else "no notice"
                console.rule(f"run {number}: {how}")
                story: Story = asyncio.run(
                    run_demo(console, workdir=EXAMPLES, notice_s=notice_s, timeout_s=300, run=run)
                )
                matches.append(story.result_matches is True)
                [loss] = story.preemptions
                seen = story.first_seen.get
                resumed = seen(("resumed", 2))
                if loss.notice is None:
                    rows["resumed_after_loss"].append(seconds(resumed, loss.killed_at))
                    rows["steps_lost"].append(story.resumes[0][0].steps_lost)
                else:
                    rows["resumed_after_notice"].append(seconds(resumed, loss.notice.posted_at))
                    rows["steps_lost_notice"].append(story.resumes[0][0].steps_lost)
                rows["running_after_loss"].append(seconds(seen(("started", 2)), loss.killed_at))
                rows["first_step_after_loss"].append(seconds(seen(("progress", 2)), loss.killed_at))
                declared = ray_declared_dead(settings.gcs_address, loss.node)
                rows["ray_dead_after_loss"].append(seconds(declared, loss.killed_at))
        finally:
            stack.down(settings)
    report(rows, matches, args.notice_s, run)


if __name__ == "__main__":
    main()
