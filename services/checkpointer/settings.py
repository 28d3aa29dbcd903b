"""The checkpointer's settings, read from `SPOTRAIN_CHECKPOINTER_*`."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from services.checkpointer.model import MoveConfig, RecoveryConfig
from shared.runtime import RuntimeSettings


class CheckpointerSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_CHECKPOINTER_", extra="ignore", frozen=True, populate_by_name=True
    )

    ray_gcs_address: str = Field(
        "127.0.0.1:6380",
        validation_alias=AliasChoices(
            "SPOTRAIN_CHECKPOINTER_RAY_GCS_ADDRESS", "SPOTRAIN_RAY_GCS_ADDRESS"
        ),
    )
    fallback_after_interruptions: int = Field(2, ge=1)
    """An `any` job that lost its capacity this many times moves to on-demand capacity."""
    min_notice_s: float = Field(2.0, ge=0)
    move_review_interval_s: float = Field(5.0, gt=0)
    """How often running deadline jobs are reviewed for a move between spot and on-demand."""
    move_checkpoint_wait_s: float = Field(30.0, ge=0)
    """How long a move waits for the attempt to checkpoint and stop before it stops it."""
    restart_overhead_s: float = Field(60.0, ge=0)
    """A restart's cost in time, for the deadline policy, until a job's own resumes say."""

    def recovery_config(self) -> RecoveryConfig:
        return RecoveryConfig(
            fallback_after_interruptions=self.fallback_after_interruptions,
            min_notice_s=self.min_notice_s,
        )

    def move_config(self) -> MoveConfig:
        return MoveConfig(
            review_interval_s=self.move_review_interval_s,
            checkpoint_wait_s=self.move_checkpoint_wait_s,
            restart_overhead_s=self.restart_overhead_s,
        )
