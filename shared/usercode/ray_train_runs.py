"""What the platform reads of a Ray Train run that reports nothing to it: the step of each
`ray.train.report` (from the metrics the script reports anyway) and the step of the run's
latest checkpoint (from Ray Train's own snapshot in the run's folder). Pure but for
`latest_checkpoint_step`, which reads that snapshot through the checkpoint store."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from shared.checkpoints import CheckpointStorage

STEP_KEYS: Final = ("step", "global_step", "iteration", "epoch", "training_iteration")
"""The metric a script's report names its step by, in this order: the first one present."""
SNAPSHOT_NAME: Final = "checkpoint_manager_snapshot.json"
"""Ray Train's record of a run's checkpoints, in the run's folder (Ray 2.60)."""


def step_of(metrics: Mapping[str, Any]) -> int | None:
    """The step a report's metrics say it is at; None when they name none."""
    for key in STEP_KEYS:
        value = metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return int(value)
    return None


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers among a report's metrics (Ray Train adds its own, not numbers)."""
    return {
        name: float(value)
        for name, value in metrics.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and not name.startswith("_")
    }


def snapshot_step(raw: bytes) -> int | None:
    """The step of the latest checkpoint a Ray Train snapshot records; None if none."""
    try:
        snapshot = json.loads(raw)
        latest = snapshot.get("latest_checkpoint_result") or {}
        return step_of(latest.get("metrics") or {})
    except (ValueError, AttributeError):
        return None


def latest_checkpoint_step(storage: CheckpointStorage, run_root: str) -> int | None:
    """The step of the latest checkpoint of the Ray Train run kept under `run_root` (the
    run's folder); None without a run, a snapshot, or a step in it."""
    raw = storage.get(f"{run_root.rstrip('/')}/{SNAPSHOT_NAME}")
    return None if raw is None else snapshot_step(raw)
