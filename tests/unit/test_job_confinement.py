"""What job code may not see on a secure local stack (`shared.localstack.confinement`), and
the confining script's command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.localstack import confine
from shared.localstack.confinement import PRIVATE_FOLDERS, Confinement, jobs_confinement
from shared.localstack.settings import LocalStackSettings

USER = Path("/home/ann")
CODE = (Path("/srv/spotrain"), Path("/srv/spotrain/.venv"), Path("/usr/lib/python3"))


def view(home: Path, secrets: Path) -> Confinement:
    return jobs_confinement(
        LocalStackSettings(home=home), secrets_dir=secrets, user_home=USER, code=CODE
    )


@pytest.mark.parametrize(
    ("home", "secrets", "hidden_besides_the_homes_own"),
    [
        pytest.param(
            USER / ".spotrain", USER / ".spotrain" / "secrets", {USER / ".spotrain/secrets"},
            id="the-default-home: its own folders and the secrets, not the checkpoints",
        ),
        pytest.param(
            Path("/tmp/stack"), USER / ".spotrain" / "secrets", {USER / ".spotrain"},
            id="a-home-elsewhere: the user's whole ~/.spotrain, secrets within",
        ),
        pytest.param(
            Path("/tmp/stack"), Path("/etc/spotrain/secrets"),
            {USER / ".spotrain", Path("/etc/spotrain/secrets")},
            id="secrets-elsewhere",
        ),
        pytest.param(
            USER / ".spotrain" / "second", USER / ".spotrain" / "secrets",
            {USER / ".spotrain/secrets"},
            id="a-home-within-spotrain: ~/.spotrain stays open, the checkpoints are in it",
        ),
    ],
)  # fmt: skip
def test_what_job_code_may_not_see(
    home: Path, secrets: Path, hidden_besides_the_homes_own: set[Path]
) -> None:
    confinement = view(home, secrets)
    homes_own = {home / name for name in PRIVATE_FOLDERS}
    assert set(confinement.hidden) == homes_own | hidden_besides_the_homes_own
    assert confinement.writable == (home / "checkpoints",)
    needed = (home / "checkpoints", home / "ray-auth" / "token")
    assert not any(path.is_relative_to(h) for path in needed for h in confinement.hidden)


def test_the_code_is_read_only_once_each() -> None:
    confinement = view(Path("/tmp/stack"), USER / ".spotrain" / "secrets")
    assert set(confinement.read_only) == {Path("/srv/spotrain"), Path("/usr/lib/python3")}


def test_checkpoints_within_the_code_stay_writable() -> None:
    """A stack home inside the project: the project is read-only, its checkpoints are not."""
    confinement = view(Path("/srv/spotrain/.stack"), USER / ".spotrain" / "secrets")
    assert Path("/srv/spotrain") in confinement.read_only
    assert confinement.writable == (Path("/srv/spotrain/.stack/checkpoints"),)


def test_the_command_runs_the_script_in_a_namespace_of_its_own() -> None:
    confinement = Confinement(
        hidden=(Path("/a"),), read_only=(Path("/b"),), writable=(Path("/b/c"),)
    )
    argv = confinement.argv(["ray", "start", "--block"])
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert argv[6] == confine.__file__
    assert argv[7:] == [
        "--hide", "/a", "--read-only", "/b", "--writable", "/b/c", "--", "ray", "start",
        "--block",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["--hide", "/a", "ray"],
        ["--hide", "--", "ray"],
        ["--hide", "/a", "--"],
        ["--bogus", "/a", "--", "ray"],
    ],
)
def test_the_script_refuses_a_command_line_it_cannot_read(argv: list[str]) -> None:
    with pytest.raises(SystemExit, match=r"^confine: "):
        confine.main(argv)
