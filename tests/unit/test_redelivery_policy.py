"""Retry delays grow and stay within their cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.messaging import RedeliveryPolicy


@given(
    base=st.floats(0.001, 10),
    cap=st.floats(0.001, 600),
    delivered=st.integers(1, 1_000),
)
def test_delays_never_shrink_and_never_pass_the_cap(
    base: float, cap: float, delivered: int
) -> None:
    policy = RedeliveryPolicy(base_delay_s=base, max_delay_s=cap)
    assert policy.delay_s(delivered) <= cap
    assert policy.delay_s(delivered + 1) >= policy.delay_s(delivered)


def test_delays_double_from_the_base() -> None:
    policy = RedeliveryPolicy(base_delay_s=1, max_delay_s=60)
    assert [policy.delay_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
