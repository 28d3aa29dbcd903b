"""The scaler's settings, read from `SPOTRAIN_SCALER_*`."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import AliasChoices, Field, TypeAdapter
from pydantic_settings import SettingsConfigDict

from services.scaler.model import PoolSpec, ScalerConfig
from shared.runtime import RuntimeSettings


class ScalerSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_SCALER_", extra="ignore", frozen=True, populate_by_name=True
    )

    pools_file: Path | None = None
    """A TOML file of `[[pool]]` tables; the local default ships with the scaler."""
    budget_per_hour_usd: float = Field(50.0, ge=0)
    idle_timeout_s: float = Field(300.0, ge=0)
    any_fallback_after_s: float = Field(600.0, ge=0)
    settle_s: float = Field(20.0, ge=0)
    reconcile_interval_s: float = Field(2.0, gt=0)
    provider: str = Field("local", pattern="^(local)$")
    ray_gcs_address: str = Field(
        "127.0.0.1:6380",
        validation_alias=AliasChoices(
            "SPOTRAIN_SCALER_RAY_GCS_ADDRESS", "SPOTRAIN_RAY_GCS_ADDRESS"
        ),
    )
    local_home: Path = Field(
        default_factory=lambda: Path.home() / ".spotrain",
        validation_alias=AliasChoices("SPOTRAIN_SCALER_LOCAL_HOME", "SPOTRAIN_LOCAL_HOME"),
    )

    def pools(self) -> list[PoolSpec]:
        if self.pools_file is None:
            text = resources.files("services.scaler").joinpath("pools.local.toml").read_text()
        else:
            text = self.pools_file.read_text()
        return TypeAdapter(list[PoolSpec]).validate_python(
            tomllib.loads(text).get("pool", []), strict=False
        )

    def policy_config(self) -> ScalerConfig:
        return ScalerConfig(
            budget_per_hour_usd=self.budget_per_hour_usd,
            idle_timeout_s=self.idle_timeout_s,
            any_fallback_after_s=self.any_fallback_after_s,
            settle_s=self.settle_s,
        )
