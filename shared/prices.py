"""The price catalog packaged with spotrain, read from the package; what it says is
`shared.policy.cost.pricing`'s."""

from __future__ import annotations

from functools import cache
from importlib import resources

from shared.policy.cost.pricing import CATALOG_FILE, PriceCatalog, load_catalog


@cache
def packaged_catalog() -> PriceCatalog:
    return load_catalog(resources.files("shared.policy.cost").joinpath(CATALOG_FILE).read_text())
