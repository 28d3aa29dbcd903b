"""One running local stack shared by the end-to-end tests that only use it: starting one
costs more than most tests (tests of `up` and `down` themselves start their own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.stack import spotrain, stack_env


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a running stack: pass it to `spotrain(...)` or subprocesses."""
    env = {
        **stack_env(tmp_path_factory.mktemp("shared-stack") / "stack"),
        # Ray fails a job that waits this long for room (900 s by default): nothing may wait
        # in Ray, so on the test stacks a job that did would fail, and its test with it.
        "RAY_JOB_START_TIMEOUT_SECONDS": "30",
    }
    # With Prometheus, so that what the tests do shows in the metrics and dashboards.
    up = spotrain(env, "up", "--prometheus")
    assert up.returncode == 0, up.stderr + up.stdout
    yield env
    spotrain(env, "down")
