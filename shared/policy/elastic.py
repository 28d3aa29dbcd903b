"""How many workers a multi-node job runs with: a fixed count, or an elastic range that Ray
Train's own elastic training (`ScalingConfig(num_workers=(min, max))`) resizes within.
Pure: no I/O, no randomness.

MIN workers are a gang: the job needs them all to run. Past MIN, workers are what the job
can use when capacity is there; it goes on with fewer when a node goes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Protocol, Self

from pydantic import Field, model_validator

from shared.events.types import Bundle, CapacityClass, Frozen

MAX_WORKERS = 256


class PoolReach(Protocol):
    """What the size check needs of a pool (the scaler's `PoolStatus` is one)."""

    @property
    def capacity(self) -> CapacityClass: ...
    @property
    def gpus_per_node(self) -> int | None: ...
    @property
    def max_nodes(self) -> int: ...


_RANGE = re.compile(r"^\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?$")
_RAY_TRAIN = re.compile(
    r"^[ \t]*(?:from[ \t]+ray\.train\b|import[ \t]+ray\.train\b"
    r"|from[ \t]+ray[ \t]+import[ \t]+(?:\([^)]*\btrain\b|[^\n#]*\btrain\b))",
    re.MULTILINE,
)


class WorkerRange(Frozen):
    """`min..max` workers; `min == max` is a fixed count."""

    min: Annotated[int, Field(ge=1, le=MAX_WORKERS)]
    max: Annotated[int, Field(ge=1, le=MAX_WORKERS)]

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max < self.min:
            msg = f"at most {self.max} workers is fewer than the least, {self.min}"
            raise ValueError(msg)
        return self

    @property
    def elastic(self) -> bool:
        return self.max > self.min

    def __str__(self) -> str:
        return f"{self.min}..{self.max}" if self.elastic else str(self.min)


def parse_workers(text: str) -> WorkerRange:
    """`N` or `MIN..MAX`; a ValueError that says what is wrong, for one line of the CLI."""
    match = _RANGE.match(text)
    if match is None:
        msg = f"--workers takes N or MIN..MAX (2..4), not {text!r}"
        raise ValueError(msg)
    low = int(match[1])
    high = int(match[2]) if match[2] is not None else low
    if low < 1:
        msg = f"--workers {text}: a job has at least one worker"
        raise ValueError(msg)
    if high < low:
        msg = f"--workers {text}: MAX ({high}) is below MIN ({low})"
        raise ValueError(msg)
    if high > MAX_WORKERS:
        msg = f"--workers {text}: at most {MAX_WORKERS} workers"
        raise ValueError(msg)
    return WorkerRange(min=low, max=high)


def is_ray_train_script(source: str) -> bool:
    """Whether a Python script's source uses Ray Train, the one framework that can resize
    a job's workers while it runs: it imports `ray.train` (`import ray.train`,
    `from ray.train... import`, `from ray import train`), outside a comment."""
    return _RAY_TRAIN.search(source) is not None


def most_workers(worker: Bundle, capacity: CapacityClass, pools: Sequence[PoolReach]) -> int | None:
    """How many workers of this shape all the pools of the capacity could hold together,
    each grown to its `max_nodes`: a gang of more can never run. None when the pools'
    status cannot tell (a worker without GPUs, whose fit depends on CPUs the status does
    not carry, or a pool that does not say its GPUs per node)."""
    eligible = [p for p in pools if capacity is CapacityClass.ANY or p.capacity is capacity]
    if worker.gpus == 0 or any(p.gpus_per_node is None for p in eligible):
        return None
    return sum((p.gpus_per_node or 0) // worker.gpus * p.max_nodes for p in eligible)
