"""`spotrain simulate teams`: a GPU job trace shared by teams under the platform's own fair
share (shared.policy.fairshare), with borrowing, reclaim and priority preemption, either
checkpoint-first (the victim is asked for a checkpoint and stops once it is written) or
kill-and-restart (the victim loses what it did since its last periodic checkpoint), or no
preemption of running work at all. Per team: GPU-hours against the guarantee, borrowed
GPU-hours, the work lost to preemption; the p95 wait of high-priority jobs; and quota
violations, counted by a check of its own after every step, not by the policy.

    spotrain simulate teams --trace philly.csv --teams 5 [--limit 3000] [--json]

The trace names no users: a job's team (and whether it is high priority) is drawn from a
hash of its id, so the same job lands in the same team on every run.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from services.scaler.simulation.traces import TraceJob, read_trace
from shared.events.types import CapacityClass
from shared.policy.fairshare import Ask, Holding, Never, Preempt, Wait, place, use_of
from shared.policy.teams import ClassQuota, Teams, TeamSpec

SPOT = CapacityClass.SPOT
HIGH_PRIORITY = 8
NORMAL_PRIORITY = 5


class Preemption(StrEnum):
    CHECKPOINT_FIRST = "checkpoint-first"
    KILL = "kill"
    NONE = "none"
    """Running work is never stopped: a team waits for borrowed work to end."""


@dataclass(frozen=True, slots=True)
class TeamJob:
    job_id: str
    team: str
    arrival_s: float
    gpus: int
    duration_s: float
    priority: int


@dataclass(frozen=True, slots=True)
class Knobs:
    checkpoint_interval_s: float = 1800.0
    """How often a job checkpoints on its own: a kill loses what it did since."""
    step_s: float = 2.0
    checkpoint_write_s: float = 5.0
    """From the ask to the stop, a checkpoint-first victim finishes its step (half a step
    on average) and writes: that GPU time is all it loses."""
    min_runtime_s: float = 600.0
    restart_s: float = 60.0
    """A resumed attempt's start-up (both modes pay it; it is not counted as lost work)."""


@dataclass
class TeamFigures:
    guaranteed_gpus: int
    gpu_hours: float = 0.0
    borrowed_gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    preempted: int = 0
    jobs: int = 0
    never: int = 0

    def share_of_guarantee(self, span_h: float) -> float:
        """GPU-hours used over the guarantee's GPU-hours for the span."""
        owed = self.guaranteed_gpus * span_h
        return self.gpu_hours / owed if owed else 0.0


@dataclass
class TeamsOutcome:
    preemption: str
    span_h: float
    teams: dict[str, TeamFigures]
    quota_violations: int = 0
    lost_gpu_hours: float = 0.0
    high_priority_wait_p95_s: float = 0.0
    all_wait_p95_s: float = 0.0
    preemptions: int = 0
    finished: int = 0


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def assign_teams(
    trace: Sequence[TraceJob], teams: int, *, high_share: float = 0.2
) -> list[TeamJob]:
    """Each job to one of `teams` teams, and a `high_share` of them high priority, by a hash
    of its id: the trace has no users, and a replay must land the same way every time."""
    jobs = []
    for job in trace:
        digest = _hash(job.job_id)
        high = (digest >> 32) % 1000 < high_share * 1000
        jobs.append(
            TeamJob(
                job_id=job.job_id,
                team=team_name(digest % teams),
                arrival_s=job.arrival_s,
                gpus=job.gpus,
                duration_s=job.duration_s,
                priority=HIGH_PRIORITY if high else NORMAL_PRIORITY,
            )
        )
    return jobs


def team_name(index: int) -> str:
    return f"team-{index + 1}"


def split_cluster(gpus: int, weights: Sequence[float], *, borrow: float = 1.0) -> Teams:
    """Teams whose spot guarantees sum to `gpus` in the given proportions, each allowed to
    borrow `borrow` times its guarantee."""
    total = sum(weights)
    guarantees = [int(gpus * w / total) for w in weights]
    guarantees[0] += gpus - sum(guarantees)
    return Teams(
        teams={
            team_name(i): TeamSpec(
                name=team_name(i),
                quota={SPOT: ClassQuota(guaranteed_gpus=g, borrow_gpus=int(g * borrow))},
            )
            for i, g in enumerate(guarantees)
        }
    )


@dataclass
class _Running:
    job: TeamJob
    holding: Holding
    started_s: float
    """When it began to make progress (after a restart or a checkpoint wait)."""
    left_s: float
    """Work left when it started."""
    version: int


