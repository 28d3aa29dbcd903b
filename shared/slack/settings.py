"""The Slack bot's settings, read from `SPOTRAIN_SLACK_*` (maps and lists as JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from shared.events.types import Name
from shared.runtime import RuntimeSettings
from shared.slack.model import Project, ProjectName, SlackUserId


class SlackSettings(RuntimeSettings):
    """`http_port` (from the runtime) serves `/metrics` and `/healthz`; `port` is where
    Slack sends the slash command."""

    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_SLACK_", extra="ignore", frozen=True, populate_by_name=True
    )

    signing_secret: Annotated[SecretStr, Field(min_length=1)]
    """The app's signing secret (Basic Information → App Credentials): every request from
    Slack is checked against it, with its timestamp."""
    bot_token: Annotated[SecretStr, Field(min_length=1)]
    """The bot's `xoxb-` token, for `chat.postMessage`."""
    owners: dict[SlackUserId, Name] = Field(default_factory=dict)
    """Slack user id → spotrain owner, e.g. `{"U024BE7LH": "alice"}`. Nobody else may act."""
    projects: dict[ProjectName, Project] = Field(default_factory=dict)
    """What `/train submit NAME` may run, e.g.
    `{"digits": {"entrypoint": ["python", "examples/train_digits.py"]}}`."""
    host: str = "127.0.0.1"
    """Where to listen for Slack's requests; `0.0.0.0` in a container."""
    port: int = Field(3000, ge=0, le=65535)
    path: str = Field("/slack/events", pattern=r"^/[A-Za-z0-9/_.-]*$")
    """The Request URL's path, as entered in the app's slash command settings."""
    command: str = Field("/train", pattern=r"^/[a-z0-9_-]{1,31}$")
    api_base_url: str = Field("https://slack.com/api/", pattern=r"^https?://.+/$")
    """Slack's Web API; tests point it at a local fake."""
    teams_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("SPOTRAIN_SLACK_TEAMS_FILE", "SPOTRAIN_TEAMS_FILE"),
    )
    """The platform's teams file, as the submitter's: its admins may cancel their team's
    jobs from Slack too. Read at start."""
    answer_within_s: float = Field(2.5, gt=0, lt=3)
    """How long a command may wait on the platform: Slack gives up after 3 s."""
