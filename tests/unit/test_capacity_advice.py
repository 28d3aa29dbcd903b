"""The cloud's forecast of a spot pool (issue 36, 5): blended with what was learnt into the
deadline policy's outlook and the packing's risk, read by the scaler every few minutes
from the provider that gives it, shown by `spotrain pools`; the local stack's equivalent
read off its market trace."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scaler.handlers import reconcile
from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.policy import preemption_risk
from services.scaler.policy.decision import ADVICE_EVERY_S
from services.scaler.policy.packing import ADVICE_NODE_HOURS, RISK_PRIOR_NODE_HOURS
from services.scaler.settings import ScalerSettings
from services.scaler.simulation.deadline import DeadlineJob, Spotrain, forecast, run_online
from shared.events.types import CapacityClass
from shared.localstack.market import LocalMarket
from shared.policy.deadline import SpotAdvice, SpotOutlook, advised
from shared.spot_traces import SpotTrace
from tests.events import NOW
from tests.fakes.clock import FixedClock
from tests.fakes.scaler import FakeCluster, RecordingStatusBoard, scaler_deps

LEARNT = SpotOutlook(seen_h=48.0, productive_share=0.5, mean_window_h=2.0)


@pytest.mark.parametrize(
    ("advice", "window_h"),
    [
        pytest.param(None, 2.0, id="no-advice-as-learnt"),
        pytest.param(SpotAdvice(obtainability=0.9), 2.0, id="no-uptime-as-learnt"),
        pytest.param(SpotAdvice(obtainability=0.9, uptime_h=1.0), 2.0, id="an-hour-below-learnt"),
        pytest.param(SpotAdvice(obtainability=0.9, uptime_h=3.0), 3.0, id="a-floor-above-learnt"),
        pytest.param(SpotAdvice(obtainability=0.5, uptime_h=1 / 6), 1 / 6, id="short-a-ceiling"),
    ],
)
def test_advice_in_the_outlook(advice: SpotAdvice | None, window_h: float) -> None:
    blended = advised(LEARNT, advice)
    assert blended.mean_window_h == pytest.approx(window_h)
    assert blended.productive_share == LEARNT.productive_share


@given(
    st.floats(min_value=0.01, max_value=100),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0.01, max_value=10),
)
def test_advice_moves_the_window_only_towards_what_it_says(
    learnt_h: float, obtainability: float, uptime_h: float
) -> None:
    outlook = LEARNT.model_copy(update={"mean_window_h": learnt_h})
    blended = advised(outlook, SpotAdvice(obtainability=obtainability, uptime_h=uptime_h))
    assert min(learnt_h, uptime_h) <= blended.mean_window_h <= max(learnt_h, uptime_h)


def test_a_short_advised_uptime_raises_a_pools_risk_and_a_long_one_lowers_it() -> None:
    seen = preemption_risk(taken_back=2, node_hours=10.0, restart_cost_h=0.1)
    short = preemption_risk(2, 10.0, 0.1, uptime_h=1 / 6)
    long = preemption_risk(2, 10.0, 0.1, uptime_h=100.0)
    assert short > seen > long
    # Never seen: the advice alone, one take-back per advised hour.
    alone = preemption_risk(0, 0.0, 0.1, uptime_h=1.0)
    assert alone == pytest.approx(
        ADVICE_NODE_HOURS / (RISK_PRIOR_NODE_HOURS + ADVICE_NODE_HOURS) * 0.1
    )


def test_the_local_markets_advice_is_read_off_its_trace() -> None:
    """Two nodes for 30 min of trace (x1 speed), then none: one more node is obtainable now
    and not once a second is held; the window now ends within the hour (10 min)."""
    trace = SpotTrace(name="t", gap_s=600, counts=(2, 2, 2, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3))
    market = LocalMarket(pool="gpu-spot", trace=trace, speedup=1.0, started_at=NOW, notice_s=10.0)
    now = market.advice(NOW, held=1)
    assert now.obtainability == 1.0
    assert now.uptime_h == pytest.approx(1 / 6)
    assert market.advice(NOW, held=2).obtainability == 0.0
    later = market.advice(NOW + timedelta(hours=1), held=0)
    assert (later.obtainability, later.uptime_h) == (1.0, 1.0)


SPOT = PoolSpec(
    name="gpu-spot", capacity=CapacityClass.SPOT, gpus=2, cpus=4, price_per_hour_usd=1.0
)
ON_DEMAND = SPOT.model_copy(
    update={"name": "gpu-od", "capacity": CapacityClass.ON_DEMAND, "price_per_hour_usd": 3.0}
)


class Advisor:
    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.failing = False
        self.uptime_h = 1.0

    async def advice(self, pools: Sequence[PoolSpec]) -> dict[str, SpotAdvice]:
        self.asked.append([pool.name for pool in pools])
        if self.failing:
            msg = "compute.googleapis.com: 503"
            raise OSError(msg)
        return {"gpu-spot": SpotAdvice(obtainability=0.8, uptime_h=self.uptime_h)}


async def test_the_scaler_reads_the_advice_every_few_minutes_and_shows_it() -> None:
    clock = FixedClock(NOW)
    cluster = FakeCluster(clock)
    advisor = Advisor()
    board = RecordingStatusBoard()
    config = ScalerConfig(budget_per_hour_usd=10, idle_timeout_s=600, settle_s=0)
    deps = scaler_deps(clock, cluster, (SPOT, ON_DEMAND), config, status=board, advisor=advisor)
    await reconcile(deps)
    await reconcile(deps)
    assert advisor.asked == [["gpu-spot"]], "spot pools only, once per interval"
    assert board.latest is not None
    shown = {p.pool: p.advice for p in board.latest.pools}
    assert shown == {"gpu-spot": SpotAdvice(obtainability=0.8, uptime_h=1.0), "gpu-od": None}
    advisor.failing = True
    clock.advance(timedelta(seconds=ADVICE_EVERY_S))
    await reconcile(deps)
    assert len(advisor.asked) == 2
    assert deps.memory.advice["gpu-spot"].uptime_h == 1.0, "a failed read keeps the last advice"


@pytest.mark.parametrize(
    ("counts", "accuracy", "uptime_h", "obtainability"),
    [
        pytest.param((1,) * 8, 1.0, 1.0, 1.0, id="spot-stays-the-hour"),
        pytest.param((1, 1, 1, 0, 1, 1, 1, 1), 1.0, 1 / 6, 1.0, id="spot-goes-within-it"),
        pytest.param((1,) * 8, 0.0, 1 / 6, 1.0, id="wrong-says-the-other"),
        pytest.param((0,) * 8, 1.0, 1 / 6, 0.0, id="no-spot-now"),
    ],
)
def test_the_modelled_advice_of_the_deadline_simulation(
    counts: tuple[int, ...], accuracy: float, uptime_h: float, obtainability: float
) -> None:
    """The advice `spotrain-forecast` is told, from the trace's next hour (ticks of 10 min)."""
    trace = SpotTrace(name="t", gap_s=600, counts=counts)
    advice = forecast(trace, 0, random.Random(0), accuracy)  # noqa: S311
    assert advice.uptime_h == pytest.approx(uptime_h)
    assert advice.obtainability == obtainability


