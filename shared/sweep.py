"""A hyperparameter sweep as jobs, pure: `--sweep KEY=V1,V2,...` (repeatable) is the grid
of every combination, one job per point, all of one experiment. No I/O: the caller reads
the script's source and builds the requests (`shared.cli.job_actions`, the SDK)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_POINTS = 1000
"""The most points one sweep may have: room for a sweep of 1,000, as the owner's queue."""

OPTIONS: Mapping[str, str] = {
    "priority": "priority",
    "gpus": "gpus",
    "cpus": "cpus",
    "memory-gb": "memory_gb",
    "max-restarts": "max_restarts",
}
"""Submit options a sweep may vary (by their flag's name), and their field."""

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")


class SweepError(ValueError):
    """A sweep that cannot be run, said in one line a person can act on."""


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Point:
    """One job of the sweep: the script's arguments, the options set, and its labels."""

    index: int
    args: tuple[str, ...]
    options: Mapping[str, str]
    values: Mapping[str, str]
    """Each key's value at this point (also the job's labels)."""


def parse_axes(specs: Sequence[str]) -> list[Axis]:
    """`KEY=V1,V2,...` each; a key twice, an empty list or an empty value is refused."""
    axes: list[Axis] = []
    for spec in specs:
        key, sep, listed = spec.partition("=")
        if not sep or not _KEY.match(key):
            msg = f"--sweep takes KEY=V1,V2,... (e.g. lr=0.1,0.01), not {spec!r}"
            raise SweepError(msg)
        values = tuple(v.strip() for v in listed.split(","))
        if not listed.strip() or any(not v for v in values):
            msg = f"--sweep {key}: give its values, none empty (e.g. {key}=0.1,0.01)"
            raise SweepError(msg)
        if any(axis.key == key for axis in axes):
            msg = f"--sweep {key} is given twice: list all its values once ({key}=a,b,c)"
            raise SweepError(msg)
        axes.append(Axis(key, values))
    return axes


def points(
    axes: Sequence[Axis],
    args: Sequence[str],
    script_source: str,
    *,
    max_points: int = MAX_POINTS,
) -> list[Point]:
    """Every point of the grid, in order (the last key varies fastest). A key is a submit
    option (`OPTIONS`) or an argument of the script: `--KEY` among its arguments or in its
    source (argparse's `add_argument("--lr")`); the value replaces or follows `--KEY`."""
    size = 1
    for axis in axes:
        size *= len(axis.values)
    if size > max_points:
        shape = " x ".join(str(len(axis.values)) for axis in axes)
        msg = f"the sweep has {size} points ({shape}); the most one sweep may have is {max_points}"
        raise SweepError(msg)
    for axis in axes:
        if axis.key not in OPTIONS and not _is_argument(axis.key, args, script_source):
            msg = (
                f"--sweep {axis.key} is neither a submit option ({', '.join(OPTIONS)}) nor "
                f"an argument of the script (no --{axis.key} in its arguments or its source)"
            )
            raise SweepError(msg)
    result = []
    for index, chosen in enumerate(itertools.product(*(axis.values for axis in axes))):
        values = {axis.key: value for axis, value in zip(axes, chosen, strict=True)}
        point_args = list(args)
        options = {}
        for key, value in values.items():
            if key in OPTIONS:
                options[OPTIONS[key]] = value
            else:
                point_args = _with_argument(point_args, key, value)
        result.append(Point(index, tuple(point_args), options, values))
    return result


def _is_argument(key: str, args: Sequence[str], source: str) -> bool:
    flag = f"--{key}"
    return any(a == flag or a.startswith(f"{flag}=") for a in args) or (
        re.search(rf"""["']{re.escape(flag)}["']""", source) is not None
    )


def _with_argument(args: list[str], key: str, value: str) -> list[str]:
    """`--KEY value` in the arguments: replacing the one given, else added at the end."""
    flag = f"--{key}"
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return [*args[: i + 1], value, *args[i + 2 :]]
        if arg.startswith(f"{flag}="):
            return [*args[:i], f"{flag}={value}", *args[i + 1 :]]
    return [*args, flag, value]


def point_job_id(base: str, index: int, total: int) -> str:
    """`<base>-<n>`, zero-padded so that the sweep's jobs sort in order."""
    return f"{base}-{index:0{len(str(max(total - 1, 0)))}d}"
