"""`spotrain cost` answers bad input with one line and exit 2, before it reaches the bus."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import no_bus, spotrain

# `spotrain` itself, with the cost command registered if the app does not register it yet.


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--by", "colour"], "Invalid value for '--by'", id="bad-view"),
        pytest.param(
            ["--since", "yesterday"],
            "--since takes a duration back (30m, 2h) or an ISO time, not 'yesterday'",
            id="bad-since",
        ),
        pytest.param(["--since", "2999-01-01T00:00"], "is in the future", id="future-since"),
        pytest.param(
            ["--prices", "/no/such/prices.toml"], "cannot read the prices file", id="no-prices"
        ),
    ],
)
def test_a_bad_argument_gets_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = spotrain("cost", *args, env=no_bus())
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("spotrain: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_bad_prices_file_names_the_file_and_the_field(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text("[pool.gpu-spot]\nprice_per_hour_usd = -1\n")
    result = spotrain("cost", "--prices", str(prices), env=no_bus())
    assert result.returncode == 2
    assert f"{prices}: prices file: pool.gpu-spot.price_per_hour_usd" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_a_stack_it_says_to_start_it() -> None:
    result = spotrain("cost", env=no_bus())
    assert result.returncode == 1
    assert "the stack is not running" in result.stderr
    assert "Traceback" not in result.stderr