@dataclass
class _Sim:
    teams: Teams
    knobs: Knobs
    preemption: Preemption
    waiting: list[tuple[int, float, str]] = field(default_factory=list)
    left_s: dict[str, float] = field(default_factory=dict)
    resumed: set[str] = field(default_factory=set)
    running: dict[str, _Running] = field(default_factory=dict)
    events: list[tuple[float, int, str, int]] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    first_start_s: dict[str, float] = field(default_factory=dict)
    now_s: float = 0.0
    last_s: float = 0.0


def simulate_teams(
    jobs: Sequence[TeamJob], teams: Teams, preemption: Preemption, knobs: Knobs | None = None
) -> TeamsOutcome:
    """Replay the jobs through fair share; a job larger than its team can ever hold is
    counted as `never` and not run, as the submitter would refuse it."""
    knobs = knobs or Knobs()
    sim = _Sim(teams=teams, knobs=knobs, preemption=preemption)
    figures = {
        name: TeamFigures(guaranteed_gpus=spec.quota_in(SPOT).guaranteed_gpus)
        for name, spec in teams.teams.items()
    }
    outcome = TeamsOutcome(preemption=preemption.value, span_h=0.0, teams=figures)
    by_id = {job.job_id: job for job in jobs}
    for job in jobs:
        figures[job.team].jobs += 1
        if job.gpus > teams.teams[job.team].quota_in(SPOT).most_gpus:
            figures[job.team].never += 1
            continue
        heapq.heappush(sim.events, (job.arrival_s, 1, job.job_id, 0))
        sim.left_s[job.job_id] = job.duration_s
    while sim.events:
        at, kind, job_id, version = heapq.heappop(sim.events)
        _advance(sim, at, figures)
        if kind == 0:
            running = sim.running.get(job_id)
            if running is None or running.version != version:
                continue  # preempted since: this end was for an attempt that is gone
            del sim.running[job_id]
            outcome.finished += 1
        else:
            heapq.heappush(sim.waiting, (-by_id[job_id].priority, by_id[job_id].arrival_s, job_id))
        if sim.events and sim.events[0][0] == at:
            continue  # admit once every event of this instant is in
        _admit_waiting(sim, by_id, figures)
        outcome.quota_violations += _violations(sim, by_id)
    outcome.span_h = sim.last_s / 3600
    waits = sorted(
        sim.first_start_s[j.job_id] - j.arrival_s for j in jobs if j.job_id in sim.first_start_s
    )
    high = sorted(
        sim.first_start_s[j.job_id] - j.arrival_s
        for j in jobs
        if j.job_id in sim.first_start_s and j.priority == HIGH_PRIORITY
    )
    outcome.all_wait_p95_s = _p95(waits)
    outcome.high_priority_wait_p95_s = _p95(high)
    outcome.lost_gpu_hours = sum(f.lost_gpu_hours for f in figures.values())
    outcome.preemptions = sum(f.preempted for f in figures.values())
    return outcome


def _p95(values: Sequence[float]) -> float:
    return values[min(len(values) - 1, int(0.95 * len(values)))] if values else 0.0


def _advance(sim: _Sim, to_s: float, figures: dict[str, TeamFigures]) -> None:
    """Account GPU-hours (used, borrowed) from the last instant to `to_s`."""
    hours = (to_s - sim.now_s) / 3600
    if hours > 0:
        use = use_of(sim.teams, (r.holding for r in sim.running.values()), SPOT)
        for name, team_use in use.items():
            figures[name].gpu_hours += team_use.held * hours
            figures[name].borrowed_gpu_hours += team_use.borrowed * hours
    sim.now_s = to_s
    sim.last_s = max(sim.last_s, to_s)


def _admit_waiting(sim: _Sim, by_id: dict[str, TeamJob], figures: dict[str, TeamFigures]) -> None:
    """Pass over the waiting jobs, highest priority and oldest first, until a pass admits
    none: a victim requeued, or room freed late in a pass, is seen by the next one."""
    while _admit_pass(sim, by_id, figures):
        pass


