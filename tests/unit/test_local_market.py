"""The local spot market: how a trace's count lets a pool grow and takes nodes back."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.localstack.market import (
    LocalMarket,
    check_market_pools,
    room_to_grow,
    to_preempt,
)
from shared.spot_traces import SpotMarketOption, SpotTrace, parse_spot_market

TINY = Path(__file__).parents[1] / "data" / "spot" / "tiny.json"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("available", "held", "room"), [(3, 1, 2), (1, 1, 0), (0, 2, 0), (2, 0, 2)]
)
def test_room_to_grow(available: int, held: int, room: int) -> None:
    assert room_to_grow(available, held) == room


@pytest.mark.parametrize(
    ("available", "held", "noticed", "expected"),
    [
        pytest.param(2, ["p-1", "p-2"], [], [], id="within-the-count"),
        pytest.param(1, ["p-1", "p-2", "p-10"], [], ["p-10", "p-2"], id="newest-first-by-number"),
        pytest.param(0, ["p-1", "p-2"], ["p-2"], ["p-1"], id="a-noticed-one-counts-already"),
        pytest.param(1, ["p-1", "p-2"], ["p-2"], [], id="enough-notices-out"),
    ],
)
def test_to_preempt(
    available: int, held: list[str], noticed: list[str], expected: list[str]
) -> None:
    assert to_preempt(available, held, noticed) == expected


def test_the_market_runs_its_trace_at_the_speedup_and_starts_over() -> None:
    trace = SpotTrace(name="t", gap_s=60, counts=(1, 1, 0, 2))
    market = LocalMarket("gpu-spot", trace, speedup=60, started_at=T0, notice_s=10)
    # One trace minute per wall second.
    seen = [market.available(T0 + timedelta(seconds=s)) for s in (0, 1.5, 2, 3, 4, 6)]
    assert seen == [1, 1, 0, 2, 1, 0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu-spot", "expected POOL=FILE[,SPEEDUP]"),
        ("gpu-spot=/no/such.json", "no trace file /no/such.json"),
        (f"gpu-spot={TINY},0", "the speed-up must be above 0, not 0"),
        (f"gpu-spot={TINY},fast", "the speed-up 'fast' is not a number"),
    ],
)
def test_a_bad_market_option_names_its_problem(value: str, message: str) -> None:
    with pytest.raises(ValueError, match="--spot-market") as raised:
        parse_spot_market(value)
    assert message in str(raised.value)


def test_an_unreadable_trace_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"metadata": {"gap_seconds": 0}, "data": [1]}))
    with pytest.raises(ValueError, match="gap_seconds"):
        parse_spot_market(f"gpu-spot={bad}")


def test_a_good_option_reads_its_trace() -> None:
    option = parse_spot_market(f"gpu-spot={TINY},120")
    assert option == SpotMarketOption("gpu-spot", TINY.resolve(), 120.0)


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        (["nope"], "--spot-market nope: no such pool (pools: cpu, gpu-on-demand, gpu-spot)"),
        (["gpu-on-demand"], "--spot-market gpu-on-demand: it is an on-demand pool, not a spot one"),
        (["gpu-spot", "gpu-spot"], "--spot-market gpu-spot: given twice"),
    ],
)
def test_a_market_is_for_a_spot_pool_of_the_pools_file(pools: list[str], message: str) -> None:
    with pytest.raises(ValueError, match="--spot-market") as raised:
        check_market_pools([SpotMarketOption(p, TINY) for p in pools])
    assert str(raised.value) == message
