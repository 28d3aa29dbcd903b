"""One pass's decision as one pure call (`policy.decision.decide`), and the small rules that
fold what a pass saw and did into the scaler's memory."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scaler.model import Blocked, BlockedReason, NodeView
from services.scaler.policy import decision
from services.scaler.policy.decision import (
    ADVICE_EVERY_S,
    PLACED_GRACE_S,
    ScaleRequest,
    ScalerMemory,
    advice_due,
    decide,
    new_blocks,
    out_of_capacity,
    stocked_out,
    watch_idle,
)
from services.scaler.policy.keepalive import IDLE_PERIODS_KEPT, MIN_PERIODS, IdleHistory
from shared.policy.deadline import SpotAdvice
from shared.policy.pool_knowledge import observe
from tests.unit.test_scaler_policy import CONFIG, NOW, POOLS, SPOT, demand, node

LONGEST_S = 300.0


def blocked(job: str, reason: BlockedReason = BlockedReason.OVER_BUDGET) -> Blocked:
    return Blocked(job_id=job, attempt=1, reason=reason, detail="d")


@pytest.mark.parametrize(
    ("blocks", "reported", "pending", "said", "kept"),
    [
        pytest.param(["a"], set(), ["a"], ["a"], set(), id="new-is-said-and-remembered-once-said"),
        pytest.param(["a"], {"a"}, ["a"], [], {"a"}, id="said-once"),
        pytest.param([], {"a"}, ["a"], [], {"a"}, id="unblocked-still-remembered"),
        pytest.param([], {"a"}, [], [], set(), id="gone-is-forgotten"),
        pytest.param(["a", "b"], {"a"}, ["a", "b"], ["b"], {"a"}, id="only-the-new-one"),
    ],
)
def test_each_blocked_demand_is_said_once_while_it_is_pending(
    blocks: list[str], reported: set[str], pending: list[str], said: list[str], kept: set[str]
) -> None:
    keys = frozenset((job, 1, BlockedReason.OVER_BUDGET.value) for job in reported)
    to_report, remembered = new_blocks(
        [blocked(job) for job in blocks], keys, [demand(job) for job in pending]
    )
    assert [b.job_id for b in to_report] == said
    assert {key[0] for key in remembered} == kept


def test_what_was_said_is_remembered() -> None:
    said = [blocked("a"), blocked("a")]
    memory = decision.reported(ScalerMemory(), said)
    assert memory.reported_blocks == {("a", 1, BlockedReason.OVER_BUDGET.value)}
    to_report, _ = new_blocks(said, memory.reported_blocks, [demand("a")])
    assert to_report == ()


def test_settling_is_not_news() -> None:
    to_report, remembered = new_blocks(
        [blocked("a", BlockedReason.SETTLING)], frozenset(), [demand("a")]
    )
    assert to_report == ()
    assert remembered == frozenset()


def test_a_stock_out_leaves_the_pool_alone_until_the_retry_time() -> None:
    memory = stocked_out(ScalerMemory(), ["gpu-spot"], NOW, 300)
    assert out_of_capacity(memory, NOW + timedelta(seconds=299)) == {"gpu-spot"}
    assert out_of_capacity(memory, NOW + timedelta(seconds=300)) == frozenset()
    assert stocked_out(memory, [], NOW, 300) is memory, "nothing new: the same memory"


@pytest.mark.parametrize(
    ("read_s_ago", "due"),
    [(None, True), (0.0, False), (ADVICE_EVERY_S - 1, False), (ADVICE_EVERY_S, True)],
)
def test_the_forecast_is_asked_for_again_when_old(read_s_ago: float | None, due: bool) -> None:
    read_at = None if read_s_ago is None else NOW - timedelta(seconds=read_s_ago)
    assert advice_due(ScalerMemory(advice_read_at=read_at), NOW) is due


def test_an_idle_period_ends_when_work_comes_back() -> None:
    history = IdleHistory().went_idle(NOW).went_idle(NOW + timedelta(seconds=5))
    later = history.demand_came(NOW + timedelta(seconds=30), LONGEST_S)
    assert later.periods == (30.0,), "the oldest open period ends first"
    assert later.open_since == (NOW + timedelta(seconds=5),)
    expired = history.demand_came(NOW + timedelta(seconds=302), LONGEST_S)
    assert expired.periods == (None, 297.0), "past the longest timeout: no work came for it"
    assert IdleHistory().demand_came(NOW, LONGEST_S) == IdleHistory(), "none open: nothing"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 2 * LONGEST_S), max_size=40))
def test_every_period_kept_is_a_reuse_within_the_longest_timeout_or_none(
    gaps: list[float],
) -> None:
    history, at = IdleHistory(), NOW
    for gap in gaps:
        history = history.went_idle(at)
        at += timedelta(seconds=gap)
        history = history.demand_came(at, LONGEST_S)
    assert len(history.periods) <= IDLE_PERIODS_KEPT
    assert all(p is None or 0 <= p <= LONGEST_S for p in history.periods)
    assert len(history.periods) == len(gaps)
    assert history.open_since == ()


def idle_node(name: str, idle_s: float) -> NodeView:
    return node(name, SPOT, idle_s=idle_s)


@pytest.mark.parametrize(
    ("before_s_ago", "idle_s", "opened", "ended"),
    [
        pytest.param(None, 0.0, 0, 0, id="busy-and-was-busy"),
        pytest.param(None, 40.0, 1, 0, id="went-idle"),
        pytest.param(40.0, 42.0, 0, 0, id="still-idle-the-same-period"),
        pytest.param(40.0, 0.0, 0, 1, id="took-work"),
        pytest.param(60.0, 5.0, 1, 1, id="took-work-and-let-it-go-between-passes"),
    ],
)
def test_a_pass_reads_idle_periods_from_the_nodes(
    before_s_ago: float | None, idle_s: float, opened: int, ended: int
) -> None:
    before = {} if before_s_ago is None else {"s1": NOW - timedelta(seconds=before_s_ago)}
    opening = IdleHistory(open_since=tuple(before.values()))
    memory = ScalerMemory(idle={"gpu-spot": opening}, idle_nodes=before)
    idle, idle_nodes = watch_idle(memory, POOLS, [idle_node("s1", idle_s)], NOW, LONGEST_S)
    history = idle["gpu-spot"]
    assert len(history.periods) == ended
    assert len(history.open_since) == len(opening.open_since) - ended + opened
    assert ("s1" in idle_nodes) is (idle_s > 0)


@pytest.mark.parametrize(
    "going",
    [
        pytest.param({"draining": True}, id="draining-under-a-notice"),
        pytest.param({"ready": False}, id="out-of-ray-while-still-listed"),
    ],
)
def test_a_node_going_while_idle_is_no_work_coming_back(going: dict[str, object]) -> None:
    went = NOW - timedelta(seconds=40)
    memory = ScalerMemory(
        idle={"gpu-spot": IdleHistory(open_since=(went,))}, idle_nodes={"s1": went}
    )
    node = idle_node("s1", 0.0).model_copy(update=going)
    idle, idle_nodes = watch_idle(memory, POOLS, [node], NOW, LONGEST_S)
    assert idle["gpu-spot"].periods == ()
    assert idle["gpu-spot"].open_since == (went,)
    assert idle_nodes == {}


def test_a_node_gone_while_idle_leaves_its_period_open_for_the_next_work() -> None:
    went = NOW - timedelta(seconds=50)
    memory = ScalerMemory(
        idle={"gpu-spot": IdleHistory(open_since=(went,))}, idle_nodes={"s1": went}
    )
    idle, idle_nodes = watch_idle(memory, POOLS, [], NOW, LONGEST_S)
    assert idle["gpu-spot"].open_since == (went,)
    assert idle_nodes == {}
    grown = decide(
        ScaleRequest(
            pools=POOLS, config=CONFIG, at=NOW, nodes=(), demands=(demand(),), memory=memory
        )
    )
    assert grown.plan.target("gpu-spot") == 1
    assert grown.memory.idle["gpu-spot"].periods == (50.0,), "the launch was the work it missed"


def test_the_same_request_gives_the_same_reply() -> None:
    request = ScaleRequest(
        pools=POOLS,
        config=CONFIG,
        at=NOW,
        nodes=(idle_node("s1", 120.0),),
        demands=(demand("a", gpus=2), demand("b", gpus=4)),
        memory=ScalerMemory(advice={"gpu-spot": SpotAdvice(obtainability=0.9, uptime_h=1.0)}),
    )
    assert decide(request) == decide(request)


def test_the_reply_carries_the_plan_status_served_and_what_to_report() -> None:
    big = demand("big", gpus=16)
    reply = decide(
        ScaleRequest(
            pools=POOLS,
            config=CONFIG,
            at=NOW,
            nodes=(node("s1", SPOT),),
            demands=(demand("a"), big),
        )
    )
    assert reply.plan.in_room == ("a",)
    assert reply.memory.in_room == {"a"}
    assert [b.job_id for b in reply.to_report] == ["big"]
    assert reply.memory.reported_blocks == frozenset(), "remembered once said, not before"
    assert reply.status.blocked_jobs == 1
    assert reply.served == (), "a queued attempt's demand stays until it starts"


def reused_history(after_s: float) -> IdleHistory:
    return IdleHistory(periods=(after_s,) * MIN_PERIODS)


@pytest.mark.parametrize(
    ("learn", "after_s", "placed_s_ago", "released"),
    [
        pytest.param(True, 200.0, None, True, id="work-comes-back-after-a-boot-would-have"),
        pytest.param(True, 200.0, 10.0, False, id="placed-on-lately-its-work-not-in-ray-yet"),
        pytest.param(True, 200.0, PLACED_GRACE_S, True, id="placed-on-past-the-grace"),
        pytest.param(True, 5.0, None, False, id="work-comes-back-at-once"),
        pytest.param(False, 200.0, None, False, id="learning-off-keeps-the-configured"),
    ],
)
def test_the_idle_timeout_is_learnt_from_the_pools_periods(
    learn: bool, after_s: float, placed_s_ago: float | None, released: bool
) -> None:
    """A node a pass placed work on lately counts as busy, though: its work shows in Ray
    only some seconds after its job starts."""
    config = CONFIG.model_copy(update={"idle_timeout_s": LONGEST_S, "learn_idle_timeout": learn})
    memory = ScalerMemory(
        idle={"gpu-spot": reused_history(after_s)},
        idle_nodes={"s1": NOW - timedelta(seconds=30)},
        placed={} if placed_s_ago is None else {"s1": NOW - timedelta(seconds=placed_s_ago)},
    )
    reply = decide(
        ScaleRequest(
            pools=POOLS, config=config, at=NOW, nodes=(idle_node("s1", 30.0),), demands=(),
            memory=memory,
        )
    )  # fmt: skip
    assert ("s1" in reply.plan.release) is released


def test_learnt_losses_and_the_forecast_price_a_pool() -> None:
    record = observe(None, "gpu-spot", now=NOW, nodes=2)
    record = observe(record, "gpu-spot", now=NOW + timedelta(hours=5), nodes=2, taken_back=3)
    memory = ScalerMemory(knowledge={"gpu-spot": record})
    risk = decision.risk(POOLS, memory)
    assert set(risk) == {"gpu-spot"}
    assert risk["gpu-spot"] > 0
    advised = memory.model_copy(
        update={"advice": {"gpu-spot": SpotAdvice(obtainability=0.9, uptime_h=0.1)}}
    )
    assert decision.risk(POOLS, advised)["gpu-spot"] > risk["gpu-spot"]
    assert set(decision.outlooks(POOLS, memory, NOW)) == {"gpu-spot"}


def test_what_a_pass_saw_is_learnt_per_pool() -> None:
    memory = decision.learnt(
        ScalerMemory(),
        POOLS,
        nodes={"gpu-spot": 2},
        taken_back={"gpu-spot": 1},
        stocked_out=["gpu-od"],
        now=NOW,
        max_gap_s=6.0,
    )
    assert set(memory.knowledge) == {p.name for p in POOLS}
    assert memory.knowledge["gpu-spot"].taken_back == 1
    assert memory.knowledge["gpu-od"].stock_outs == 1
