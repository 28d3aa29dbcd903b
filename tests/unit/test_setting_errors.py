"""A wrong setting is one line naming the variable, for the CLI and for every service."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.localstack.settings import LocalStackSettings, isolated_stack
from shared.setting_errors import is_settings_error, setting_error_line


def test_a_settings_error_names_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTRAIN_LOCAL_NATS_PORT", "99999")
    with pytest.raises(ValidationError) as raised:
        LocalStackSettings()
    assert is_settings_error(raised.value)
    assert setting_error_line(raised.value) == (
        "SPOTRAIN_LOCAL_NATS_PORT='99999': Input should be less than 65536"
    )


@pytest.mark.parametrize(
    ("argv", "variable", "value"),
    [
        pytest.param(
            ["-c", "from shared.cli.entry import main; main()", "status"],
            "SPOTRAIN_LOCAL_NATS_PORT",
            "99999",
            id="cli",
        ),
        pytest.param(
            ["-m", "services.submitter"], "SPOTRAIN_SUBMITTER_TRACK_INTERVAL_S", "-1", id="service"
        ),
        pytest.param(["-m", "services.scaler"], "SPOTRAIN_NATS_URL", "", id="bus-setting"),
    ],
)
def test_a_wrong_setting_is_one_line_and_exit_2(argv: list[str], variable: str, value: str) -> None:
    done = subprocess.run(
        [sys.executable, *argv],
        env={**os.environ, variable: value},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert variable in line, line


def test_a_stack_s_settings_pass_to_another_process_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = isolated_stack(tmp_path / "stack")
    for name, value in settings.environment().items():
        monkeypatch.setenv(name, value)
    assert LocalStackSettings() == settings
    assert settings.environment()["SPOTRAIN_NATS_URL"] == settings.nats_url
