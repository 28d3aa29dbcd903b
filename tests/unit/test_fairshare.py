"""Fair share between teams: admission on a guarantee or borrowed, reclaim and priority
preemption with checkpoint-aware victims, and budgets with their arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events.types import CapacityClass
from shared.policy.fairshare import (
    Admit,
    Ask,
    Holding,
    Never,
    Preempt,
    PreemptionCause,
    Wait,
    budget_refusal,
    choose_victims,
    place,
    use_of,
    worst_case_usd,
)
from shared.policy.teams import ClassQuota, Teams, TeamSpec

SPOT = CapacityClass.SPOT
MIN_RUNTIME_S = 600.0


def team(name: str, guaranteed: int, borrow: int = 0, budget: float | None = None) -> TeamSpec:
    return TeamSpec(
        name=name,
        members=(f"{name}-person",),
        monthly_budget_usd=budget,
        quota={SPOT: ClassQuota(guaranteed_gpus=guaranteed, borrow_gpus=borrow)},
    )


TEAMS = Teams(teams={"a": team("a", 8, borrow=8), "b": team("b", 8, borrow=4)})


def held(
    job_id: str,
    team: str,
    gpus: int,
    *,
    borrowed: bool = False,
    priority: int = 5,
    ran_s: float = 3600.0,
    since_checkpoint_s: float = 60.0,
) -> Holding:
    return Holding(
        job_id=job_id,
        team=team,
        capacity=SPOT,
        gpus=gpus,
        priority=priority,
        borrowed=borrowed,
        ran_s=ran_s,
        since_checkpoint_s=since_checkpoint_s,
    )


def ask(team: str, gpus: int, priority: int = 5) -> Ask:
    return Ask(team=team, capacity=CapacityClass.ANY, gpus=gpus, priority=priority)


@pytest.mark.parametrize(
    ("holdings", "request_", "expected"),
    [
        pytest.param([], ask("a", 4), Admit(borrowed=False), id="within-guarantee"),
        pytest.param([], ask("a", 8), Admit(borrowed=False), id="all-of-the-guarantee"),
        pytest.param([], ask("a", 12), Admit(borrowed=True), id="borrows-idle-quota"),
        pytest.param(
            [held("a1", "a", 8)], ask("a", 4), Admit(borrowed=True), id="beyond-own-borrows"
        ),
        pytest.param(
            [held("a1", "a", 8), held("a2", "a", 8, borrowed=True)],
            ask("a", 2),
            Wait(
                "team a holds 16 spot GPUs; with this job's 2 that is 18, over its 8 "
                "guaranteed + 8 it may borrow"
            ),
            id="over-borrowing-limit-waits",
        ),
        pytest.param(
            [held("b1", "b", 6)],
            ask("a", 12),
            Wait("10 of the teams' 16 spot GPUs are free; the job asks for 12"),
            id="borrowing-needs-idle-quota",
        ),
        pytest.param([], ask("a", 17), Never(""), id="more-than-team-can-ever-hold"),
        pytest.param([], ask("nobody", 1), Never("there is no team nobody"), id="no-team"),
    ],
)
def test_admission_on_guarantee_or_borrowed(
    holdings: list[Holding], request_: Ask, expected: Admit | Wait | Never
) -> None:
    decision = place(request_, TEAMS, holdings, min_runtime_s=MIN_RUNTIME_S)
    if isinstance(expected, Never) and not expected.reason:
        assert isinstance(decision, Never)
        assert decision.reason == (
            "the job asks for 17 spot GPUs; team a can hold at most 16 (8 guaranteed + 8 borrowed)"
        )
        return
    assert decision == expected


def test_the_owner_team_takes_back_what_was_borrowed_least_work_lost_first() -> None:
    holdings = [
        held("a1", "a", 8),
        held("a2", "a", 4, borrowed=True, since_checkpoint_s=900),
        held("a3", "a", 4, borrowed=True, since_checkpoint_s=30),
    ]
    decision = place(ask("b", 4), TEAMS, holdings, min_runtime_s=MIN_RUNTIME_S)
    assert decision == Preempt(
        victims=(holdings[2],), cause=PreemptionCause.RECLAIMED, borrowed=False
    ), "the borrowed job with the least work since its checkpoint"


def test_a_job_within_its_minimum_runtime_is_not_reclaimed_yet() -> None:
    young = held("a2", "a", 8, borrowed=True, ran_s=60)
    decision = place(ask("b", 4), TEAMS, [held("a1", "a", 8), young], min_runtime_s=MIN_RUNTIME_S)
    assert isinstance(decision, Wait)
    assert "minimum runtime" in decision.reason


def test_a_job_still_waiting_for_its_node_gives_way_at_once() -> None:
    waiting = held("a2", "a", 8, borrowed=True, ran_s=0)
    decision = place(ask("b", 4), TEAMS, [held("a1", "a", 8), waiting], min_runtime_s=1e9)
    assert decision == Preempt(victims=(waiting,), cause=PreemptionCause.RECLAIMED, borrowed=False)


def test_a_higher_priority_job_preempts_its_own_teams_lower_priority_work() -> None:
    holdings = [
        held("a1", "a", 8, priority=0),
        held("b1", "b", 4, priority=1),
        held("b2", "b", 4, priority=7),
    ]
    decision = place(ask("b", 4, priority=9), TEAMS, holdings, min_runtime_s=MIN_RUNTIME_S)
    # b holds its 8 guaranteed and a holds its own: b's own lowest-priority job yields, and
    # the new job then sits within b's guarantee. a's lower priority is not b's to take.
    assert decision == Preempt(
        victims=(holdings[1],), cause=PreemptionCause.PRIORITY, borrowed=False
    )


def test_equal_priority_never_preempts() -> None:
    holdings = [held("a1", "a", 8), held("b1", "b", 8)]
    assert isinstance(place(ask("b", 4), TEAMS, holdings, min_runtime_s=0), Wait)


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        pytest.param(1, ("cheap",), id="one-victim"),
        pytest.param(5, ("cheap", "dear"), id="two-victims"),
        pytest.param(9, ("cheap", "dear", "guaranteed"), id="guaranteed-last"),
        pytest.param(13, None, id="not-enough"),
    ],
)
def test_victims_in_preemption_order(gpus: int, expected: tuple[str, ...] | None) -> None:
    candidates = [
        held("guaranteed", "a", 4, borrowed=False, priority=0, since_checkpoint_s=1),
        held("dear", "a", 4, borrowed=True, priority=3, since_checkpoint_s=5000),
        held("cheap", "a", 4, borrowed=True, priority=3, since_checkpoint_s=10),
        held("young", "a", 4, borrowed=True, priority=0, ran_s=5),
    ]
    victims = choose_victims(candidates, gpus, min_runtime_s=MIN_RUNTIME_S)
    assert (None if victims is None else tuple(v.job_id for v in victims)) == expected


def test_budget_refusal_shows_the_arithmetic() -> None:
    rich, poor = team("rich", 8), team("poor", 8, budget=100.0)
    assert budget_refusal(rich, spent_usd=1e9, reserved_usd=0, worst_case_usd=1) is None
    assert budget_refusal(poor, spent_usd=40, reserved_usd=20, worst_case_usd=40) is None
    assert budget_refusal(poor, spent_usd=40, reserved_usd=20, worst_case_usd=40.01) == (
        "team poor spent $40.00 this month and its running jobs may spend $20.00 more; "
        "this job may cost $40.01: $100.01 is over the budget of $100.00"
    )
    assert worst_case_usd(4, 2.5, 10) == 100.0


# --- the invariant, over any sequence of asks and ends -------------------------------------

team_names = st.sampled_from(["a", "b", "c"])
steps = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), team_names, st.integers(1, 12), st.integers(0, 9)),
        st.tuples(st.just("end"), st.integers(0, 30), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps)
def test_no_team_ever_holds_more_than_it_may_and_the_teams_never_more_than_they_share(
    steps: list[tuple[str, str | int, int, int]],
) -> None:
    teams = Teams(
        teams={"a": team("a", 8, borrow=8), "b": team("b", 4, borrow=4), "c": team("c", 4)}
    )
    holdings: list[Holding] = []
    for n, (kind, who, gpus, priority) in enumerate(steps):
        if kind == "end":
            if holdings:
                holdings.pop(int(who) % len(holdings))
            continue
        decision = place(
            Ask(team=str(who), capacity=SPOT, gpus=gpus, priority=priority),
            teams,
            holdings,
            min_runtime_s=MIN_RUNTIME_S,
        )
        if isinstance(decision, Preempt):
            gone = {v.job_id for v in decision.victims}
            assert all(v.ran_s == 0 or v.ran_s >= MIN_RUNTIME_S for v in decision.victims)
            if decision.cause is PreemptionCause.RECLAIMED:
                assert all(v.borrowed and v.team != who for v in decision.victims)
            else:
                assert all(v.team == who and v.priority < priority for v in decision.victims)
            holdings = [h for h in holdings if h.job_id not in gone]
            decision = Admit(borrowed=decision.borrowed)
        if isinstance(decision, Admit):
            holdings.append(
                Holding(
                    job_id=f"j{n}",
                    team=str(who),
                    capacity=SPOT,
                    gpus=gpus,
                    priority=priority,
                    borrowed=decision.borrowed,
                    ran_s=float(n * 100),
                )
            )
        use = use_of(teams, holdings, SPOT)
        assert sum(u.held for u in use.values()) <= teams.guaranteed(SPOT)
        for name, spec in teams.teams.items():
            assert use[name].held <= spec.quota_in(SPOT).most_gpus
            unflagged = sum(h.gpus for h in holdings if h.team == name and not h.borrowed)
            assert unflagged <= spec.quota_in(SPOT).guaranteed_gpus, "guaranteed work fits"


@settings(max_examples=200, deadline=None)
@given(
    lenders=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    gpus=st.integers(1, 8),
)
def test_a_team_within_its_guarantee_always_gets_it_back(lenders: list[int], gpus: int) -> None:
    """Whatever the others borrowed of b's guarantee, b asking within it is admitted, at
    once or once borrowed work (all past its minimum runtime) gives way."""
    teams = Teams(teams={"a": team("a", 0, borrow=100), "b": team("b", 8)})
    holdings: list[Holding] = []
    for n, size in enumerate(lenders):
        decision = place(ask("a", size), teams, holdings, min_runtime_s=0)
        if isinstance(decision, Admit):
            holdings.append(held(f"a{n}", "a", size, borrowed=decision.borrowed))
    decision = place(ask("b", gpus), teams, holdings, min_runtime_s=MIN_RUNTIME_S)
    assert isinstance(decision, Admit | Preempt)
    if isinstance(decision, Preempt):
        assert decision.cause is PreemptionCause.RECLAIMED
        freed = sum(v.gpus for v in decision.victims)
        free = 8 - sum(h.gpus for h in holdings)
        assert freed >= gpus - free


def test_a_high_priority_job_over_its_teams_limit_makes_room_in_its_own_team() -> None:
    """The team holds all it may (8 + 8 borrowed): its lower-priority work gives way so
    the urgent job fits the team's limit, though GPUs are free elsewhere."""
    teams = Teams(teams={"a": team("a", 8, borrow=8), "b": team("b", 16)})
    holdings = [held("a1", "a", 8, priority=5), held("a2", "a", 8, borrowed=True, priority=1)]
    decision = place(ask("a", 4, priority=9), teams, holdings, min_runtime_s=MIN_RUNTIME_S)
    assert decision == Preempt(
        victims=(holdings[1],), cause=PreemptionCause.PRIORITY, borrowed=True
    )
    same = place(ask("a", 4, priority=1), teams, holdings, min_runtime_s=MIN_RUNTIME_S)
    assert isinstance(same, Wait)
    assert "over its 8 guaranteed + 8 it may borrow" in same.reason
