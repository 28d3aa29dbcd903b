"""The spot market traces of `../shared/traces/spot`: how many nodes of a spot pool could
be held at each tick. Read by the simulator, and by the local provider that follows one
(`spotrain up --spot-market`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SpotTrace:
    """How many nodes of one spot pool could be held at each tick (the JSON of
    `../shared/traces/spot`: `{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`)."""

    name: str
    gap_s: int
    counts: tuple[int, ...]

    @property
    def hours(self) -> float:
        return len(self.counts) * self.gap_s / 3600

    def count_at(self, elapsed_s: float) -> int:
        """The count `elapsed_s` trace seconds after its first tick; it starts over at its
        end."""
        tick = max(0, math.floor(elapsed_s / self.gap_s + 1e-9))
        return self.counts[tick % len(self.counts)]


def read_spot_trace(path: Path) -> SpotTrace:
    """A spot market trace; anything but the documented JSON is a ValueError naming the file."""
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected an object with 'metadata' and 'data'")
    metadata, data = document.get("metadata"), document.get("data")
    gap = metadata.get("gap_seconds") if isinstance(metadata, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or gap <= 0 or gap != int(gap):
        raise ValueError(f"{path}: metadata.gap_seconds must be a whole number of seconds > 0")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: data must be a non-empty list of node counts")
    for i, count in enumerate(data):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{path}: data[{i}] is {count!r}, not a count of nodes (int >= 0)")
    return SpotTrace(name=path.stem, gap_s=int(gap), counts=tuple(data))


@dataclass(frozen=True)
class SpotMarketOption:
    """`POOL=FILE[,SPEEDUP]`: the pool follows the trace, one trace hour in 3600/SPEEDUP s."""

    pool: str
    file: Path
    speedup: float = 1.0


def parse_spot_market(value: str) -> SpotMarketOption:
    """The option, its trace read; a ValueError says what is wrong, in one line."""
    pool, sep, rest = value.partition("=")
    if not sep or not pool or not rest:
        msg = f"--spot-market {value!r}: expected POOL=FILE[,SPEEDUP]"
        raise ValueError(msg)
    path, comma, speed = rest.partition(",")
    speedup = 1.0
    if comma:
        try:
            speedup = float(speed)
        except ValueError:
            msg = f"--spot-market {value!r}: the speed-up {speed!r} is not a number"
            raise ValueError(msg) from None
        if not math.isfinite(speedup) or speedup <= 0:
            msg = f"--spot-market {value!r}: the speed-up must be above 0, not {speed}"
            raise ValueError(msg)
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        msg = f"--spot-market {value!r}: no trace file {path}"
        raise ValueError(msg)
    read_spot_trace(file)
    return SpotMarketOption(pool=pool, file=file, speedup=speedup)
