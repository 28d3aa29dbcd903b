"""The Slack bot's settings come from SPOTRAIN_SLACK_*, maps as JSON; missing secrets
stop it with one line, not a traceback."""

from __future__ import annotations

import json

import pytest

from shared.slack.__main__ import main
from shared.slack.settings import SlackSettings


def test_settings_read_the_owner_map_and_projects_as_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPOTRAIN_SLACK_SIGNING_SECRET", "s3cret")
    monkeypatch.setenv("SPOTRAIN_SLACK_BOT_TOKEN", "xoxb-1")
    monkeypatch.setenv("SPOTRAIN_SLACK_OWNERS", json.dumps({"UALICE001": "alice"}))
    monkeypatch.setenv(
        "SPOTRAIN_SLACK_PROJECTS",
        json.dumps({"digits": {"entrypoint": ["python", "train.py"], "env": {"A": "1"}}}),
    )
    monkeypatch.setenv("SPOTRAIN_SLACK_PORT", "3100")

    settings = SlackSettings()

    assert settings.owners == {"UALICE001": "alice"}
    assert settings.projects["digits"].entrypoint == ("python", "train.py")
    assert settings.port == 3100
    assert "s3cret" not in repr(settings), "secrets stay out of logs and reprs"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("SPOTRAIN_SLACK_OWNERS", '{"alice": "alice"}', id="owner-key-not-a-user-id"),
        pytest.param("SPOTRAIN_SLACK_OWNERS", '{"UALICE001": "a b"}', id="owner-not-a-name"),
        pytest.param("SPOTRAIN_SLACK_PROJECTS", '{"x": {"entrypoint": []}}', id="no-entrypoint"),
        pytest.param("SPOTRAIN_SLACK_ANSWER_WITHIN_S", "5", id="slower-than-slack-waits"),
    ],
)
def test_settings_refuse_what_cannot_work(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("SPOTRAIN_SLACK_SIGNING_SECRET", "s3cret")
    monkeypatch.setenv("SPOTRAIN_SLACK_BOT_TOKEN", "xoxb-1")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name.removeprefix("SPOTRAIN_SLACK_").lower()):
        SlackSettings()


def test_the_bot_without_its_secrets_says_which_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SPOTRAIN_SLACK_SIGNING_SECRET", raising=False)
    monkeypatch.delenv("SPOTRAIN_SLACK_BOT_TOKEN", raising=False)
    monkeypatch.setenv("SPOTRAIN_SLACK_SIGNING_SECRET", "")

    with pytest.raises(SystemExit) as exited:
        main()

    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "spotrain slack bot: invalid or missing settings: "
        "SPOTRAIN_SLACK_SIGNING_SECRET, SPOTRAIN_SLACK_BOT_TOKEN\n"
    )
