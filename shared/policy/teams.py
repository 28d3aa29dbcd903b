"""Teams: who belongs where, what each team is guaranteed, may borrow and may spend.

The teams file (`SPOTRAIN_TEAMS_FILE`, TOML) is read by the submitter, which admits jobs
under it, and by the simulator. One team per person; quotas per capacity class:

    [teams.vision]
    members = ["alice", "bob"]
    admins = ["alice"]
    monthly_budget_usd = 5000

    [teams.vision.quota.spot]
    guaranteed_gpus = 8
    borrow_gpus = 4

A bad file is refused whole, with one line naming the first fault: a service keeps the
last valid teams it had (services/submitter/adapters/teams_file.py). Pure: `shared.teams_file`
reads the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Annotated, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.events.types import CapacityClass, Frozen, Name

QUOTA_CLASSES = (CapacityClass.SPOT, CapacityClass.ON_DEMAND)
"""The classes a quota is kept in: an `any` job counts where its attempt runs."""


class TeamsError(ValueError):
    """A teams file that cannot be used; its message is one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ClassQuota(_Strict):
    """A team's GPUs in one capacity class."""

    guaranteed_gpus: Annotated[int, Field(ge=0, le=100_000)] = 0
    """Always the team's: work borrowed from it is reclaimed when the team needs it."""
    borrow_gpus: Annotated[int, Field(ge=0, le=100_000)] = 0
    """How many GPUs beyond its guarantee the team may borrow from others' idle quota."""

    @property
    def most_gpus(self) -> int:
        return self.guaranteed_gpus + self.borrow_gpus


class TeamSpec(_Strict):
    name: Name
    members: Annotated[tuple[Name, ...], Field(max_length=10_000)] = ()
    admins: Annotated[tuple[Name, ...], Field(max_length=1_000)] = ()
    """Members who may cancel any of the team's jobs."""
    monthly_budget_usd: Annotated[float, Field(ge=0)] | None = None
    """None: no money limit."""
    quota: Mapping[CapacityClass, ClassQuota] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _admins_are_members(self) -> Self:
        if CapacityClass.ANY in self.quota:
            msg = "a quota is kept per spot and on-demand; `any` jobs count where they run"
            raise ValueError(msg)
        strangers = sorted(set(self.admins) - set(self.members))
        if strangers:
            msg = f"admins must be members: {', '.join(strangers)} is not"
            raise ValueError(msg)
        return self

    def quota_in(self, capacity: CapacityClass) -> ClassQuota:
        return self.quota.get(quota_class(capacity), ClassQuota())


