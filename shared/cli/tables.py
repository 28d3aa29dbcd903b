"""Tables that fit the terminal: plain columns (no box drawing), the least useful dropped
first on a narrow one, no cell or header ever cut. A pure module: the width is given.

As kubectl and gh do it: `-o wide` shows every column whatever the width, `-o json` gives
scripts the rows with stable keys instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from rich.text import Text

NARROWEST = 40
"""The fewest columns a table is drawn in; below, one line says so (use -o json)."""
GAP = 2


class Output(StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"


class ShowOutput(StrEnum):
    """What `show` prints: a description for a person, or the record for a script."""

    TEXT = "text"
    JSON = "json"


@dataclass(frozen=True)
class Column:
    """A column of a table. `priority` 0: always shown; on a narrow terminal the highest
    priority number goes first, and among equals the rightmost."""

    key: str
    priority: int = 0
    style: Callable[[str], str | None] | None = None
    """The style of a cell from its text (a state's colour), if any."""


Row = Mapping[str, str]


def fitting(
    columns: Sequence[Column],
    rows: Sequence[Row],
    width: int | None,
    *,
    gap: int = GAP,
    edges: int = 0,
) -> list[Column]:
    """The columns a table of `rows` shows in `width` characters (all if None): each as
    wide as its header and its widest cell, `gap` apart, with `edges` more for borders (a
    boxed table: 3 apart, 4 for its edges). Priority-0 columns stay even past the width: an
    id that does not fit is still shown whole."""
    widths = {c.key: column_width(c, rows) for c in columns}
    shown = list(columns)

    def needed() -> int:
        return sum(widths[c.key] for c in shown) + gap * (len(shown) - 1) + edges

    while width is not None and needed() > width:
        droppable = [(c.priority, i) for i, c in enumerate(shown) if c.priority > 0]
        if not droppable:
            break
        _, index = max(droppable)
        del shown[index]
    return shown


def column_width(column: Column, rows: Sequence[Row]) -> int:
    return max([len(column.key), *(len(row[column.key]) for row in rows)])


def render(columns: Sequence[Column], rows: Sequence[Row], width: int | None) -> list[Text]:
    """The table's lines, header first: the columns that fit, left-aligned, styled."""
    shown = fitting(columns, rows, width)
    widths = [column_width(c, rows) for c in shown]
    header = Text()
    for index, (column, size) in enumerate(zip(shown, widths, strict=True)):
        header.append(
            _cell(column.key.upper().replace("_", " "), size, last=index == len(shown) - 1)
        )
    lines = [header]
    for row in rows:
        line = Text()
        for index, (column, size) in enumerate(zip(shown, widths, strict=True)):
            value = row[column.key]
            style = column.style(value) if column.style is not None else None
            line.append(_cell(value, size, last=index == len(shown) - 1), style=style or "")
        lines.append(line)
    return lines


def _cell(value: str, size: int, *, last: bool) -> str:
    # The last column is not padded: no trailing blanks for a script's `cut` or `awk`.
    return value if last else value.ljust(size + GAP)


def too_narrow(width: int | None) -> str | None:
    """Why a table cannot be drawn in `width` columns, if it cannot."""
    if width is not None and width < NARROWEST:
        return f"the terminal is {width} columns wide; tables need {NARROWEST} (or use -o json)"
    return None


def event_line(head: str, data: Mapping[str, object], width: int | None) -> str:
    """One event on one line of `width` characters: `head` (when, what, the job or node),
    whole whatever the width, then as much of the event's fields as the rest holds; all
    of them when `width` is None (-o wide, or not a terminal)."""
    if not data:
        return head
    if width is None:
        return f"{head}{' ' * GAP}{key_values(data, limit=sys.maxsize)}"
    room = width - len(head) - GAP
    if room < MIN_FIELDS_ROOM:
        return head
    return f"{head}{' ' * GAP}{key_values(data, limit=room)}"


MIN_FIELDS_ROOM = 12
"""Fewer columns left beside an event's head show no fields rather than `a=...`."""


def key_values(data: Mapping[str, object], *, limit: int) -> str:
    """`attempt=2 nodes=["gpu-spot-3"]`: an event's fields on one line, at most `limit`
    characters (cut with `...`), as `show` and `events tail` print them."""
    text = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in data.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."
