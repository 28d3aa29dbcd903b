"""A Ray Train callback that turns a script's own `ray.train.report` calls into the
platform's progress (progress.json at the job's root, as the training helper writes it):
step, metrics and workers for `spotrain show` and `watch`, and the step a lost attempt
reached. Ray Train builds it in the driver from RAY_TRAIN_CALLBACKS, which the launcher
sets, and runs it in its controller, whose environment has the job's SPOTRAIN_ variables.
"""

from __future__ import annotations

import os
from typing import Any

from ray.train.v2._internal.execution.callback import ReportCallback

from shared.training import TrainingContext, TrainingEnvironment, TrainingEnvironmentError
from shared.usercode.ray_train_runs import numeric_metrics, step_of


class ReportsAsProgress(ReportCallback):
    """Each report that names its step becomes the job's progress."""

    def __init__(self) -> None:
        self._context: TrainingContext | None = None

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        step = step_of(training_report.metrics)
        if step is None:
            return
        context = self._progress()
        if context is None:
            return
        context.report(step, numeric_metrics(training_report.metrics), workers=len(metrics))

    def _progress(self) -> TrainingContext | None:
        if self._context is None:
            try:
                environment = TrainingEnvironment.from_mapping(os.environ)
            except TrainingEnvironmentError:
                return None  # not run by the platform: nobody to tell
            self._context = TrainingContext(environment)
        return self._context

    def __getstate__(self) -> dict[str, Any]:
        # Built in the driver, run in the controller: the context is made where it is used.
        return {"_context": None}
