"""A sweep's grid (`shared.sweep`): every point, each key a script argument or an option,
and one clear line for a sweep that cannot run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import sweep

SOURCE = 'parser.add_argument("--lr", type=float)\nparser.add_argument("--batch")\n'


def grid(*specs: str, args: tuple[str, ...] = (), source: str = SOURCE) -> list[sweep.Point]:
    return sweep.points(sweep.parse_axes(list(specs)), list(args), source)


def test_two_keys_make_every_combination_the_last_varying_fastest() -> None:
    points = grid("lr=0.1,0.01", "batch=32,64")
    assert [p.values for p in points] == [
        {"lr": "0.1", "batch": "32"},
        {"lr": "0.1", "batch": "64"},
        {"lr": "0.01", "batch": "32"},
        {"lr": "0.01", "batch": "64"},
    ]
    assert points[1].args == ("--lr", "0.1", "--batch", "64")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param((), ("--lr", "0.5"), id="added"),
        pytest.param(("--lr", "1", "--steps", "9"), ("--lr", "0.5", "--steps", "9"), id="replaced"),
        pytest.param(("--lr=1",), ("--lr=0.5",), id="replaced-inline"),
    ],
)
def test_a_script_argument_is_set_at_each_point(
    args: tuple[str, ...], expected: tuple[str, ...]
) -> None:
    [point] = grid("lr=0.5", args=args)
    assert point.args == expected


def test_an_option_key_sets_the_option_not_an_argument() -> None:
    points = grid("priority=2,8", source="")
    assert [(p.args, dict(p.options)) for p in points] == [
        ((), {"priority": "2"}),
        ((), {"priority": "8"}),
    ]


def test_an_argument_given_on_the_command_line_counts_without_source() -> None:
    [point] = grid("seed=7", args=("--seed", "1"), source="")
    assert point.args == ("--seed", "7")


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        pytest.param(
            ("lr",), "--sweep takes KEY=V1,V2,... (e.g. lr=0.1,0.01), not 'lr'", id="no-="
        ),
        pytest.param(
            ("lr=",), "--sweep lr: give its values, none empty (e.g. lr=0.1,0.01)", id="empty"
        ),
        pytest.param(
            ("lr=0.1,,0.2",), "--sweep lr: give its values, none empty", id="an-empty-value"
        ),
        pytest.param(("lr=1", "lr=2"), "--sweep lr is given twice", id="twice"),
        pytest.param(
            ("dropout=0.1",),
            "--sweep dropout is neither a submit option (priority, gpus, cpus, memory-gb, "
            "max-restarts) nor an argument of the script (no --dropout in its arguments or "
            "its source)",
            id="unknown-key",
        ),
        pytest.param(
            ("lr=" + ",".join(str(i) for i in range(40)), "batch=" + ",".join(map(str, range(30)))),
            "the sweep has 1200 points (40 x 30); the most one sweep may have is 1000",
            id="past-the-limit",
        ),
    ],
)
def test_a_sweep_that_cannot_run_is_refused_in_one_line(
    specs: tuple[str, ...], message: str
) -> None:
    with pytest.raises(sweep.SweepError) as refused:
        grid(*specs)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_a_grid_has_the_product_of_its_sizes_each_point_once(sizes: list[int]) -> None:
    specs = [f"k{i}=" + ",".join(f"v{j}" for j in range(n)) for i, n in enumerate(sizes)]
    source = " ".join(f'"--k{i}"' for i in range(len(sizes)))
    points = grid(*specs, source=source)
    expected = 1
    for n in sizes:
        expected *= n
    assert len(points) == expected
    assert len({tuple(sorted(p.values.items())) for p in points}) == expected
    ids = [sweep.point_job_id("train-ab12", p.index, len(points)) for p in points]
    assert ids == sorted(ids), "the jobs sort in the sweep's order"
