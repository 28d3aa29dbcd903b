"""Fair share between teams, pure: whether a job may hold its GPUs now, on its team's
guarantee or on GPUs borrowed from other teams' idle quota, and which running jobs give
way when a team takes its guarantee back or a higher priority job needs room.

The GPUs the teams share in a class are the sum of their guarantees there. A team holds up
to its guarantee as of right, and beyond it up to its borrowing limit while others leave
theirs idle; what it holds beyond its guarantee is borrowed, and is reclaimed first.
Victims are chosen so that the least work is lost: borrowed before guaranteed, lower
priority first, least work since the last checkpoint first, and never one that has run
less than the minimum runtime (a job that is stopped before its first checkpoint loses
everything, and one stopped again and again never finishes). The submitter admits under
this module, and bench/teams.py replays a trace under it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from shared.events.types import CapacityClass
from shared.policy.teams import Teams, TeamSpec, quota_class


class PreemptionCause(StrEnum):
    RECLAIMED = "reclaimed"
    """The owner team took back the guarantee that the victim had borrowed."""
    PRIORITY = "priority"
    """A higher priority job of the victim's own team needed the room."""


@dataclass(frozen=True, slots=True)
class Holding:
    """A job that holds GPUs now (queued on Ray or running)."""

    job_id: str
    team: str
    capacity: CapacityClass
    gpus: int
    priority: int
    borrowed: bool
    """Admitted beyond its team's guarantee: the first to give way to a reclaim."""
    ran_s: float = 0.0
    """How long its current attempt has run; 0 while it waits for a node."""
    since_checkpoint_s: float = 0.0
    """Work done since its last checkpoint: what a kill would lose."""


@dataclass(frozen=True, slots=True)
class Ask:
    """A job asking to hold GPUs."""

    team: str
    capacity: CapacityClass
    gpus: int
    priority: int


@dataclass(frozen=True, slots=True)
class Admit:
    borrowed: bool


@dataclass(frozen=True, slots=True)
class Preempt:
    """Admit once these have stopped (each after its checkpoint)."""

    victims: tuple[Holding, ...]
    cause: PreemptionCause
    borrowed: bool


@dataclass(frozen=True, slots=True)
class Wait:
    reason: str


@dataclass(frozen=True, slots=True)
class Never:
    reason: str


Placement = Admit | Preempt | Wait | Never


@dataclass(frozen=True, slots=True)
class ClassUse:
    """One team's GPUs in one class."""

    held: int
    guaranteed: int

    @property
    def borrowed(self) -> int:
        return max(self.held - self.guaranteed, 0)

    @property
    def idle(self) -> int:
        return max(self.guaranteed - self.held, 0)


def use_of(
    teams: Teams, holdings: Iterable[Holding], capacity: CapacityClass
) -> dict[str, ClassUse]:
    """Each team's GPUs held against its guarantee in one class."""
    cls = quota_class(capacity)
    held = dict.fromkeys(teams.teams, 0)
    for holding in holdings:
        if quota_class(holding.capacity) is cls and holding.team in held:
            held[holding.team] += holding.gpus
    return {
        name: ClassUse(held=held[name], guaranteed=team.quota_in(cls).guaranteed_gpus)
        for name, team in teams.teams.items()
    }


