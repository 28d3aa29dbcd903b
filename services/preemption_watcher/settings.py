"""The preemption_watcher's settings, read from `SPOTRAIN_PREEMPTION_WATCHER_*`."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from shared.runtime import RuntimeSettings


class PreemptionWatcherSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_PREEMPTION_WATCHER_", extra="ignore", frozen=True
    )
