"""Spot markets for property tests of deadline policies: blocks of ticks with spot or
without, of random lengths."""

from __future__ import annotations

from hypothesis import strategies as st

from services.scaler.simulation.traces import SpotTrace

markets = st.lists(st.booleans(), min_size=1, max_size=12).flatmap(
    lambda blocks: st.lists(st.integers(1, 30), min_size=len(blocks), max_size=len(blocks)).map(
        lambda lengths: [b for b, n in zip(blocks, lengths, strict=True) for _ in range(n)]
    )
)
"""Whether spot can be had at each tick."""


def spot_trace(available: list[bool], gap_s: int = 600) -> SpotTrace:
    """A one-node market: spot at the ticks where `available`."""
    return SpotTrace("test", gap_s, tuple(int(a) for a in available))
