"""Worker ranges and what counts as a Ray Train script (shared.elastic): tables."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.elastic import WorkerRange, is_ray_train_script, parse_workers
from shared.events.data import JobRequested


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [("1", 1, 1), ("4", 4, 4), ("2..4", 2, 4), (" 2 .. 4 ", 2, 4), ("3..3", 3, 3)],
)
def test_parse_workers(text: str, low: int, high: int) -> None:
    assert parse_workers(text) == WorkerRange(min=low, max=high)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "at least one worker"),
        ("0..2", "at least one worker"),
        ("5..3", "MAX (3) is below MIN (5)"),
        ("2..300", "at most 256 workers"),
        ("2-4", "N or MIN..MAX"),
        ("", "N or MIN..MAX"),
        ("-1", "N or MIN..MAX"),
    ],
)
def test_parse_workers_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_workers(text)


@given(st.integers(1, 256), st.integers(0, 255))
def test_a_range_prints_as_it_parses(low: int, extra: int) -> None:
    high = min(256, low + extra)
    workers = WorkerRange(min=low, max=high)
    assert parse_workers(str(workers)) == workers
    assert workers.elastic == (high > low)


@pytest.mark.parametrize(
    ("source", "ray_train"),
    [
        ("import ray.train\n", True),
        ("from ray.train import ScalingConfig\n", True),
        ("from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer\n", True),
        ("from ray.train.torch import TorchTrainer\n", True),
        ("from ray import train\n", True),
        ("from ray import (\n    data,\n    train,\n)\n", True),
        ("    import ray.train  # inside a function\n", True),
        ("import ray\nray.init()\n", False),
        ("# import ray.train\nimport torch\n", False),
        ("from ray import tune\n", False),
        ("print('import ray.train')\n", False),
        ("", False),
    ],
)
def test_what_counts_as_a_ray_train_script(source: str, ray_train: bool) -> None:
    assert is_ray_train_script(source) is ray_train


def test_a_request_with_a_range_has_max_above_min() -> None:
    with pytest.raises(ValidationError, match="must be above num_workers"):
        JobRequested(
            job_id="j", owner="o", entrypoint=("python", "t.py"), num_workers=4, max_workers=4
        )
    assert (
        JobRequested(
            job_id="j", owner="o", entrypoint=("python", "t.py"), num_workers=2, max_workers=4
        ).max_workers
        == 4
    )