def place(
    ask: Ask,
    teams: Teams,
    holdings: Sequence[Holding],
    *,
    min_runtime_s: float,
) -> Placement:
    """Where a job stands: admitted (on its guarantee or borrowed), admitted once some
    jobs give way, waiting with the reason, or never (more than its team can ever hold)."""
    team = teams.teams.get(ask.team)
    if team is None:
        return Never(f"there is no team {ask.team}")
    cls = quota_class(ask.capacity)
    quota = team.quota_in(cls)
    if ask.gpus > quota.most_gpus:
        return Never(
            f"the job asks for {ask.gpus} {cls.value} GPUs; team {team.name} can hold at most "
            f"{quota.most_gpus} ({quota.guaranteed_gpus} guaranteed + {quota.borrow_gpus} "
            "borrowed)"
        )
    use = use_of(teams, holdings, cls)
    mine = use[team.name]
    shared = teams.guaranteed(cls)
    held_by_all = sum(u.held for u in use.values())
    after = mine.held + ask.gpus
    borrowed = after > mine.guaranteed
    over_limit = after - quota.most_gpus
    free = shared - held_by_all
    short = max(ask.gpus - free, 0)
    if over_limit <= 0 and short == 0:
        return Admit(borrowed=borrowed)
    if over_limit <= 0 and not borrowed:
        # Within its guarantee: what others borrowed of it is taken back.
        lent = [h for h in holdings if h.borrowed and h.team != team.name and _in(h, cls)]
        over = {name: u.borrowed for name, u in use.items() if name != team.name}
        victims = choose_victims(lent, short, min_runtime_s=min_runtime_s, at_most=over)
        if victims is not None:
            return Preempt(victims=victims, cause=PreemptionCause.RECLAIMED, borrowed=False)
    # The team's own lower priority work makes room, within the team's limit and the
    # teams' shared GPUs both.
    lower = [
        h for h in holdings if h.team == team.name and h.priority < ask.priority and _in(h, cls)
    ]
    victims = choose_victims(lower, max(short, over_limit), min_runtime_s=min_runtime_s)
    if victims is not None:
        after_victims = after - sum(v.gpus for v in victims)
        return Preempt(
            victims=victims,
            cause=PreemptionCause.PRIORITY,
            borrowed=after_victims > mine.guaranteed,
        )
    if over_limit > 0:
        return Wait(
            f"team {team.name} holds {mine.held} {cls.value} GPUs; with this job's {ask.gpus} "
            f"that is {after}, over its {quota.guaranteed_gpus} guaranteed + "
            f"{quota.borrow_gpus} it may borrow"
        )
    reason = f"{free} of the teams' {shared} {cls.value} GPUs are free; the job asks for {ask.gpus}"
    if not borrowed:
        reason += f" (what team {team.name} lent is on jobs within their minimum runtime)"
    return Wait(reason)


def _in(holding: Holding, cls: CapacityClass) -> bool:
    return quota_class(holding.capacity) is cls


def preemption_order(holding: Holding) -> tuple[bool, int, float, str]:
    """Borrowed first, lower priority first, least work since its checkpoint first."""
    return (not holding.borrowed, holding.priority, holding.since_checkpoint_s, holding.job_id)


def choose_victims(
    candidates: Iterable[Holding],
    gpus: int,
    *,
    min_runtime_s: float,
    at_most: Mapping[str, int] | None = None,
) -> tuple[Holding, ...] | None:
    """The jobs, in preemption order, that free `gpus`; None when even all that may be
    preempted would not. A job still waiting for its node (ran 0 s) gives way at once: it
    loses nothing. With `at_most`, a team gives up jobs only while it is still over what
    it may lose (a reclaim takes a team down to its guarantee, not below it: a job
    admitted as borrowed may sit within the guarantee since its team's others ended)."""
    left = dict(at_most) if at_most is not None else None
    taken: list[Holding] = []
    freed = 0
    for holding in sorted(candidates, key=preemption_order):
        if freed >= gpus:
            break
        if 0 < holding.ran_s < min_runtime_s:
            continue
        if left is not None:
            if left.get(holding.team, 0) <= 0:
                continue
            left[holding.team] -= holding.gpus
        taken.append(holding)
        freed += holding.gpus
    return tuple(taken) if freed >= gpus else None


def budget_refusal(
    team: TeamSpec, *, spent_usd: float, reserved_usd: float, worst_case_usd: float
) -> str | None:
    """Why a job's worst-case cost does not fit the team's monthly budget, with the sums;
    None when it fits (or the team has no budget)."""
    budget = team.monthly_budget_usd
    if budget is None:
        return None
    total = spent_usd + reserved_usd + worst_case_usd
    if total <= budget:
        return None
    return (
        f"team {team.name} spent ${spent_usd:,.2f} this month and its running jobs may "
        f"spend ${reserved_usd:,.2f} more; this job may cost ${worst_case_usd:,.2f}: "
        f"${total:,.2f} is over the budget of ${budget:,.2f}"
    )


def worst_case_usd(gpus: int, usd_per_gpu_hour: float, max_hours: float) -> float:
    """What a job may cost at most: its GPUs at its price for its longest run."""
    return gpus * usd_per_gpu_hour * max_hours
