"""One secure local stack for the adversarial suite (`tests/security/world.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.security.attacks import Arena
from tests.security.world import World, arena_of, close_world, open_world


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    opened = open_world(tmp_path_factory.mktemp("secure"))
    try:
        yield opened
    finally:
        close_world(opened)


@pytest.fixture
async def arena(world: World) -> AsyncIterator[Arena]:
    async with arena_of(world) as connected:
        yield connected