def _admit_pass(sim: _Sim, by_id: dict[str, TeamJob], figures: dict[str, TeamFigures]) -> bool:
    """One pass; whether it admitted anything. A job that must wait tells us that a later
    one of the same team, no smaller and no higher, waits too (nothing changed in between),
    which keeps a long queue cheap."""
    min_runtime = sim.knobs.min_runtime_s if sim.preemption is not Preemption.NONE else 1e18
    still: list[tuple[int, float, str]] = []
    blocked: dict[str, tuple[int, int]] = {}
    holdings: list[Holding] | None = None
    admitted = False
    while sim.waiting:
        entry = heapq.heappop(sim.waiting)
        job = by_id[entry[2]]
        seen = blocked.get(job.team)
        if seen is not None and job.gpus >= seen[0] and job.priority <= seen[1]:
            still.append(entry)
            continue
        if holdings is None:
            holdings = [_holding_now(sim, r) for r in sim.running.values()]
        decision = place(
            Ask(team=job.team, capacity=SPOT, gpus=job.gpus, priority=job.priority),
            sim.teams,
            holdings,
            min_runtime_s=min_runtime,
        )
        if isinstance(decision, Wait | Never):
            blocked[job.team] = (job.gpus, job.priority)
            still.append(entry)
            continue
        delay = 0.0
        if isinstance(decision, Preempt):
            delay = _preempt(sim, decision, figures, by_id, still)
        blocked.clear()
        holdings = None
        admitted = True
        _start(sim, job, borrowed=decision.borrowed, delay_s=delay)
    for entry in still:
        heapq.heappush(sim.waiting, entry)
    return admitted


def _holding_now(sim: _Sim, running: _Running) -> Holding:
    ran = max(sim.now_s - running.started_s, 0.0)
    done = running.job.duration_s - running.left_s + ran
    since = done % sim.knobs.checkpoint_interval_s
    return Holding(
        job_id=running.holding.job_id,
        team=running.holding.team,
        capacity=SPOT,
        gpus=running.holding.gpus,
        priority=running.holding.priority,
        borrowed=running.holding.borrowed,
        # A started job "waits" only through its restart: it has run for the minimum's
        # purpose from its start, so never 0 (0 is "not on a node yet").
        ran_s=max(ran, 1e-9),
        since_checkpoint_s=since,
    )


def _preempt(
    sim: _Sim,
    decision: Preempt,
    figures: dict[str, TeamFigures],
    by_id: dict[str, TeamJob],
    still: list[tuple[int, float, str]],
) -> float:
    """Stop the victims and requeue them; the delay before the new job may start."""
    knobs = sim.knobs
    delay = 0.0
    for victim in decision.victims:
        running = sim.running.pop(victim.job_id)
        ran = max(sim.now_s - running.started_s, 0.0)
        left = running.left_s - ran
        if sim.preemption is Preemption.CHECKPOINT_FIRST:
            # One that checkpointed moments ago is stopped at once: asking for another
            # would cost more than the little it did since.
            ask_s = knobs.step_s / 2 + knobs.checkpoint_write_s
            if victim.since_checkpoint_s <= ask_s:
                lost_s = victim.since_checkpoint_s
                left += lost_s
            else:
                lost_s = ask_s
                delay = max(delay, ask_s)
        else:
            lost_s = victim.since_checkpoint_s
            left += lost_s
        team = figures[victim.team]
        team.lost_gpu_hours += victim.gpus * lost_s / 3600
        team.preempted += 1
        sim.left_s[victim.job_id] = left
        sim.resumed.add(victim.job_id)
        job = by_id[victim.job_id]
        still.append((-job.priority, job.arrival_s, job.job_id))
    return delay


def _start(sim: _Sim, job: TeamJob, *, borrowed: bool, delay_s: float) -> None:
    version = sim.versions.get(job.job_id, 0) + 1
    sim.versions[job.job_id] = version
    restart = sim.knobs.restart_s if job.job_id in sim.resumed else 0.0
    started = sim.now_s + delay_s + restart
    left = sim.left_s[job.job_id]
    sim.first_start_s.setdefault(job.job_id, sim.now_s + delay_s)
    holding = Holding(
        job_id=job.job_id,
        team=job.team,
        capacity=SPOT,
        gpus=job.gpus,
        priority=job.priority,
        borrowed=borrowed,
    )
    sim.running[job.job_id] = _Running(
        job=job, holding=holding, started_s=started, left_s=left, version=version
    )
    heapq.heappush(sim.events, (started + left, 0, job.job_id, version))


