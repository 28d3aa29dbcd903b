"""The CLI answers bad input with one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.localstack.ports import free_port
from tests.cli import spotrain


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--bogus"], "No such option: --bogus", id="unknown-flag"),
        pytest.param(["nonsense"], "No such command 'nonsense'", id="unknown-command"),
        pytest.param(
            ["schema", "--out"], "Option '--out' requires an argument", id="missing-value"
        ),
        pytest.param(
            ["submit", "x.py", "--gpus", "two"], "Invalid value for '--gpus'", id="bad-number"
        ),
        pytest.param(["preempt", "--notice", "soon"], "not a duration: 'soon'", id="bad-duration"),
        pytest.param(["preempt"], "name a node, or pass --random", id="no-node"),
        pytest.param(
            ["submit", "echo", "--within", "1h", "--estimate", "2h"],
            "refused: the job needs 2h00m at its estimate, but only 1h00m remain until",
            id="deadline-shorter-than-the-estimate",
        ),
        pytest.param(
            ["submit", "echo", "--deadline", "2020-01-01T00:00+00:00"],
            "refused: the deadline 2020-01-01 00:00 UTC has passed",
            id="deadline-past",
        ),
        pytest.param(
            ["submit", "echo", "--deadline", "tomorrow"],
            "--deadline takes an ISO time (2026-12-02T09:00), not 'tomorrow'",
            id="deadline-unreadable",
        ),
        pytest.param(
            ["submit", "echo", "--deadline", "2030-01-01T00:00+00:00", "--within", "1h"],
            "choose one of --deadline, --within",
            id="deadline-twice",
        ),
        pytest.param(["submit", "echo", "--estimate", "soon"], "not a duration", id="estimate"),
        pytest.param(
            ["submit", "echo", "--workers", "0"],
            "--workers 0: a job has at least one worker",
            id="workers-0",
        ),
        pytest.param(
            ["submit", "echo", "--workers", "5..3"],
            "--workers 5..3: MAX (3) is below MIN (5)",
            id="workers-backwards",
        ),
        pytest.param(
            ["submit", "echo", "--workers", "two"],
            "--workers takes N or MIN..MAX (2..4), not 'two'",
            id="workers-unreadable",
        ),
        pytest.param(
            ["submit", "train_digits.py", "--workdir", "examples", "--workers", "2..4"],
            "--workers 2..4 needs a Ray Train script (a .py file of the working directory "
            "that imports ray.train); train_digits.py is not one",
            id="workers-range-of-a-plain-script",
        ),
        pytest.param(
            ["submit", "train_digits.py", "--workdir", "examples", "--sweep", "dropout=0.1"],
            "--sweep dropout is neither a submit option",
            id="sweep-key-the-script-does-not-take",
        ),
        pytest.param(
            ["submit", "train_digits.py", "--workdir", "examples", "--sweep", "lr="],
            "--sweep lr: give its values, none empty",
            id="sweep-empty-values",
        ),
        pytest.param(
            [
                *("submit", "train_digits.py", "--workdir", "examples"),
                *("--sweep", "lr=" + ",".join(map(str, range(50)))),
                *("--sweep", "seed=" + ",".join(map(str, range(30)))),
            ],
            "the sweep has 1500 points (50 x 30); the most one sweep may have is 1000",
            id="sweep-past-its-limit",
        ),
        pytest.param(
            ["submit", "train_digits.py", "--workdir", "examples", "--sweep", "lr=1,2", "--wait"],
            "--sweep names its jobs and is followed with watch --experiment",
            id="sweep-with-wait",
        ),
        pytest.param(
            ["up", "--spot-market", "nope=tests/data/spot/tiny.json"],
            "--spot-market nope: no such pool",
            id="market-of-no-pool",
        ),
        pytest.param(
            ["up", "--spot-market", "gpu-spot=tests/data/spot/tiny.json,0"],
            "the speed-up must be above 0",
            id="market-speedup-0",
        ),
        pytest.param(
            ["up", "--spot-market", "gpu-spot=nowhere.json"],
            "no trace file nowhere.json",
            id="market-without-its-trace",
        ),
    ],
)
def test_a_bad_argument_gets_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = spotrain(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("spotrain: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_the_demo_without_a_stack_says_to_start_it() -> None:
    result = spotrain("demo", env={"SPOTRAIN_NATS_URL": f"nats://127.0.0.1:{free_port()}"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"spotrain: error: the stack is not running (no NATS at "
        f"{result.stderr.split('no NATS at ')[1].split(')')[0]}); start it: spotrain up"
    ]


def test_status_of_a_stack_that_is_not_up_exits_1(tmp_path: Path) -> None:
    result = spotrain("status", env={"SPOTRAIN_LOCAL_HOME": str(tmp_path)})
    assert result.returncode == 1
    assert "stopped" in result.stdout
    assert "Traceback" not in result.stderr
    as_json = spotrain("status", "-o", "json", env={"SPOTRAIN_LOCAL_HOME": str(tmp_path)})
    assert as_json.returncode == 1
    components = json.loads(as_json.stdout)
    assert {c["component"] for c in components} >= {"nats", "submitter", "scaler"}
    assert {c["state"] for c in components} == {"stopped"}
    assert set(components[0]) == {"component", "state", "leads", "pid", "endpoint"}
    assert {c["leads"] for c in components} == {None}, "nothing runs, nobody leads"


def test_schema_writes_the_event_documents(tmp_path: Path) -> None:
    result = spotrain("schema", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "asyncapi.json").exists()
    assert (tmp_path / "schemas" / "spotrain.job.requested.v1.json").exists()


def test_the_cli_does_not_import_ray() -> None:
    """The CLI must answer in well under a second; importing Ray alone takes half of one."""
    probe = "import sys; import shared.cli.app, shared.cli.demo; print('ray' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_simulate_replays_a_trace_and_prints_json(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("job-a,0,CLOS,2,2,3600\njob-b,10,CLOS,8,8,600\n")
    result = spotrain("simulate", "--trace", str(trace), "--policy", "spotrain,naive", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert [f["policy"] for f in figures] == ["spotrain", "naive"]
    for f in figures:
        assert {"cost_usd", "cost_over_lower_bound", "utilisation", "wait_p95_s"} <= f.keys()
        assert f["cost_over_lower_bound"] >= 1.0


def test_simulate_says_which_file_is_missing() -> None:
    result = spotrain("simulate", "--trace", "no-such-trace.csv")
    assert result.returncode == 2
    assert "no-such-trace.csv" in result.stderr
    assert "Traceback" not in result.stderr


def _spot_trace(folder: Path, data: list[int], gap_s: int = 600) -> Path:
    path = folder / "us-west-2a_v100_1.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap_s}, "data": data}))
    return path


def test_simulate_deadline_prints_each_policy_as_json(tmp_path: Path) -> None:
    """The head-to-head of the paper: one line of JSON, a list of {policy, cost, met}."""
    trace = _spot_trace(tmp_path, [1, 1, 0, 0, 1, 1, 1, 0] * 6)
    result = spotrain(
        "simulate", "deadline", "--spot-trace", str(trace), "--hours", "2", "--deadline", "4",
        "--start-tick", "3", "--policy", "spotrain,uniform-progress,on-demand,optimal", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)
    assert [o["policy"] for o in outcomes] == ["spotrain", "uniform-progress", "on-demand",
                                               "optimal"]  # fmt: skip
    assert all(o["met_deadline"] for o in outcomes)
    cost = {o["policy"]: o["cost_od_hours"] for o in outcomes}
    assert cost["on-demand"] == pytest.approx(2.2)  # the work and one start, all on-demand
    assert cost["optimal"] <= min(cost.values())


@pytest.mark.parametrize(
    ("content", "args", "says"),
    [
        pytest.param("[1, 0]", (), "expected an object", id="not-the-documented-json"),
        pytest.param("{nope", (), "not JSON", id="not-json"),
        pytest.param(
            '{"metadata": {"gap_seconds": 600}, "data": [1, -1]}', (), "data[1]", id="bad-count"
        ),
        pytest.param(None, ("--start-tick", "99"), "past the end", id="offset-past-the-end"),
        pytest.param(None, ("--deadline", "1.5"), "shorter than the work", id="deadline-too-short"),
        pytest.param(None, ("--deadline", "40"), "less than the deadline", id="trace-too-short"),
        pytest.param(None, ("--policy", "cheapest"), "unknown policy", id="unknown-policy"),
        pytest.param(None, ("--hours", "two"), "invalid float", id="not-a-number"),
    ],
)
def test_simulate_deadline_refuses_bad_input_in_one_line(
    tmp_path: Path, content: str | None, args: tuple[str, ...], says: str
) -> None:
    trace = _spot_trace(tmp_path, [1, 0] * 20)
    if content is not None:
        trace.write_text(content)
    defaults = {"--hours": "2", "--deadline": "4"}
    given = dict(zip(args[::2], args[1::2], strict=True))
    options = [part for key, value in (defaults | given).items() for part in (key, value)]
    result = spotrain("simulate", "deadline", "--spot-trace", str(trace), *options)
    assert result.returncode == 2
    assert says in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""


def _knowledge(folder: Path, windows_h: list[float]) -> Path:
    path = folder / "learnt.json"
    record = {
        "pool": "gpu-spot",
        "watched_since": "2026-12-01T00:00:00Z",
        "seen_until": "2026-12-03T00:00:00Z",
        "windows_h": windows_h,
    }
    path.write_text(
        json.dumps({"updated_at": "2026-12-03T00:00:00Z", "pools": {"gpu-spot": record}})
    )
    return path


def test_simulate_deadline_starts_from_what_the_platform_learnt(tmp_path: Path) -> None:
    """The same job and market, with what `spotrain pools --learnt` wrote of two pools: one
    whose windows have lasted, one whose have not. Only the first is worth spot."""
    trace = _spot_trace(tmp_path, [1] * 40)
    costs = []
    for windows_h in ([5.0] * 9, [0.1] * 100):
        knowledge = _knowledge(tmp_path, windows_h)
        result = spotrain(
            "simulate", "deadline", "--spot-trace", str(trace), "--hours", "2", "--deadline",
            "2.4", "--overhead", "0.1", "--start-tick", "5", "--policy", "spotrain",
            "--learnt", "gpu-spot", "--knowledge", str(knowledge), "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        [outcome] = json.loads(result.stdout)
        assert outcome["met_deadline"]
        costs.append(outcome["cost_od_hours"])
    assert costs[0] == pytest.approx(0.3 * 2.1), "on spot throughout"
    assert costs[1] == pytest.approx(2.1), "on on-demand throughout"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(("--learnt", "gpu-nowhere"), "knows no such pool (pools: gpu-spot)",
                     id="unknown-pool"),
        pytest.param(("--knowledge", "{file}"), "--knowledge needs --learnt POOL",
                     id="knowledge-without-a-pool"),
        pytest.param(("--learnt", "gpu-spot", "--knowledge", "{trace}"),
                     "not what `spotrain pools --learnt` writes", id="not-knowledge"),
        pytest.param(("--learnt", "gpu-spot", "--knowledge", "{missing}"), "No such file",
                     id="missing-file"),
    ],
)  # fmt: skip
def test_simulate_deadline_refuses_bad_knowledge_in_one_line(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    trace = _spot_trace(tmp_path, [1, 0] * 20)
    files = {"file": _knowledge(tmp_path, [1.0]), "trace": trace, "missing": tmp_path / "no"}
    options = [a.format(**files) for a in args]
    if "--knowledge" not in options:
        options += ["--knowledge", str(files["file"])]
    result = spotrain(
        "simulate", "deadline", "--spot-trace", str(trace), "--hours", "2", "--deadline", "4",
        *options,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
