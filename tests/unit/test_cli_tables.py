"""Tables that fit: the least useful columns go first, nothing is ever cut."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.cli.tables import (
    GAP,
    MIN_FIELDS_ROOM,
    Column,
    column_width,
    event_line,
    fitting,
    key_values,
    render,
    too_narrow,
)

COLUMNS = [
    Column("job"),
    Column("state"),
    Column("cost", priority=1),
    Column("gpus", priority=2),
    Column("age", priority=2),
    Column("owner", priority=5),
]
ROWS = [
    {
        "job": "train-digits-7f3a",
        "state": "running",
        "cost": "$0.0123",
        "gpus": "2",
        "age": "3m",
        "owner": "alice",
    },
    {"job": "j", "state": "queued", "cost": "-", "gpus": "16", "age": "1h", "owner": "bob"},
]


@pytest.mark.parametrize(
    ("width", "shown"),
    [
        pytest.param(None, ["job", "state", "cost", "gpus", "age", "owner"], id="no-limit"),
        pytest.param(200, ["job", "state", "cost", "gpus", "age", "owner"], id="roomy"),
        # 17 + 7 + 7 + 4 + 3 + 5 and 5 gaps of 2: 53 wide in all.
        pytest.param(53, ["job", "state", "cost", "gpus", "age", "owner"], id="just-fits"),
        pytest.param(52, ["job", "state", "cost", "gpus", "age"], id="owner-first"),
        # Among equals, the rightmost goes first.
        pytest.param(42, ["job", "state", "cost", "gpus"], id="then-age"),
        pytest.param(26, ["job", "state"], id="ids-and-states-only"),
        pytest.param(10, ["job", "state"], id="never-cut-what-must-show"),
    ],
)
def test_columns_give_way_by_priority(width: int | None, shown: list[str]) -> None:
    assert [c.key for c in fitting(COLUMNS, ROWS, width)] == shown


def test_a_table_is_plain_left_aligned_columns_with_its_headers_whole() -> None:
    lines = [line.plain for line in render(COLUMNS, ROWS, 42)]
    assert lines == [
        "JOB                STATE    COST     GPUS",
        "train-digits-7f3a  running  $0.0123  2",
        "j                  queued   -        16",
    ]


def test_a_cell_is_styled_by_its_text() -> None:
    styled = [Column("state", style=lambda s: "red" if s == "failed" else None)]
    [_, failed, fine] = render(styled, [{"state": "failed"}, {"state": "ok"}], None)
    assert [str(span.style) for span in failed.spans] == ["red"]
    assert fine.spans == []


def test_under_40_columns_a_table_is_refused_with_the_way_out() -> None:
    assert too_narrow(None) is None
    assert too_narrow(40) is None
    assert too_narrow(39) == "the terminal is 39 columns wide; tables need 40 (or use -o json)"


_keys = st.sampled_from(["job", "state", "pool", "node", "cost", "owner", "gpus", "experiment"])
_columns = st.lists(
    st.builds(Column, key=_keys, priority=st.integers(0, 5)), min_size=1, unique_by=lambda c: c.key
)
_cell = st.text(alphabet="abc-$.0123456789", max_size=30)


@given(
    columns=_columns,
    cells=st.lists(st.lists(_cell, min_size=8, max_size=8), max_size=6),
    width=st.integers(1, 160),
)
def test_a_fitted_table_keeps_what_must_show_and_drops_by_priority(
    columns: list[Column], cells: list[list[str]], width: int
) -> None:
    rows = [{c.key: row[i] for i, c in enumerate(columns)} for row in cells]
    shown = fitting(columns, rows, width)
    assert [c for c in columns if c in shown] == shown, "in their order"
    assert all(c in shown for c in columns if c.priority == 0)
    dropped = [c for c in columns if c not in shown]
    kept = [c for c in shown if c.priority > 0]
    if dropped and kept:
        assert min(c.priority for c in dropped) >= max(c.priority for c in kept)
    needed = sum(column_width(c, rows) for c in shown) + GAP * (len(shown) - 1)
    assert needed <= width or all(c.priority == 0 for c in shown)
    for line, row in zip(render(columns, rows, width)[1:], rows, strict=True):
        assert line.plain.split() == [row[c.key] for c in shown if row[c.key]], "nothing cut"


@pytest.mark.parametrize(
    ("data", "limit", "line"),
    [
        pytest.param({"attempt": 2, "nodes": ["a"]}, 40, 'attempt=2 nodes=["a"]', id="fits"),
        pytest.param({"message": "x" * 20}, 16, 'message="xxxx...', id="cut-to-the-limit"),
        pytest.param({}, 10, "", id="nothing"),
    ],
)
def test_an_events_fields_on_one_line(data: dict[str, object], limit: int, line: str) -> None:
    assert key_values(data, limit=limit) == line
    assert len(key_values(data, limit=limit)) <= limit


HEAD = "2026-12-04 04:50:01.123+00:00  job.started  train-digits-7f3a"


@pytest.mark.parametrize(
    ("data", "width", "line"),
    [
        pytest.param(
            {"attempt": 2, "node": "gpu-spot-3"},
            None,
            f'{HEAD}  attempt=2 node="gpu-spot-3"',
            id="not-a-terminal-every-field",
        ),
        pytest.param(
            {"attempt": 2, "node": "gpu-spot-3"},
            len(HEAD) + GAP + 20,
            f'{HEAD}  attempt=2 node="g...',
            id="fields-cut-to-the-width",
        ),
        pytest.param(
            {"attempt": 2}, len(HEAD) + GAP + MIN_FIELDS_ROOM - 1, HEAD, id="no-room-no-fields"
        ),
        # The head is whole even past the width: an id is never cut.
        pytest.param({"attempt": 2}, 40, HEAD, id="the-head-whole"),
        pytest.param({}, 200, HEAD, id="no-fields"),
    ],
)
def test_an_event_line(data: dict[str, object], width: int | None, line: str) -> None:
    assert event_line(HEAD, data, width) == line


@given(
    data=st.dictionaries(st.text(min_size=1, max_size=8), st.integers(), max_size=6),
    width=st.integers(min_value=len(HEAD), max_value=200),
)
def test_an_event_line_fits_a_width_its_head_fits(data: dict[str, object], width: int) -> None:
    line = event_line(HEAD, data, width)
    assert line.startswith(HEAD)
    assert len(line) <= width