def test_told_short_windows_the_deadline_policy_stops_chasing_them() -> None:
    """Behind its reserve, a job takes spot only if a window pays for its restart. Spot
    comes and goes every 10 minutes: told the advice (10 minutes, always right here) it
    keeps to on-demand while behind, as it does untold once it has seen one window end
    (the gate on a window's age, `deadline._spot_gate_h`): each loses spot once, no more."""
    trace = SpotTrace(name="t", gap_s=600, counts=(1, 0) * 200)
    job = DeadlineJob(work_h=10.0, deadline_h=11.0, overhead_h=0.2, spot_price_ratio=0.3)
    plain = run_online(Spotrain(job), trace, 0, job, history_h=0.0)
    told = run_online(
        Spotrain(job),
        trace,
        0,
        job,
        history_h=0.0,
        advice=lambda tick: forecast(trace, tick, random.Random(0), accuracy=1.0),  # noqa: S311
    )
    assert plain.met_deadline
    assert told.met_deadline
    assert told.preemptions == plain.preemptions == 1
    assert told.cost_od_hours <= plain.cost_od_hours


@pytest.mark.parametrize(
    ("provider", "setting", "reads"),
    [
        pytest.param("gke", None, True, id="gke-on-by-default"),
        pytest.param("local", None, False, id="local-oracle-off-by-default"),
        pytest.param("local", True, True, id="local-when-asked"),
        pytest.param("gke", False, False, id="gke-turned-off"),
    ],
)
def test_who_reads_the_advice(provider: str, setting: bool | None, reads: bool) -> None:
    settings = ScalerSettings.model_construct(provider=provider, capacity_advice=setting)
    assert settings.reads_advice() is reads