class Teams(_Strict):
    teams: Mapping[Name, TeamSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_team_each(self) -> Self:
        seen: dict[str, str] = {}
        for team in self.teams.values():
            for member in team.members:
                if member in seen:
                    msg = f"{member} is a member of two teams: {seen[member]} and {team.name}"
                    raise ValueError(msg)
                seen[member] = team.name
        return self

    def team_of(self, person: str) -> TeamSpec | None:
        for team in self.teams.values():
            if person in team.members:
                return team
        return None

    def guaranteed(self, capacity: CapacityClass) -> int:
        """All teams' guarantees in one class: the capacity the teams share."""
        return sum(team.quota_in(capacity).guaranteed_gpus for team in self.teams.values())


def quota_class(capacity: CapacityClass) -> CapacityClass:
    """Where a job's GPUs count: an `any` job starts on spot."""
    return CapacityClass.SPOT if capacity is CapacityClass.ANY else capacity


def parse_teams(text: str, *, source: str = "teams file") -> Teams:
    """The teams of a TOML text; TeamsError with one line on the first fault."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TeamsError(f"{source}: not TOML: {error}") from None
    unknown = sorted(set(raw) - {"teams"})
    if unknown:
        raise TeamsError(f"{source}: unknown section {unknown[0]!r} (only [teams.NAME])")
    tables = raw.get("teams", {})
    if not isinstance(tables, dict):
        raise TeamsError(f"{source}: `teams` must be tables, [teams.NAME]")
    teams = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise TeamsError(f"{source}: teams.{name} must be a table, [teams.{name}]")
        try:
            teams[name] = TeamSpec.model_validate({**table, "name": name}, strict=False)
        except ValidationError as error:
            raise TeamsError(f"{source}: teams.{name}: {_first_fault(error)}") from None
    try:
        return Teams(teams=teams)
    except ValidationError as error:
        raise TeamsError(f"{source}: {_first_fault(error)}") from None


def _first_fault(error: ValidationError) -> str:
    fault = error.errors()[0]
    where = ".".join(str(part) for part in fault["loc"])
    message = str(fault["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def teams_bucket(prefix: str) -> str:
    """The key-value bucket of team admission: `holds` (compare-and-set by every submitter
    replica) and `status` (what `spotrain teams` shows)."""
    return f"{prefix}-teams"


HOLDS_KEY = "holds"
STATUS_KEY = "status"


class TeamHold(Frozen):
    """The GPUs one admitted job holds against its team's quota, until it ends."""

    job_id: str
    team: Name
    owner: Name
    capacity: CapacityClass
    """The quota class it counts in (spot or on-demand)."""
    gpus: int
    priority: int
    borrowed: bool
    since: AwareDatetime
    worst_case_usd: float = 0.0
    """What it may cost at most (GPUs x price x max hours), reserved against its team's
    budget while it holds."""


class TeamHolds(Frozen):
    """Every job's hold, one value for all teams: borrowing weighs every team's use, so
    one compare-and-set on it admits consistently across submitter replicas."""

    holds: Mapping[str, TeamHold] = Field(default_factory=dict)


class TeamsStatus(Frozen):
    """What the submitter last knew of teams: the file it runs on, the holds, the jobs
    waiting for quota and what each team spent this month."""

    teams: Teams
    holds: TeamHolds
    waiting: Mapping[str, int] = Field(default_factory=dict)
    """Jobs waiting for quota, per team."""
    spent_usd: Mapping[str, float] = Field(default_factory=dict)
    at: AwareDatetime


class TeamUse(Frozen):
    """One team in one class, as `spotrain teams` shows it."""

    team: str
    capacity: CapacityClass
    members: int
    guaranteed_gpus: int
    borrow_gpus: int
    held_gpus: int
    borrowed_gpus: int
    """Held beyond the guarantee: taken back first when its lenders need it."""
    lent_gpus: int
    """Of its guarantee, what others hold while it leaves it idle."""
    waiting_jobs: int
    monthly_budget_usd: float | None
    spent_usd: float | None


def team_uses(status: TeamsStatus) -> list[TeamUse]:
    """Each team's use per class with a quota, from the submitter's status; its waiting
    jobs and spend on its first row. Pure."""
    rows = []
    first: set[str] = set()
    for cls in QUOTA_CLASSES:
        held: dict[str, int] = {}
        for hold in status.holds.holds.values():
            if quota_class(hold.capacity) is cls:
                held[hold.team] = held.get(hold.team, 0) + hold.gpus
        over = sum(
            max(held.get(name, 0) - team.quota_in(cls).guaranteed_gpus, 0)
            for name, team in status.teams.teams.items()
        )
        idle = {
            name: max(team.quota_in(cls).guaranteed_gpus - held.get(name, 0), 0)
            for name, team in status.teams.teams.items()
        }
        idle_total = sum(idle.values())
        for name, team in sorted(status.teams.teams.items()):
            quota = team.quota_in(cls)
            if not quota.most_gpus and not held.get(name):
                continue
            mine = held.get(name, 0)
            # What the borrowers hold came out of the idle guarantees; each lender's share
            # of it is in proportion to what it leaves idle.
            lent = round(over * idle[name] / idle_total) if idle_total else 0
            once = name not in first
            first.add(name)
            rows.append(
                TeamUse(
                    team=name,
                    capacity=cls,
                    members=len(team.members),
                    guaranteed_gpus=quota.guaranteed_gpus,
                    borrow_gpus=quota.borrow_gpus,
                    held_gpus=mine,
                    borrowed_gpus=max(mine - quota.guaranteed_gpus, 0),
                    lent_gpus=min(lent, idle[name]),
                    waiting_jobs=status.waiting.get(name, 0) if once else 0,
                    monthly_budget_usd=team.monthly_budget_usd if once else None,
                    spent_usd=status.spent_usd.get(name) if once else None,
                )
            )
    return rows


def membership_refusal(teams: Teams | None, person: str, team: str, *, admin: bool) -> str | None:
    """Why a credential for `person` in `team` would disagree with the teams file, the one
    source of membership the submitter reads; None when it agrees (or there is no file,
    and so no teams)."""
    if teams is None:
        return None
    found = teams.team_of(person)
    if found is None:
        return f"the teams file puts {person} in no team; add them to team {team} there first"
    if found.name != team:
        return f"the teams file puts {person} in team {found.name}, not {team}"
    if admin and person not in found.admins:
        return f"the teams file does not make {person} an admin of {team}; make them one there"
    return None
