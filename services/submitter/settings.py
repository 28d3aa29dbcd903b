"""The submitter's settings, read from `SPOTRAIN_SUBMITTER_*`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, StringConstraints
from pydantic_settings import SettingsConfigDict

from shared.runtime import RuntimeSettings

NonEmpty = Annotated[str, StringConstraints(min_length=1, max_length=63)]


class SubmitterSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_SUBMITTER_", extra="ignore", frozen=True, populate_by_name=True
    )

    ray_address: str = Field(
        "http://127.0.0.1:8265",
        validation_alias=AliasChoices("SPOTRAIN_SUBMITTER_RAY_ADDRESS", "SPOTRAIN_RAY_ADDRESS"),
    )
    """The Ray dashboard's address, where the Job Submission API lives."""
    checkpoint_root: str = Field(
        default_factory=lambda: _home("checkpoints").as_uri(),
        validation_alias=AliasChoices(
            "SPOTRAIN_SUBMITTER_CHECKPOINT_ROOT", "SPOTRAIN_CHECKPOINT_ROOT"
        ),
    )
    """Where jobs checkpoint: a `file://` folder locally, `gs://bucket/prefix` on GKE."""
    workspace_cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".spotrain" / "workspaces"
    )
    max_gpus_per_job: int = Field(8, ge=0)
    max_gpus_per_owner: int = Field(16, ge=0)
    """GPUs one person's admitted jobs may hold at once; more of theirs wait in the queue."""
    max_waiting_per_owner: int = Field(1000, ge=0)
    """Jobs one person may have waiting for their quota (room for a sweep of 1,000)."""
    admission_view_max_age_s: float = Field(1.0, ge=0)
    """How old the job records may be that a burst of requests is admitted from."""
    teams_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("SPOTRAIN_SUBMITTER_TEAMS_FILE", "SPOTRAIN_TEAMS_FILE"),
    )
    """The teams file (TOML, shared/policy/teams.py); unset: no teams, per-owner limits only."""
    min_runtime_before_preemption_s: float = Field(
        300.0,
        ge=0,
        validation_alias=AliasChoices(
            "SPOTRAIN_SUBMITTER_MIN_RUNTIME_BEFORE_PREEMPTION_S",
            "SPOTRAIN_MIN_RUNTIME_BEFORE_PREEMPTION_S",
        ),
    )
    """No job gives way to other work (reclaim, priority) before its attempt ran this long."""
    give_way_grace_s: float = Field(120.0, gt=0)
    """How long a job asked to give way has to checkpoint and stop before Ray stops it."""
    short_of_workers_fallback_s: float = Field(300.0, gt=0)
    """An elastic attempt short of its MIN workers this long goes on as a new attempt from
    its latest checkpoint, where the checkpointer finds capacity."""
    secrets_dir: Path = Field(default_factory=lambda: _home("secrets"))
    """One file per secret that jobs may name with `--secret` (a mounted Secret on GKE)."""
    refused_records_max_age_s: float = Field(7 * 86_400.0, gt=0)
    """How long a refused request's record is kept (`spotrain show` finds it until then)."""
    driver_labels: dict[NonEmpty, NonEmpty] = Field(default_factory=dict)
    """The Ray node labels a multi-node job's driver runs on, as JSON (the chart's drivers
    group: `{"spotrain-role": "driver"}`). Empty: Ray keeps those drivers on the head,
    where Ray's job API is; a group of their own keeps job code away from it."""
    default_max_hours: float = Field(24.0, gt=0)
    """On a team with a budget, the hours a job without `--max-hours` is held to."""
    track_interval_s: float = Field(1.0, gt=0)
    max_concurrency: int = Field(8, ge=1)


def _home(folder: str) -> Path:
    return Path.home() / ".spotrain" / folder
