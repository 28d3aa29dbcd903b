"""`spotrain simulate teams`: fair share over a trace, checkpoint-first against
kill-and-restart, and its own check for broken quota promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.scaler.simulation import teams as sim
from services.scaler.simulation.teams import (
    HIGH_PRIORITY,
    Knobs,
    Preemption,
    TeamJob,
    assign_teams,
    simulate_teams,
    split_cluster,
)
from services.scaler.simulation.traces import TraceJob
from shared.events.types import CapacityClass
from shared.policy.fairshare import Wait
from shared.policy.teams import ClassQuota, Teams, TeamSpec

KNOBS = Knobs(checkpoint_interval_s=1800, step_s=2, checkpoint_write_s=5, min_runtime_s=600)
TWO = Teams(
    teams={
        "a": TeamSpec(
            name="a", quota={CapacityClass.SPOT: ClassQuota(guaranteed_gpus=4, borrow_gpus=4)}
        ),
        "b": TeamSpec(name="b", quota={CapacityClass.SPOT: ClassQuota(guaranteed_gpus=4)}),
    }
)
# a borrows all of b's idle guarantee; b wants it back 900 s after a's last checkpoint.
JOBS = [
    TeamJob("a-big", "a", arrival_s=0, gpus=8, duration_s=10_000, priority=5),
    TeamJob("b-job", "b", arrival_s=4_500, gpus=4, duration_s=1_000, priority=5),
]


@pytest.mark.parametrize(
    ("mode", "lost_gpu_h", "b_wait_s", "preempted"),
    [
        pytest.param(Preemption.CHECKPOINT_FIRST, 8 * 6 / 3600, 6.0, 1, id="checkpoint-first"),
        pytest.param(Preemption.KILL, 8 * 900 / 3600, 0.0, 1, id="kill"),
        pytest.param(Preemption.NONE, 0.0, 10_000 - 4_500, 0, id="no-preemption"),
    ],
)
def test_the_owner_takes_its_guarantee_back(
    mode: Preemption, lost_gpu_h: float, b_wait_s: float, preempted: int
) -> None:
    outcome = simulate_teams(JOBS, TWO, mode, KNOBS)
    assert outcome.lost_gpu_hours == pytest.approx(lost_gpu_h)
    assert outcome.teams["a"].preempted == preempted
    assert outcome.all_wait_p95_s == pytest.approx(b_wait_s)
    assert outcome.finished == 2
    assert outcome.quota_violations == 0
    assert outcome.teams["a"].borrowed_gpu_hours > 0


def test_a_job_that_just_checkpointed_is_stopped_at_once() -> None:
    jobs = [JOBS[0], TeamJob("b-job", "b", arrival_s=3_603, gpus=4, duration_s=10, priority=5)]
    outcome = simulate_teams(jobs, TWO, Preemption.CHECKPOINT_FIRST, KNOBS)
    # 3 s since its checkpoint at 3600 s: cheaper to lose 3 s than to wait 6 s for another.
    assert outcome.lost_gpu_hours == pytest.approx(8 * 3 / 3600)
    assert outcome.all_wait_p95_s == 0.0


def test_a_job_larger_than_its_team_can_hold_never_runs() -> None:
    jobs = [TeamJob("huge", "b", arrival_s=0, gpus=5, duration_s=10, priority=5)]
    outcome = simulate_teams(jobs, TWO, Preemption.CHECKPOINT_FIRST, KNOBS)
    assert outcome.teams["b"].never == 1
    assert outcome.finished == 0


def test_the_check_catches_a_policy_that_breaks_the_guarantee(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sim, "place", lambda *_, **__: Wait("broken on purpose"))
    outcome = simulate_teams(JOBS, TWO, Preemption.CHECKPOINT_FIRST, KNOBS)
    assert outcome.quota_violations > 0
    assert outcome.finished == 0


def test_teams_and_priorities_are_drawn_from_the_job_id_the_same_way_every_time() -> None:
    trace = [TraceJob(str(n), float(n), 1, 60.0) for n in range(2_000)]
    first, again = assign_teams(trace, 5), assign_teams(trace, 5)
    assert first == again
    assert {job.team for job in first} == {f"team-{n}" for n in range(1, 6)}
    high = sum(job.priority == HIGH_PRIORITY for job in first) / len(first)
    assert 0.15 < high < 0.25


def test_the_cluster_is_split_into_guarantees_that_sum_to_it() -> None:
    teams = split_cluster(101, (3, 1), borrow=0.5)
    spot = [t.quota_in(CapacityClass.SPOT) for t in teams.teams.values()]
    assert sum(q.guaranteed_gpus for q in spot) == 101
    assert [q.borrow_gpus for q in spot] == [q.guaranteed_gpus // 2 for q in spot]


def test_the_command_prints_json_and_refuses_bad_input_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("".join(f"{n},{n * 60}.0,CLOS,1,{1 + n % 4},{600 + n}.0\n" for n in range(50)))
    args = ["--trace", str(trace), "--teams", "3", "--gpus", "12", "--json"]
    assert sim.main(args) == 0
    outcomes = json.loads(capsys.readouterr().out)
    assert [o["preemption"] for o in outcomes] == ["checkpoint-first", "kill", "none"]
    assert all(o["finished"] + sum(t["never"] for t in o["teams"].values()) == 50 for o in outcomes)
    for bad in (["--teams", "0"], ["--preemption", "gentle"], ["--limit", "-1"]):
        assert sim.main(["--trace", str(trace), *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("spotrain simulate teams: ")
        assert err.count("\n") == 1
    assert sim.main(["--trace", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv" in capsys.readouterr().err
