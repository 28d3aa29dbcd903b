"""Python runs this at start-up in every process of a job's command (the launcher puts its
folder first on PYTHONPATH). It only arms a hook: Ray Train's config classes get the
platform's defaults when, and if, the process imports them; nothing else is imported."""

from __future__ import annotations

import importlib.util
import os
import sys


def _arm() -> None:
    try:
        from shared.usercode import ray_train_defaults  # noqa: PLC0415  # at start-up only
    except ImportError:  # a Python without the platform's package: nothing to arm
        return
    ray_train_defaults.install()


def _chain() -> None:
    """Run the `sitecustomize` this one hides, if the interpreter has one (Debian's does)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location("_sitecustomize_hidden", candidate)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return


_arm()
_chain()
