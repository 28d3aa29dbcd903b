"""The plan of `spotrain demo --market` against a market trace, and its figures. Pure."""

from __future__ import annotations

from datetime import timedelta

from shared.cli.market_demo import (
    SLACK_AT_STOCK_OUT_S,
    STEP_S,
    WORK_LEFT_AT_STOCK_OUT_S,
    capacity_moves,
    plan_ride,
)
from shared.events.data import JobRequested
from shared.events.types import CapacityClass
from shared.jobs import Attempt, AttemptState, JobRecord, JobState
from shared.localstack.market import LocalMarket, market_retry_s, next_stock_out
from shared.spot_traces import SpotTrace
from tests.events import NOW


def market(counts: list[int], *, speedup: float = 20) -> LocalMarket:
    trace = SpotTrace(name="t", gap_s=60, counts=tuple(counts))
    return LocalMarket(pool="gpu-spot", trace=trace, speedup=speedup, started_at=NOW, notice_s=10)


def test_the_next_stock_out_is_where_the_count_drops_to_zero_and_where_it_comes_back() -> None:
    at = market([1] * 30 + [0] * 10 + [1] * 150)
    found = next_stock_out(at, NOW, within_s=600)
    assert found is not None
    # A trace minute is 3 s at x20.
    assert found.dry_from == NOW + timedelta(seconds=90)
    assert found.wet_from == NOW + timedelta(seconds=120)


def test_a_stock_out_already_begun_is_not_the_next_one() -> None:
    at = market([1] * 10 + [0] * 10 + [1] * 20 + [0] * 5 + [1] * 20)
    found = next_stock_out(at, NOW + timedelta(seconds=35), within_s=600)
    assert found is not None
    assert found.dry_from == NOW + timedelta(seconds=120)
    assert next_stock_out(market([1] * 50), NOW, within_s=600) is None
    assert next_stock_out(market([0] * 50), NOW, within_s=600) is None, "never had a node"


def test_the_ride_reaches_the_stock_out_with_its_work_left_and_its_slack() -> None:
    plan = plan_ride(market([1] * 30 + [0] * 10 + [1] * 150), NOW)
    assert plan is not None
    # On spot from about 10 s after submission to the drop at 90 s.
    assert plan.work_s == WORK_LEFT_AT_STOCK_OUT_S + 80
    assert plan.steps * STEP_S == plan.work_s
    assert plan.deadline == plan.stock_out.dry_from + timedelta(
        seconds=WORK_LEFT_AT_STOCK_OUT_S + SLACK_AT_STOCK_OUT_S
    )


def test_no_ride_on_a_stock_out_too_long_to_come_back_from() -> None:
    assert plan_ride(market([1] * 30 + [0] * 40 + [1] * 150), NOW) is None


def test_capacity_moves_count_changes_of_class_between_attempts() -> None:
    def attempt(number: int, pool: str | None) -> Attempt:
        return Attempt(
            number=number,
            submission_id=f"j-{number}",
            state=AttemptState.LOST,
            submitted_at=NOW,
            pool=pool,
        )

    request = JobRequested(job_id="j", owner="o", entrypoint=("python", "t.py"))
    record = JobRecord(
        request=request,
        request_event_id="e",
        state=JobState.SUCCEEDED,
        accepted_at=NOW,
        updated_at=NOW,
        attempts=(
            attempt(1, "s"),
            attempt(2, "od"),
            attempt(3, None),
            attempt(4, "s2"),
            attempt(5, "s"),
        ),
    )
    pools = {"s": CapacityClass.SPOT, "s2": CapacityClass.SPOT, "od": CapacityClass.ON_DEMAND}
    assert capacity_moves(record, pools) == 2


def test_a_scaler_waits_after_a_stock_out_in_its_markets_time() -> None:
    assert market_retry_s(300, {}) == 300
    fast = {"a": market([1], speedup=20), "b": market([1], speedup=4)}
    assert market_retry_s(300, fast) == 15
    assert market_retry_s(300, {"a": market([1], speedup=10_000)}) == 1.0
