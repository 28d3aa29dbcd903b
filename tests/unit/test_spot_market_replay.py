"""The trace replay on spot markets: stock-outs, nodes taken back, checkpoints kept, pools
in zones, deadlines and the `--spot-trace` option's bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.simulation.market import (
    SpotMarket,
    market_room,
    markets,
    parse_spot_trace_option,
)
from services.scaler.simulation.replay import main, parse_slack, simulate
from services.scaler.simulation.traces import SpotTrace, TraceJob, with_deadlines
from shared.events.types import CapacityClass

CONFIG = ScalerConfig(budget_per_hour_usd=1e6, idle_timeout_s=300.0, max_launch_per_pool=100)


def pool(name: str, capacity: CapacityClass = CapacityClass.SPOT, **kw: object) -> PoolSpec:
    fields: dict[str, object] = {
        "name": name,
        "capacity": capacity,
        "gpus": 1,
        "cpus": 1.0,
        "price_per_hour_usd": 1.0 if capacity is CapacityClass.SPOT else 3.0,
        "boot_time_s": 60.0,
        "max_nodes": 10,
    } | kw
    return PoolSpec.model_validate(fields, strict=False)


POOLS = [pool("spot-a", zone="a"), pool("od", CapacityClass.ON_DEMAND, zone="a")]


def market(
    counts: list[int], gap_s: int = 600, offset: int = 0
) -> dict[str, tuple[SpotTrace, int]]:
    return {"spot-a": (SpotTrace("m", gap_s, tuple(counts)), offset)}


def test_a_market_counts_changes_and_starts_over() -> None:
    """Its count follows the trace from the offset, tick by tick, and repeats past the end."""
    m = SpotMarket.of("p", SpotTrace("m", 100, (1, 1, 0, 2)), 1, start_s=1000.0)
    assert [m.count_at(1000.0 + 100 * i) for i in range(6)] == [1, 0, 2, 1, 1, 0]
    assert m.next_change_s(1000.0) == 1100.0
    assert m.next_change_s(1100.0) == 1200.0
    assert m.next_change_s(1250.0) == 1300.0  # back to the trace's first tick, a 1
    flat = SpotMarket.of("p", SpotTrace("m", 100, (3, 3)), 0, start_s=0.0)
    assert flat.next_change_s(0.0) == math.inf


def test_growth_past_the_count_is_a_stock_out_and_any_jobs_go_on_demand() -> None:
    """With no spot to be had, the launch fails, is counted, and the job runs on on-demand
    (the scaler stops asking the pool for the retry time; an `any` job falls back)."""
    result = simulate([TraceJob("a", 0.0, 1, 3600.0)], "spotrain", POOLS, CONFIG,
                      markets=market([0] * 10))  # fmt: skip
    assert result.stockouts >= 1
    assert result.jobs_unfinished == 0
    # On-demand at $3/h for the boot, the hour and the idle timeout.
    assert result.cost_usd == pytest.approx(3 * (60 + 3600 + 300) / 3600, rel=0.05)


# The job starts after the boot (60 s) and its node is taken back at 3600 s: 3540 s run.
@pytest.mark.parametrize(
    ("notice", "checkpoint_every_s", "lost_s"),
    [
        pytest.param(False, None, 3540.0, id="no-checkpoint-loses-all"),
        pytest.param(False, 1500.0, 3540.0 - 3000.0, id="keeps-work-to-the-last-checkpoint"),
        pytest.param(True, None, 0.0, id="a-notice-keeps-everything"),
    ],
)
def test_a_drop_takes_the_node_back_and_the_job_goes_on(
    notice: bool, checkpoint_every_s: float | None, lost_s: float
) -> None:
    """The market holds one node for an hour, then none: the node goes with its job, which
    resumes elsewhere from what it kept, and finishes."""
    counts = [1] * 6 + [0] * 60  # 10-minute ticks: an hour of spot
    result = simulate([TraceJob("a", 0.0, 1, 3 * 3600.0)], "spotrain", POOLS, CONFIG,
                      markets=market(counts), spot_notice=notice,
                      checkpoint_every_s=checkpoint_every_s)  # fmt: skip
    assert result.preempted_nodes == 1
    assert result.jobs_unfinished == 0
    assert result.lost_gpu_hours == pytest.approx(lost_s / 3600, abs=0.01)


def test_deadline_jobs_are_met_and_impossible_ones_refused() -> None:
    """A job whose deadline even on-demand from its arrival cannot meet is refused (runs
    without one); the others are met, on a market that runs dry half-way."""
    trace = [
        TraceJob("tight", 0.0, 1, 3600.0, deadline_s=3600.0 + 30),  # less than a boot to spare
        TraceJob("ok", 0.0, 1, 3600.0, deadline_s=2 * 3600.0),
        TraceJob("loose", 0.0, 1, 3600.0, deadline_s=6 * 3600.0),
    ]
    counts = [1] * 3 + [0] * 100
    for policy in ("spotrain", "uniform-progress"):
        result = simulate(trace, policy, POOLS, CONFIG, markets=market(counts),
                          checkpoint_every_s=600.0)  # fmt: skip
        assert (result.deadline_jobs, result.deadlines_refused) == (2, 1), policy
        assert result.deadline_misses == 0, policy
        assert result.jobs_unfinished == 0, policy


def test_with_deadlines_gives_a_share_of_jobs_a_slack() -> None:
    trace = [TraceJob(str(i), float(i), 1, 100.0) for i in range(300)]
    timed = with_deadlines(trace, 1 / 3, 1.2, 3.0, seed=1)
    chosen = [j for j in timed if j.deadline_s is not None]
    assert 70 < len(chosen) < 130
    assert all(1.2 <= (j.deadline_s - j.arrival_s) / j.duration_s <= 3.0 for j in chosen)  # type: ignore[operator]
    assert with_deadlines(trace, 1 / 3, 1.2, 3.0, seed=1) == timed


@pytest.mark.parametrize(
    ("value", "says"),
    [
        pytest.param("spot-a", "POOL=FILE", id="no-file"),
        pytest.param("spot-a=t.json@x", "not a tick", id="offset-not-a-number"),
    ],
)
def test_spot_trace_option_refuses_a_bad_form(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_spot_trace_option(value)


def test_spot_trace_option_reads_pool_file_and_offset() -> None:
    assert parse_spot_trace_option("p=a@b.json@12") == ("p", Path("a@b.json"), 12)
    assert parse_spot_trace_option("p=t.json") == ("p", Path("t.json"), 0)


def _trace_file(folder: Path) -> Path:
    path = folder / "zone.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 0, 2]}))
    return path


@pytest.mark.parametrize(
    ("option", "says"),
    [
        pytest.param("nope={file}", "no pool 'nope'", id="pool-not-defined"),
        pytest.param("od={file}", "not a spot pool", id="on-demand-pool"),
        pytest.param("spot-a={file}@3", "past the end", id="offset-past-the-end"),
        pytest.param("spot-a={folder}/missing.json", "missing.json", id="no-such-file"),
    ],
)
def test_markets_refuse_what_no_pool_or_trace_allows(
    tmp_path: Path, option: str, says: str
) -> None:
    value = option.format(file=_trace_file(tmp_path), folder=tmp_path)
    with pytest.raises((ValueError, OSError), match=says):
        markets([value], POOLS)


def test_simulate_refuses_a_bad_spot_trace_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("a,0,CLOS,1,1,600\n")
    code = main(["--trace", str(trace), "--spot-trace", f"a100-spot-9g={_trace_file(tmp_path)}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no pool 'a100-spot-9g'" in err
    assert err.count("\n") == 1


def test_simulate_reports_market_figures_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("".join(f"j{i},{i * 600},CLOS,1,1,3600\n" for i in range(12)))
    code = main([
        "--trace", str(jobs), "--policy", "spotrain,uniform-progress,naive", "--json",
        "--spot-trace", f"a100-spot-1g={_trace_file(tmp_path)}@1",
        "--deadline-slack", "1.5..3", "--deadline-share", "1", "--checkpoint-every-s", "600",
    ])  # fmt: skip
    assert code == 0
    figures = json.loads(capsys.readouterr().out)
    assert [f["policy"] for f in figures] == ["spotrain", "uniform-progress", "naive"]
    for f in figures:
        assert {"stockouts", "deadline_misses", "deadline_jobs", "lost_gpu_hours",
                "saving_vs_on_demand", "wait_p95_s"} <= f.keys()  # fmt: skip
        assert f["deadline_jobs"] + f["deadlines_refused"] == 12
        assert f["jobs_unfinished"] == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1.2..3", (1.2, 3.0)), ("2", (2.0, 2.0))],
)
def test_deadline_slack_reads_a_range(value: str, expected: tuple[float, float]) -> None:
    assert parse_slack(value) == expected


@pytest.mark.parametrize("value", ["0.5..2", "3..2", "fast"])
def test_deadline_slack_refuses_what_no_job_could_meet(value: str) -> None:
    with pytest.raises(ValueError, match="--deadline-slack"):
        parse_slack(value)


def test_the_most_the_markets_allowed() -> None:
    """Issue 37, 2: the yardstick of a market replay. One spot node for the first 10 minutes,
    none for the next 10, two after; a 2-GPU job over the first 30 minutes runs 1 GPU on spot
    for 10, none for 10, both for 10: 30 of its 60 GPU-minutes, priced 1 an hour on spot and
    3 on on-demand."""
    trace = SpotTrace("m", 600, (1, 0, 2))
    room = market_room([(0.0, 1800.0, 2)], [SpotMarket.of("spot-a", trace, 0, 0.0)], POOLS)
    assert room.work_gpu_s == 3600.0
    assert room.spot_gpu_s == 1800.0
    assert room.cost_usd == pytest.approx(0.5 * 1.0 + 0.5 * 3.0)
    assert room.on_demand_usd == pytest.approx(3.0)
    assert room.saving_possible == pytest.approx(1 - 2.0 / 3.0)


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=8),
    st.lists(
        st.tuples(st.integers(0, 3000), st.integers(1, 3000), st.integers(1, 4)),
        min_size=1,
        max_size=6,
    ),
)
def test_the_markets_never_allow_more_than_the_work_or_their_room(
    counts: list[int], jobs: list[tuple[int, int, int]]
) -> None:
    trace = SpotTrace("m", 600, tuple(counts))
    room = market_room(
        [(float(a), float(d), g) for a, d, g in jobs],
        [SpotMarket.of("spot-a", trace, 0, 0.0)],
        POOLS,
    )
    assert room.work_gpu_s == pytest.approx(sum(d * g for _, d, g in jobs))
    assert 0 <= room.spot_gpu_s <= room.work_gpu_s + 1e-6
    assert 0 <= room.saving_possible <= 1 - 1 / 3 + 1e-9
