"""One running local stack shared by the end-to-end tests that only use it: starting one
costs more than most tests (tests of `up` and `down` themselves start their own). It lives
for this package only, and its tests run last in it: up while the tests that start stacks
of their own run, it would take their CPU (two cores in CI), and hand out node ports their
scalers hand out too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import spotrain, stack_env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end tests on the shared stack after the others (a stable sort: tests keep
    their order; a module with both kinds is split, so none may hold a module-scoped
    fixture across them)."""
    here = Path(__file__).parent
    ours = [i for i, item in enumerate(items) if item.path.is_relative_to(here)]
    if not ours:
        return
    moved = sorted((items[i] for i in ours), key=_on_shared_stack)
    for i, item in zip(ours, moved, strict=True):
        items[i] = item


def _on_shared_stack(item: pytest.Item) -> bool:
    return "local_stack" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="package")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a running stack: pass it to `spotrain(...)` or subprocesses."""
    env = {
        **stack_env(tmp_path_factory.mktemp("shared-stack") / "stack"),
        # Ray fails a job that waits this long for room (900 s by default): nothing may wait
        # in Ray, so on the test stacks a job that did would fail, and its test with it.
        "RAY_JOB_START_TIMEOUT_SECONDS": "30",
        # The cost metrics the tests compare with the ledger, attributed every 2 s, not 10.
        "SPOTRAIN_SCALER_COST_METER_INTERVAL_S": "2",
    }
    # With Prometheus, so that what the tests do shows in the metrics and dashboards.
    up = spotrain(env, "up", "--prometheus")
    assert up.returncode == 0, up.stderr + up.stdout
    yield env
    spotrain(env, "down")
