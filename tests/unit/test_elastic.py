"""Worker ranges and what counts as a Ray Train script (shared.policy.elastic): tables."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.events.data import JobRequested
from shared.events.types import Bundle, CapacityClass
from shared.policy.elastic import WorkerRange, is_ray_train_script, most_workers, parse_workers
from shared.pools import PoolStatus


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


def _pool(name: str, capacity: CapacityClass, gpus: int | None, max_nodes: int) -> PoolStatus:
    return PoolStatus(
        pool=name,
        capacity=capacity,
        price_per_hour_usd=1.0,
        nodes=0,
        ready=0,
        gpus_total=0,
        gpus_free=0,
        pending_jobs=0,
        pending_gpus=0,
        target=0,
        min_nodes=0,
        max_nodes=max_nodes,
        gpus_per_node=gpus,
    )


SPOT_1 = _pool("gpu-spot", CapacityClass.SPOT, 1, 4)
SPOT_2 = _pool("gpu-spot-big", CapacityClass.SPOT, 2, 3)
OD_1 = _pool("gpu-od", CapacityClass.ON_DEMAND, 1, 2)
UNSAID = _pool("gpu-old", CapacityClass.SPOT, None, 9)


@pytest.mark.parametrize(
    ("gpus", "capacity", "pools", "most"),
    [
        pytest.param(1, CapacityClass.SPOT, [SPOT_1, SPOT_2, OD_1], 4 + 6, id="spot-only"),
        pytest.param(2, CapacityClass.SPOT, [SPOT_1, SPOT_2, OD_1], 3, id="two-gpus-each"),
        pytest.param(1, CapacityClass.ANY, [SPOT_1, SPOT_2, OD_1], 12, id="any-capacity"),
        pytest.param(1, CapacityClass.ON_DEMAND, [SPOT_1], 0, id="no-pool-of-it"),
        pytest.param(4, CapacityClass.SPOT, [SPOT_1, SPOT_2], 0, id="no-node-big-enough"),
        pytest.param(1, CapacityClass.SPOT, [SPOT_1, UNSAID], None, id="a-pool-says-nothing"),
        pytest.param(0, CapacityClass.SPOT, [SPOT_1], None, id="cpu-workers"),
    ],
)
def test_most_workers_the_pools_could_hold(
    gpus: int, capacity: CapacityClass, pools: list[PoolStatus], most: int | None
) -> None:
    assert most_workers(Bundle(gpus=gpus), capacity, pools) == most
