"""The submitter's settings, read from `SPOTRAIN_SUBMITTER_*`."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from shared.runtime import RuntimeSettings


class SubmitterSettings(RuntimeSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTRAIN_SUBMITTER_", extra="ignore", frozen=True)
