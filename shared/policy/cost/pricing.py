"""Prices: a dated catalog of public GCP list prices, per-pool overrides of the prices nodes
carry from their pool's configuration, and which on-demand pool a spot pool is measured by.

Pure: parsing text and looking things up; the caller reads files.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.events.types import CapacityClass

CATALOG_FILE = "gcp_list_prices_2025-01.toml"
"""The packaged catalog; its name carries the month its prices are from."""


M = TypeVar("M", bound=BaseModel)


class PricingError(ValueError):
    """A price file that cannot be used; the message names the file's problem in one line."""


@dataclass(frozen=True)
class MachinePrice:
    """One machine type's list prices per hour, on-demand and spot."""

    machine_type: str
    gpus: int
    gpu_type: str | None
    cpus: float
    memory_gb: float
    on_demand_per_hour_usd: float
    spot_per_hour_usd: float

    def per_hour_usd(self, capacity: CapacityClass) -> float:
        if capacity is CapacityClass.SPOT:
            return self.spot_per_hour_usd
        return self.on_demand_per_hour_usd


@dataclass(frozen=True)
class PriceCatalog:
    """List prices as of a date, with where they came from and whether anyone checked."""

    as_of: str
    region: str
    source: str
    verified: bool
    machines: Mapping[str, MachinePrice]

    def machine(self, machine_type: str) -> MachinePrice:
        try:
            return self.machines[machine_type]
        except KeyError:
            known = ", ".join(sorted(self.machines))
            msg = f"no list price for machine type {machine_type!r} (known: {known})"
            raise PricingError(msg) from None


@dataclass(frozen=True)
class PoolPrice:
    """A pool's prices set by hand; each None keeps what its nodes carry from the pools file.

    `machine` takes both prices from the catalog: the pool's own by its capacity class, and
    the machine's on-demand price as the baseline of the spot saving.
    """

    price_per_hour_usd: float | None = None
    on_demand_price_per_hour_usd: float | None = None
    machine: MachinePrice | None = None

    def price(self, capacity: CapacityClass) -> float | None:
        if self.price_per_hour_usd is not None:
            return self.price_per_hour_usd
        return self.machine.per_hour_usd(capacity) if self.machine else None

    def on_demand_price(self) -> float | None:
        if self.on_demand_price_per_hour_usd is not None:
            return self.on_demand_price_per_hour_usd
        return self.machine.on_demand_per_hour_usd if self.machine else None


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


Usd = Annotated[float, Field(ge=0, le=100_000)]


class _MachineEntry(_Strict):
    gpus: Annotated[int, Field(ge=0, le=16)]
    gpu_type: str | None = None
    cpus: Annotated[float, Field(gt=0)]
    memory_gb: Annotated[float, Field(ge=0)] = 0.0
    on_demand_per_hour_usd: Usd
    spot_per_hour_usd: Usd


class _CatalogFile(_Strict):
    as_of: str
    region: str
    source: str
    verified: bool
    machine: dict[str, _MachineEntry]


class _PoolEntry(_Strict):
    price_per_hour_usd: Usd | None = None
    on_demand_price_per_hour_usd: Usd | None = None
    machine_type: str | None = None


class _OverridesFile(_Strict):
    pool: dict[str, _PoolEntry] = Field(default_factory=dict)


def load_catalog(text: str) -> PriceCatalog:
    """The catalog in `text` (`shared.prices.packaged_catalog` reads the one packaged)."""
    parsed = _parse(_CatalogFile, text, "price catalog")
    return PriceCatalog(
        as_of=parsed.as_of,
        region=parsed.region,
        source=parsed.source,
        verified=parsed.verified,
        machines={
            name: MachinePrice(machine_type=name, **entry.model_dump())
            for name, entry in parsed.machine.items()
        },
    )


def load_overrides(text: str, catalog: PriceCatalog) -> dict[str, PoolPrice]:
    """Per-pool prices from a TOML text of `[pool.NAME]` tables, each with
    `price_per_hour_usd`, `on_demand_price_per_hour_usd` and/or `machine_type` (looked up
    in `catalog`)."""
    parsed = _parse(_OverridesFile, text, "prices file")
    overrides = {}
    for pool, entry in parsed.pool.items():
        machine = None
        if entry.machine_type is not None:
            machine = catalog.machine(entry.machine_type)
        overrides[pool] = PoolPrice(
            price_per_hour_usd=entry.price_per_hour_usd,
            on_demand_price_per_hour_usd=entry.on_demand_price_per_hour_usd,
            machine=machine,
        )
    return overrides


def _parse(model: type[M], text: str, what: str) -> M:
    try:
        return model.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as error:
        raise PricingError(f"{what}: not TOML: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PricingError(f"{what}: {where}: {first['msg']}") from None


class PoolShape(Protocol):
    """What pricing needs of a pool (the scaler's `PoolSpec` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> CapacityClass: ...
    @property
    def gpus(self) -> int: ...
    @property
    def gpu_type(self) -> str | None: ...
    @property
    def cpus(self) -> float: ...
    @property
    def memory_gb(self) -> float: ...
    @property
    def price_per_hour_usd(self) -> float: ...


def on_demand_counterpart(pool: PoolShape, pools: Iterable[PoolShape]) -> PoolShape | None:
    """The on-demand pool a node of `pool` is measured against: itself if it is on-demand;
    else the cheapest on-demand pool of the same shape (GPUs, GPU type, CPUs, memory), or,
    failing that, of the same GPUs and GPU type; None when there is none."""
    if pool.capacity is CapacityClass.ON_DEMAND:
        return pool
    same_gpus = [
        p
        for p in pools
        if p.capacity is CapacityClass.ON_DEMAND
        and (p.gpus, p.gpu_type) == (pool.gpus, pool.gpu_type)
    ]
    same_shape = [p for p in same_gpus if (p.cpus, p.memory_gb) == (pool.cpus, pool.memory_gb)]
    for candidates in (same_shape, same_gpus):
        if candidates:
            return min(candidates, key=lambda p: (p.price_per_hour_usd, p.name))
    return None
