"""Prices: the dated list-price catalog, per-pool overrides, and on-demand counterparts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from services.scaler.model import PoolSpec
from shared.events.types import CapacityClass
from shared.policy.cost import PoolPrice, PricingError, load_overrides
from shared.policy.cost.pricing import CATALOG_FILE, on_demand_counterpart
from shared.prices import packaged_catalog

ROOT = Path(__file__).parents[2]


def test_the_catalog_says_when_its_prices_are_from_and_that_nobody_checked_them() -> None:
    catalog = packaged_catalog()
    assert catalog.as_of in CATALOG_FILE
    assert catalog.region == "us-central1"
    assert catalog.verified is False
    for machine in catalog.machines.values():
        assert 0 < machine.spot_per_hour_usd < machine.on_demand_per_hour_usd


@pytest.mark.parametrize(
    ("machine_type", "gpus", "gpu_type"),
    [
        pytest.param("g2-standard-8", 1, "nvidia-l4", id="l4"),
        pytest.param("a2-highgpu-1g", 1, "nvidia-tesla-a100", id="a100"),
        pytest.param("n1-standard-8-t4", 1, "nvidia-tesla-t4", id="t4"),
    ],
)
def test_the_catalog_holds_the_common_gpu_machine_types(
    machine_type: str, gpus: int, gpu_type: str
) -> None:
    machine = packaged_catalog().machine(machine_type)
    assert (machine.gpus, machine.gpu_type) == (gpus, gpu_type)


def test_the_local_pools_are_priced_from_the_catalog() -> None:
    """gpu-spot and gpu-on-demand as a g2-standard-8 on spot and on-demand; cpu as an
    n2-standard-2 on-demand."""
    pools = {
        p["name"]: p["price_per_hour_usd"]
        for p in tomllib.loads((ROOT / "services/scaler/pools.local.toml").read_text())["pool"]
    }
    catalog = packaged_catalog()
    l4, cpu = catalog.machine("g2-standard-8"), catalog.machine("n2-standard-2")
    assert pools == {
        "gpu-spot": l4.spot_per_hour_usd,
        "gpu-on-demand": l4.on_demand_per_hour_usd,
        "cpu": cpu.on_demand_per_hour_usd,
    }


def test_overrides_set_prices_by_hand_or_by_machine_type() -> None:
    overrides = load_overrides(
        """
        [pool.gpu-spot]
        machine_type = "a2-highgpu-1g"

        [pool.gpu-on-demand]
        price_per_hour_usd = 4
        """,
        packaged_catalog(),
    )
    spot, on_demand = overrides["gpu-spot"], overrides["gpu-on-demand"]
    assert spot.price(CapacityClass.SPOT) == 1.1
    assert spot.on_demand_price() == 3.67
    assert on_demand == PoolPrice(price_per_hour_usd=4.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[pool.x", "prices file: not TOML", id="not-toml"),
        pytest.param(
            "[pool.x]\nprice_per_hour_usd = -1", "pool.x.price_per_hour_usd", id="negative"
        ),
        pytest.param("[pool.x]\nprise = 1", "pool.x.prise: Extra inputs", id="typo"),
        pytest.param(
            '[pool.x]\nmachine_type = "z9-huge"',
            "no list price for machine type 'z9-huge'",
            id="unknown-machine",
        ),
    ],
)
def test_a_bad_prices_file_is_one_line_that_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(PricingError, match=message.replace("(", r"\(")) as caught:
        load_overrides(text, packaged_catalog())
    assert "\n" not in str(caught.value)


def pool(name: str, capacity: CapacityClass, price: float, **shape: float) -> PoolSpec:
    fields = {"gpus": 2, "cpus": 8.0, **shape}
    return PoolSpec.model_validate(
        {"name": name, "capacity": capacity, "price_per_hour_usd": price, **fields}
    )


SPOT = pool("spot", CapacityClass.SPOT, 1.0)


@pytest.mark.parametrize(
    ("pools", "expected"),
    [
        pytest.param([pool("od", CapacityClass.ON_DEMAND, 3.0)], "od", id="same-shape"),
        pytest.param(
            [
                pool("od-big", CapacityClass.ON_DEMAND, 2.0, cpus=16),
                pool("od", CapacityClass.ON_DEMAND, 3.0),
            ],
            "od",
            id="same-shape-before-cheaper-other-shape",
        ),
        pytest.param(
            [pool("od-big", CapacityClass.ON_DEMAND, 2.0, cpus=16)], "od-big", id="same-gpus"
        ),
        pytest.param(
            [
                pool("od-a", CapacityClass.ON_DEMAND, 3.0),
                pool("od-b", CapacityClass.ON_DEMAND, 2.5),
            ],
            "od-b",
            id="cheapest",
        ),
        pytest.param([pool("od-4", CapacityClass.ON_DEMAND, 3.0, gpus=4)], None, id="none"),
        pytest.param([pool("spot-2", CapacityClass.SPOT, 0.5)], None, id="spot-is-no-baseline"),
    ],
)
def test_a_spot_pool_is_measured_against_an_on_demand_pool_of_its_shape(
    pools: list[PoolSpec], expected: str | None
) -> None:
    counterpart = on_demand_counterpart(SPOT, [SPOT, *pools])
    assert (counterpart.name if counterpart else None) == expected


def test_an_on_demand_pool_is_its_own_baseline() -> None:
    od = pool("od", CapacityClass.ON_DEMAND, 3.0)
    assert on_demand_counterpart(od, [od, SPOT]) is od
