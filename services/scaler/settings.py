"""The scaler's settings, read from `SPOTRAIN_SCALER_*`."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from shared.runtime import RuntimeSettings


class ScalerSettings(RuntimeSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTRAIN_SCALER_", extra="ignore", frozen=True)
