"""The teams file: what it holds, and each way it can be wrong refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.submitter.adapters.teams_file import TeamsFile
from shared.events.types import CapacityClass
from shared.policy.teams import (
    ClassQuota,
    Teams,
    TeamsError,
    membership_refusal,
    parse_teams,
)
from shared.teams_file import load_teams

GOOD = """
[teams.vision]
members = ["alice", "bob"]
admins = ["alice"]
monthly_budget_usd = 500

[teams.vision.quota.spot]
guaranteed_gpus = 8
borrow_gpus = 4

[teams.vision.quota.on-demand]
guaranteed_gpus = 2

[teams.nlp]
members = ["carol"]

[teams.nlp.quota.spot]
guaranteed_gpus = 4
"""


def test_a_good_file_gives_each_person_a_team_and_each_team_its_quotas() -> None:
    teams = parse_teams(GOOD)
    vision = teams.team_of("bob")
    assert vision is not None
    assert vision.name == "vision"
    assert vision.admins == ("alice",)
    assert vision.monthly_budget_usd == 500
    assert vision.quota_in(CapacityClass.SPOT) == ClassQuota(guaranteed_gpus=8, borrow_gpus=4)
    assert vision.quota_in(CapacityClass.SPOT).most_gpus == 12
    assert vision.quota_in(CapacityClass.ANY) == vision.quota_in(CapacityClass.SPOT)
    assert vision.quota_in(CapacityClass.ON_DEMAND).guaranteed_gpus == 2
    assert teams.guaranteed(CapacityClass.SPOT) == 12
    assert teams.guaranteed(CapacityClass.ON_DEMAND) == 2
    assert teams.team_of("mallory") is None
    nlp = teams.team_of("carol")
    assert nlp is not None
    assert nlp.monthly_budget_usd is None, "no budget: no money limit"
    assert nlp.quota_in(CapacityClass.ON_DEMAND) == ClassQuota(), "no quota there: none"


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        pytest.param("[teams", "not TOML", id="not-toml"),
        pytest.param(
            '[teams.a]\nmembers = ["x"]\n[teams.b]\nmembers = ["x"]',
            "x is a member of two teams: a and b",
            id="member-in-two-teams",
        ),
        pytest.param(
            "[teams.a.quota.spot]\nguaranteed_gpus = -1",
            "teams.a: quota.spot.guaranteed_gpus: Input should be greater than or equal to 0",
            id="negative-quota",
        ),
        pytest.param(
            "[teams.a.quota.spot]\nborrow_gpus = -2",
            "teams.a: quota.spot.borrow_gpus",
            id="negative-borrowing",
        ),
        pytest.param(
            "[teams.a]\nmonthly_budget_usd = -5",
            "teams.a: monthly_budget_usd",
            id="negative-budget",
        ),
        pytest.param(
            '[teams.a]\nmembers = ["x"]\nadmins = ["z"]',
            "admins must be members: z is not",
            id="admin-not-member",
        ),
        pytest.param(
            "[teams.a.quota.any]\nguaranteed_gpus = 1",
            "a quota is kept per spot and on-demand",
            id="quota-on-any",
        ),
        pytest.param(
            "[teams.a.quota.tpu]\nguaranteed_gpus = 1", "teams.a: quota.tpu", id="unknown-class"
        ),
        pytest.param("[teams.a]\ngpus = 1", "teams.a: gpus: Extra inputs", id="unknown-field"),
        pytest.param("quota = 1", "unknown section 'quota'", id="unknown-section"),
        pytest.param('[teams."two words"]', "teams.two words: name", id="bad-team-name"),
        pytest.param('[teams.a]\nmembers = ["a b"]', "teams.a: members.0", id="bad-member-name"),
        pytest.param("teams = 3", "`teams` must be tables", id="teams-not-tables"),
        pytest.param("[teams]\na = 3", "teams.a must be a table", id="team-not-a-table"),
    ],
)
def test_a_bad_teams_file_is_refused_with_one_line(text: str, fault: str) -> None:
    with pytest.raises(TeamsError) as caught:
        parse_teams(text, source="teams.toml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("teams.toml: ")
    assert fault in message


def test_a_missing_file_is_one_line_too(tmp_path: Path) -> None:
    with pytest.raises(TeamsError, match=r"teams.toml: cannot read it"):
        load_teams(tmp_path / "teams.toml")
    (tmp_path / "teams.toml").write_text(GOOD)
    assert set(load_teams(tmp_path / "teams.toml").teams) == {"vision", "nlp"}


def test_the_submitter_reads_an_edited_file_and_keeps_the_last_valid_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "teams.toml"
    path.write_text(GOOD)
    source = TeamsFile(path)
    assert source.current().team_of("carol") is not None
    path.write_text(GOOD.replace('members = ["carol"]', 'members = ["carol", "dan"]'))
    assert source.current().team_of("dan") is not None, "an edit takes effect"
    path.write_text(GOOD + '\n[teams.dup]\nmembers = ["alice"]\n')
    assert source.current().team_of("dan") is not None, "a bad edit is refused"
    path.unlink()
    assert source.current().team_of("dan") is not None, "so is a file that went away"


def test_a_submitter_does_not_start_on_a_bad_teams_file(tmp_path: Path) -> None:
    path = tmp_path / "teams.toml"
    path.write_text("[teams.a.quota.spot]\nguaranteed_gpus = -1\n")
    with pytest.raises(TeamsError, match="guaranteed_gpus"):
        TeamsFile(path)


MEMBERS = parse_teams(
    """
[teams.vision]
members = ["alice", "vera"]
admins = ["vera"]
"""
)


@pytest.mark.parametrize(
    ("teams", "person", "team", "admin", "says"),
    [
        pytest.param(MEMBERS, "alice", "vision", False, None, id="as-the-file-says"),
        pytest.param(MEMBERS, "vera", "vision", True, None, id="an-admin-as-the-file-says"),
        pytest.param(MEMBERS, "alice", "nlp", False, "in team vision, not nlp", id="another-team"),
        pytest.param(MEMBERS, "carol", "vision", False, "in no team", id="not-in-the-file"),
        pytest.param(MEMBERS, "alice", "vision", True, "not make alice an admin", id="not-admin"),
        pytest.param(None, "carol", "vision", True, None, id="no-teams-file"),
    ],
)
def test_a_credentials_team_agrees_with_the_teams_file(
    teams: Teams | None, person: str, team: str, admin: bool, says: str | None
) -> None:
    refusal = membership_refusal(teams, person, team, admin=admin)
    assert (refusal is None) if says is None else (says in (refusal or "")), refusal
