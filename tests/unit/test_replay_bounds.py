"""The reuse bound (issue 37, 2): what a keep-alive that knows the arrivals pays to run a
trace's work at its arrival, one GPU a unit, each start paying a boot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scaler.simulation.bounds import reuse_bound_usd

BOOT = 100.0


@pytest.mark.parametrize(
    ("jobs", "paid_s"),
    [
        pytest.param([], 0.0, id="no-work"),
        pytest.param([(0, 500, 1)], BOOT + 500, id="one-job-one-boot"),
        pytest.param([(0, 500, 1), (560, 200, 1)], BOOT + 500 + 60 + 200, id="kept-over-a-gap"),
        pytest.param(
            [(0, 500, 1), (800, 200, 1)], BOOT + 500 + BOOT + 200, id="let-go-over-a-long-gap"
        ),
        pytest.param([(0, 500, 2)], 2 * (BOOT + 500), id="two-gpus-two-units"),
        pytest.param(
            [(0, 500, 1), (500, 500, 1)], BOOT + 1000, id="freed-and-taken-at-once-never-idle"
        ),
        pytest.param(
            [(0, 1000, 1), (100, 200, 1), (400, 200, 1)],
            (BOOT + 1000) + (BOOT + 200 + BOOT + 200),
            id="a-second-unit-at-the-break-even",
        ),
    ],
)
def test_reuse_bound(jobs: list[tuple[float, float, int]], paid_s: float) -> None:
    assert reuse_bound_usd(jobs, 1.0, BOOT) == pytest.approx(paid_s)


@given(
    st.lists(
        st.tuples(st.integers(0, 5000), st.integers(1, 2000), st.integers(1, 3)),
        max_size=12,
    )
)
def test_the_reuse_bound_lies_between_the_work_and_a_boot_per_unit_started(
    jobs: list[tuple[int, int, int]],
) -> None:
    work = sum(d * g for _, d, g in jobs)
    bound = reuse_bound_usd([(float(a), float(d), g) for a, d, g in jobs], 1.0, BOOT)
    assert work + (BOOT if jobs else 0) <= bound + 1e-9
    assert bound <= work + BOOT * sum(g for _, _, g in jobs) + 1e-9
