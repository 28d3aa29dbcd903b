"""What a Ray Train script leaves unsaid, the platform says: where the run keeps its
checkpoints and its name (so the next attempt's driver finds them and Ray Train restores
`ray.train.get_checkpoint()`), and the capacity its workers go on (so a spot job's workers
land on the spot nodes the platform bought and charges for it).

A script's own choices stand: a `storage_path` or `name` it gives is kept, and a worker
resource it names is not changed. Only a process started by the launcher arms this
(`install`, from the bootstrap `sitecustomize`), and it waits for the script to import
Ray Train: nothing of Ray is imported here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Final

RAY_TRAIN_CONFIG: Final = "ray.train.v2.api.config"
"""The module that defines Ray Train v2's RunConfig and ScalingConfig (Ray 2.60)."""
ENV_RUN_NAME: Final = "SPOTRAIN_RAY_TRAIN_RUN"
DEFAULT_RUN_NAME: Final = "ray-train"
"""The run's folder under the job's checkpoint URI, the same for every attempt."""


class Defaults:
    """The defaults for this process, read once from the platform's variables."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.storage_path = environ.get("SPOTRAIN_CHECKPOINT_URI", "").strip() or None
        self.run_name = environ.get(ENV_RUN_NAME, "").strip() or DEFAULT_RUN_NAME
        raw = environ.get("SPOTRAIN_WORKER_RESOURCES", "").strip()
        self.worker_resources: dict[str, float] = json.loads(raw) if raw else {}

    def apply_to_run(self, run: Any) -> None:
        """Before RunConfig's own `__post_init__`, which fills Ray's defaults in."""
        unset = run.storage_path is None and run.storage_filesystem is None
        if self.storage_path is not None and unset:
            run.storage_path = self.storage_path
        if not run.name:
            run.name = self.run_name

    def apply_to_scaling(self, scaling: Any) -> None:
        """After ScalingConfig's `__post_init__`: the pin joins whatever each worker asks."""
        if not self.worker_resources:
            return
        resources = dict(scaling._resources_per_worker_not_none)  # Ray's own default
        for name, amount in self.worker_resources.items():
            resources.setdefault(name, amount)
        scaling.resources_per_worker = resources


def patch(module: ModuleType, defaults: Defaults) -> None:
    """Give `module`'s RunConfig and ScalingConfig the platform's defaults."""
    run_config, scaling_config = module.RunConfig, module.ScalingConfig
    run_post_init: Callable[[Any], None] = run_config.__post_init__
    scaling_post_init: Callable[[Any], None] = scaling_config.__post_init__

    def run_with_defaults(self: Any) -> None:
        defaults.apply_to_run(self)
        run_post_init(self)

    def scaling_with_defaults(self: Any) -> None:
        scaling_post_init(self)
        defaults.apply_to_scaling(self)

    run_config.__post_init__ = run_with_defaults
    scaling_config.__post_init__ = scaling_with_defaults


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then` on a module right after it is first imported, once."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._then = then

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not find us again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self._then
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(environ: Mapping[str, str] | None = None) -> None:
    """Arm the defaults for this process: now if Ray Train is already imported, else when
    the script imports it."""
    defaults = Defaults(os.environ if environ is None else environ)
    if RAY_TRAIN_CONFIG in sys.modules:
        patch(sys.modules[RAY_TRAIN_CONFIG], defaults)
        return
    sys.meta_path.insert(0, _AfterImport(RAY_TRAIN_CONFIG, lambda m: patch(m, defaults)))
