"""spotrain in Jupyter: `%load_ext shared.notebook`, then `%spotrain submit train.py --gpus 1`,
a `%%spotrain --gpus 1` cell, and `watch(job)` for live progress.

The extension lives beside the SDK and the CLI it is built on (`shared.client`,
`shared.cli`), so `pip install spotrain[notebook]` is all a notebook needs.
"""

from __future__ import annotations

from typing import Any

from shared.notebook.progress import JobView, Phase, advance, render_html, render_text
from shared.notebook.submission import SubmittedJob
from shared.notebook.watch import (
    CostSource,
    JobRef,
    follow_progress,
    watch,
    watch_async,
)

__all__ = [
    "CostSource",
    "JobRef",
    "JobView",
    "Phase",
    "SubmittedJob",
    "advance",
    "follow_progress",
    "load_ipython_extension",
    "render_html",
    "render_text",
    "unload_ipython_extension",
    "watch",
    "watch_async",
]


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext shared.notebook`: registers `%spotrain` and `%%spotrain`."""
    from shared.notebook.magics import SpotrainMagics  # noqa: PLC0415  # needs IPython

    ipython.register_magics(SpotrainMagics)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext shared.notebook` (and `%reload_ext`): removes the magics."""
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("spotrain", None)
