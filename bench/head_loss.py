"""What a Ray head's loss costs, on a real local stack, in both of its modes, beside what one
node's loss costs in the same run.

For each mode (`plain`: the head keeps its state in memory, the default; `ft`: in Redis,
`spotrain up --ray-ft`) it starts a stack of its own (free ports, a temporary folder),
trains --jobs checkpointing jobs (examples/train_digits.py, one GPU each, allowed no
restart), and once each has checkpointed SIGKILLs every process of the head; --away-s
later `spotrain up` starts a head again. Then, per mode:
- head_loss_carried_on_<mode>: jobs that went on without a new attempt;
- head_loss_resumed_<mode>: jobs resumed from a checkpoint (cause head-lost);
- head_loss_jobs_lost_<mode>: jobs that did not succeed (goal 0);
- head_loss_double_submissions_<mode>: jobs seen running two attempts at once, from their
  processes sampled every 0.25 s (goal 0);
- head_loss_recovered_s_<mode>: from the head's return until every job runs again (or has
  ended as its code says).
Without fault tolerance the resumes wait for the nodes to rejoin the new head, which they
do once their raylets give the lost one up (RAY_gcs_rpc_server_reconnect_timeout_s, 60 s
by default; --reconnect-s sets it). The baseline, node_loss_resume_s: in the plain stack,
once the batch is done, one job's node killed without notice, until its next attempt runs.

    python bench/head_loss.py [--jobs 5] [--away-s 20] [--reconnect-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from shared.client import SpotrainClient
from shared.events.data import InterruptionCause, JobRequested
from shared.events.types import ObjectRef
from shared.jobs import AttemptState, JobRecord
from shared.localstack.nodes import NodeFolder, kill_node, pick_node, preempt
from shared.localstack.processes import ProcessRecord
from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.messaging import BusSettings
from tests.e2e import training
from tests.e2e.training import AttemptWatch

CLI = [sys.executable, "-c", "from shared.cli.entry import main; main()"]
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STEPS = 400


@dataclass
class Outcome:
    carried_on: int = 0
    resumed: int = 0
    lost: int = 0
    doubled: int = 0
    recovered_s: float = float("nan")
    node_loss_resume_s: float | None = None
    notes: list[str] = field(default_factory=list)


def spotrain(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        msg = f"spotrain {' '.join(args)}: {done.stderr}{done.stdout}"
        raise RuntimeError(msg)


def digits_job(job_id: str, workspace: ObjectRef) -> JobRequested:
    return training.digits_job(
        job_id, workspace, owner="bench", experiment="head-loss", seed=9, steps=STEPS,
        step_delay_s=0.1, max_restarts=0,
    )  # fmt: skip


async def wait_for(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what}"
            raise TimeoutError(msg)
        await asyncio.sleep(0.5)


class RunningAgain:
    """When each job runs again after the head's return: a resumed job when its next
    attempt started (its record says when); one that carried on when the new head's job API
    first says it runs (or that it ended as its code says)."""

    def __init__(self, dashboard: str, at_kill: dict[str, int]) -> None:
        self._dashboard = dashboard
        self._at_kill = at_kill
        self.at: dict[str, datetime] = {}

    def look(self, records: list[JobRecord]) -> bool:
        """One look; whether every job runs again."""
        from ray.job_submission import JobStatus, JobSubmissionClient  # noqa: PLC0415

        for record in records:
            current = record.current
            if record.job_id in self.at or current is None:
                continue
            if current.number > self._at_kill[record.job_id]:
                if current.started_at is not None:
                    self.at[record.job_id] = current.started_at
                continue
            try:
                status = JobSubmissionClient(self._dashboard).get_job_status(current.submission_id)
            except Exception:  # noqa: BLE001,S112  # not known (yet) to the new head
                continue
            if status in (JobStatus.RUNNING, JobStatus.SUCCEEDED):
                self.at[record.job_id] = datetime.now(UTC)
        return len(self.at) == len(self._at_kill)


async def one_mode(
    mode: str, jobs: int, away_s: float, folder: Path, reconnect_s: float | None
) -> Outcome:
    settings = isolated_stack(folder / "stack")
    env = {
        **os.environ,
        **settings.environment(),
        # How long a raylet waits for a lost head before its node starts it again (Ray's
        # default 60 s; a fault-tolerant stack sets its own).
        **({"RAY_gcs_rpc_server_reconnect_timeout_s": f"{reconnect_s:g}"} if reconnect_s else {}),
        "SPOTRAIN_SCALER_IDLE_TIMEOUT_S": "300",
        # Ray fails a job that waits this long for room: none may wait in Ray here.
        "RAY_JOB_START_TIMEOUT_SECONDS": "60",
    }
    await asyncio.to_thread(spotrain, env, "up", *(["--ray-ft"] if mode == "ft" else []))
    outcome = Outcome()
    try:
        project = folder / "project"
        project.mkdir()
        shutil.copy(EXAMPLES / "train_digits.py", project)
        ids = [f"{mode}-{n}" for n in range(jobs)]
        bus = BusSettings(nats_url=settings.nats_url, connect_timeout_s=10)
        with AttemptWatch() as watch:
            async with await SpotrainClient.connect(bus) as client:
                workspace = await client.upload_workspace(project, owner="bench")
                for job_id in ids:
                    await client.submit(digits_job(job_id, workspace), answer_timeout_s=30)

                async def checkpointed() -> bool:
                    records = {r.job_id: r for r in await client.jobs()}
                    return all(
                        job_id in records
                        and (current := records[job_id].current) is not None
                        and current.state is AttemptState.RUNNING
                        and (current.step or 0) >= 20
                        for job_id in ids
                    )

                await wait_for(checkpointed, 300, "every job running past a checkpoint")
                at_kill = {
                    r.job_id: r.current.number
                    for r in await client.jobs()
                    if r.job_id in ids and r.current is not None
                }
                head = ProcessRecord.load(settings.run_dir / "ray-head.json")
                assert head is not None
                kill_node(head)
                await asyncio.sleep(away_s)
                await asyncio.to_thread(spotrain, env, "up")
                back = datetime.now(UTC)
                again = RunningAgain(settings.dashboard_url, at_kill)

                async def all_running() -> bool:
                    records = [r for r in await client.jobs() if r.job_id in ids]
                    return await asyncio.to_thread(again.look, records)

                await wait_for(all_running, 600, "every job running again")
                outcome.recovered_s = max((at - back).total_seconds() for at in again.at.values())

                async def all_ended() -> bool:
                    records = [r for r in await client.jobs() if r.job_id in ids]
                    return len(records) == len(ids) and not any(r.is_active for r in records)

                await wait_for(all_ended, 900, "every job ending")
                records = [r for r in await client.jobs() if r.job_id in ids]
                for record in records:
                    head_lost = [
                        a for a in record.attempts if a.cause is InterruptionCause.HEAD_LOST
                    ]
                    if record.state.value != "succeeded":
                        outcome.lost += 1
                        outcome.notes.append(f"{record.job_id}: {record.detail}")
                    elif head_lost:
                        outcome.resumed += 1
                    elif len(record.attempts) == 1:
                        outcome.carried_on += 1
                if mode == "plain":
                    outcome.node_loss_resume_s = await node_loss(client, workspace, settings)
        outcome.doubled = len(watch.doubled)
        outcome.notes.extend(watch.details[:3])
    finally:
        await asyncio.to_thread(subprocess.run, [*CLI, "down"], env=env, capture_output=True)
    return outcome


async def node_loss(
    client: SpotrainClient, workspace: ObjectRef, settings: LocalStackSettings
) -> float:
    """One job's node killed without notice: until its next attempt runs."""
    job_id = "node-loss"
    request = digits_job(job_id, workspace).model_copy(update={"max_restarts": 3})
    await client.submit(request, answer_timeout_s=30)

    async def checkpointed() -> bool:
        record = await client.job(job_id)
        current = record.current if record is not None else None
        return (
            current is not None
            and current.state is AttemptState.RUNNING
            and (current.step or 0) >= 20
        )

    await wait_for(checkpointed, 300, "the node-loss job past a checkpoint")
    record = await client.job(job_id)
    assert record is not None
    assert record.current is not None
    folder = NodeFolder(settings.node_dir)
    killed = time.monotonic()
    await asyncio.to_thread(preempt, folder, pick_node(folder, record.current.nodes[0]), notice_s=0)

    async def resumed_running() -> bool:
        found = await client.job(job_id)
        return (
            found is not None
            and found.current is not None
            and found.current.number > 1
            and found.current.state is AttemptState.RUNNING
        )

    await wait_for(resumed_running, 300, "the node-loss job running again")
    return time.monotonic() - killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--away-s", type=float, default=20.0)
    parser.add_argument(
        "--reconnect-s",
        type=float,
        default=None,
        help="RAY_gcs_rpc_server_reconnect_timeout_s for the plain stack (Ray's default: 60)",
    )
    parser.add_argument("--modes", nargs="+", choices=("plain", "ft"), default=["plain", "ft"])
    args = parser.parse_args()
    outcomes = {}
    for mode in args.modes:
        with tempfile.TemporaryDirectory(prefix=f"bench-head-{mode}-") as folder:
            started = time.monotonic()
            outcomes[mode] = asyncio.run(
                one_mode(mode, args.jobs, args.away_s, Path(folder), args.reconnect_s)
            )
            print(f"# {mode}: done in {time.monotonic() - started:.0f} s", flush=True)
    print(f"# {args.jobs} jobs, every head process SIGKILLed, a head back {args.away_s:g} s later")
    print(f"# {'figure':<28}" + "".join(f"{mode:>10}" for mode in outcomes))
    for name in ("carried_on", "resumed", "lost", "doubled", "recovered_s"):
        cells = [getattr(outcome, name) for outcome in outcomes.values()]
        shown = [f"{v:>10.1f}" if isinstance(v, float) else f"{v:>10}" for v in cells]
        print(f"# {name:<28}" + "".join(shown))
    for mode, outcome in outcomes.items():
        for note in outcome.notes:
            print(f"# {mode}: {note}")
    for mode, outcome in outcomes.items():
        print(f"head_loss_carried_on_{mode}: {outcome.carried_on}")
        print(f"head_loss_resumed_{mode}: {outcome.resumed}")
        print(f"head_loss_jobs_lost_{mode}: {outcome.lost}")
        print(f"head_loss_double_submissions_{mode}: {outcome.doubled}")
        print(f"head_loss_recovered_s_{mode}: {outcome.recovered_s:.2f}")
    plain = outcomes.get("plain")
    if plain is not None and plain.node_loss_resume_s is not None:
        print(f"node_loss_resume_s: {plain.node_loss_resume_s:.1f}")


if __name__ == "__main__":
    main()