def _violations(sim: _Sim, by_id: dict[str, TeamJob]) -> int:
    """Broken promises after a step, checked from the teams file alone: a team over its
    guarantee plus borrowing, the teams over what they share, or a team left waiting
    with a job that fits its idle guarantee while others hold borrowed GPUs that have run
    past the minimum runtime (or with no preemption, while GPUs are free)."""
    use = use_of(sim.teams, (r.holding for r in sim.running.values()), SPOT)
    count = 0
    if sum(u.held for u in use.values()) > sim.teams.guaranteed(SPOT):
        count += 1
    free = sim.teams.guaranteed(SPOT) - sum(u.held for u in use.values())
    for name, spec in sim.teams.teams.items():
        if use[name].held > spec.quota_in(SPOT).most_gpus:
            count += 1
    # Borrowed GPUs past the minimum runtime, per team: what a reclaim may take.
    reclaimable: dict[str, int] = dict.fromkeys(sim.teams.teams, 0)
    if sim.preemption is not Preemption.NONE:
        for running in sim.running.values():
            ran = sim.now_s - running.started_s
            if running.holding.borrowed and ran >= sim.knobs.min_runtime_s:
                reclaimable[running.holding.team] += running.holding.gpus
    for _, _, job_id in sim.waiting:
        job = by_id[job_id]
        mine = use[job.team]
        if mine.held + job.gpus > mine.guaranteed:
            continue
        # A reclaim takes a team down to its guarantee, not below: at most its excess.
        others = sum(
            min(g, use[team].borrowed) for team, g in reclaimable.items() if team != job.team
        )
        if job.gpus <= free + others:
            count += 1
    return count


def print_table(outcomes: Sequence[TeamsOutcome]) -> None:
    names = sorted(outcomes[0].teams)
    print(f"{'team':<8} {'guar.':>6}", end="")
    for outcome in outcomes:
        print(f" | {outcome.preemption:>16}: share  borrowed  lost  preempted", end="")
    print()
    for name in names:
        print(f"{name:<8} {outcomes[0].teams[name].guaranteed_gpus:>6}", end="")
        for outcome in outcomes:
            t = outcome.teams[name]
            share = t.share_of_guarantee(outcome.span_h)
            print(
                f" | {'':>16}  {share:5.2f} {t.borrowed_gpu_hours:9.0f} "
                f"{t.lost_gpu_hours:5.0f} {t.preempted:10d}",
                end="",
            )
        print()
    for outcome in outcomes:
        print(
            f"{outcome.preemption}: quota violations {outcome.quota_violations}, GPU-hours lost "
            f"{outcome.lost_gpu_hours:.1f} in {outcome.preemptions} preemptions, p95 wait of "
            f"high-priority jobs {outcome.high_priority_wait_p95_s / 3600:.2f} h (all jobs "
            f"{outcome.all_wait_p95_s / 3600:.2f} h), finished {outcome.finished}"
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"spotrain simulate teams: {message}\n")
        raise SystemExit(2)


WEIGHTS = (0.3, 0.25, 0.2, 0.15, 0.1)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="spotrain simulate teams", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, required=True, help="CSV in the Philly trace format")
    p.add_argument("--teams", type=int, default=5, help="teams the jobs are shared among")
    p.add_argument("--limit", type=int, default=3000, help="the trace's first N jobs")
    p.add_argument("--gpus", type=int, default=400, help="GPUs the teams' guarantees sum to")
    p.add_argument("--borrow", type=float, default=1.0, help="borrowing limit x guarantee")
    p.add_argument(
        "--preemption",
        default="checkpoint-first,kill,none",
        help="comma-separated: checkpoint-first, kill, none",
    )
    p.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.teams < 1 or args.gpus < args.teams or args.limit < 1 or args.borrow < 0:
        sys.stderr.write(
            "spotrain simulate teams: --teams, --limit must be positive, --gpus at least "
            "--teams, --borrow not negative\n"
        )
        return 2
    try:
        modes = [Preemption(m.strip()) for m in args.preemption.split(",")]
        trace = read_trace(args.trace, limit=args.limit)
    except (ValueError, OSError) as error:
        sys.stderr.write(f"spotrain simulate teams: {error}\n")
        return 2
    weights = WEIGHTS if args.teams == len(WEIGHTS) else [1.0] * args.teams
    teams = split_cluster(args.gpus, weights, borrow=args.borrow)
    jobs = assign_teams(trace, args.teams)
    outcomes = [simulate_teams(jobs, teams, mode) for mode in modes]
    if args.json:
        print(json.dumps([asdict(o) for o in outcomes], indent=2))
    else:
        print_table(outcomes)
    return 0
