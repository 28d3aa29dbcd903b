"""The checkpointer's settings, read from `SPOTRAIN_CHECKPOINTER_*`."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from shared.runtime import RuntimeSettings


class CheckpointerSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_CHECKPOINTER_", extra="ignore", frozen=True
    )
