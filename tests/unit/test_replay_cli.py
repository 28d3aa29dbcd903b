"""`spotrain events` answers bad arguments and an unreachable bus with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import no_bus, spotrain


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["events", "export"], "Missing option '--since'", id="export-no-since"),
        pytest.param(
            ["events", "export", "--since", "soon"],
            "--since takes a duration back (90s, 10m, 2h, 1d) or an ISO time, not 'soon'",
            id="export-bad-since",
        ),
        pytest.param(
            ["events", "export", "--since", "1h", "--until", "2h"],
            "--until 2h is not after --since 1h",
            id="export-empty-window",
        ),
        pytest.param(
            ["events", "export", "--since", "1h", "--type", "job.bogus"],
            "no event type 'job.bogus'; known: ",
            id="export-unknown-type",
        ),
        pytest.param(
            ["events", "tail", "--since", "2999-01-01T00:00:00Z"],
            "--since 2999-01-01T00:00:00Z is in the future",
            id="tail-future",
        ),
        pytest.param(
            ["events", "tail", "--job", "job-1", "--type", "node.lost"],
            "--job follows job events; --type names none",
            id="tail-job-without-job-events",
        ),
        pytest.param(
            ["events", "tail", "-o", "yaml"], "'yaml' is not one of", id="tail-unknown-output"
        ),
        pytest.param(
            ["events", "import", "no-such.jsonl"], "cannot read no-such.jsonl", id="import-missing"
        ),
        pytest.param(
            ["events", "replay", "--since", "1h"], "Missing option '--to'", id="replay-no-to"
        ),
        pytest.param(
            ["events", "replay", "--since", "1h", "--to", "sub mitter"],
            "--to takes a service's name, not 'sub mitter'",
            id="replay-bad-service",
        ),
        pytest.param(
            ["events", "what-if", "--since", "1h", "--pools", "no-such.toml"],
            "no pools file no-such.toml",
            id="what-if-no-pools",
        ),
    ],
)
def test_a_bad_argument_gets_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = spotrain(*args, env=no_bus())
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("spotrain: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["events", "export", "--since", "1h"], id="export"),
        pytest.param(["events", "replay", "--since", "1h", "--to", "submitter"], id="replay"),
        pytest.param(["events", "tail"], id="tail"),
    ],
)
def test_no_bus_is_one_line_and_exit_1(args: list[str]) -> None:
    env = no_bus()
    result = spotrain(*args, env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"spotrain: error: the stack is not running (no NATS at {env['SPOTRAIN_NATS_URL']}); "
        "start it: spotrain up"
    ]


def test_an_import_of_only_bad_lines_names_each_and_publishes_nothing(tmp_path: Path) -> None:
    """No valid line: nothing to publish, so no bus is needed to say so."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"specversion": "1.0"}\n\nnot json\n')
    result = spotrain("events", "import", str(bad), env=no_bus())
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"{bad}: line 1: not-an-event: ")
    assert lines[1].startswith(f"{bad}: line 3: not-json: ")
    assert len(lines) == 2
    assert (
        result.stdout.strip()
        == "imported 0 events: 0 stored, 0 already on the stream; 2 lines rejected"
    )
