"""Where the CLI writes (tables as wide as the terminal), the error it reports as one
line, and the durations it reads."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from shared.cli.tables import Column, Output, Row, render, too_narrow

out = Console()
err = Console(stderr=True)

OutputOption = Annotated[
    Output,
    typer.Option("--output", "-o", help="table (fits the terminal), wide (every column) or json."),
]

_DURATION = re.compile(r"^(\d+)([smh]?)$")


class CliError(Exception):
    """A failure to report as one line; the exit code rides along."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def duration_s(text: str) -> int:
    match = _DURATION.match(text.strip())
    if match is None:
        raise CliError(f"not a duration: {text!r} (use e.g. 90s, 10m, 2h)", 2)
    value, unit = match.groups()
    return int(value) * {"": 1, "s": 1, "m": 60, "h": 3600}[unit]


def table_width() -> int | None:
    """How wide tables may be: `COLUMNS` if set, else the terminal's; none when stdout is
    not a terminal (a pipe, a file), where every column is kept for the reader's tools."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def print_table(
    columns: Sequence[Column],
    rows: Sequence[Row],
    output: Output,
    as_json: Sequence[object],
    *,
    empty: str | None = None,
) -> None:
    """`rows` as a table that fits (every column with -o wide), or `as_json` with -o json.
    No rows: `empty` on stderr, as kubectl says "No resources found", rather than a lone
    header."""
    if output is Output.JSON:
        print(json.dumps(list(as_json), indent=2))
        return
    width = None if output is Output.WIDE else table_width()
    refusal = too_narrow(width)
    if refusal is not None:
        raise CliError(refusal, 2)
    if not rows and empty is not None:
        err.print(empty, style="dim", highlight=False, soft_wrap=True)
        return
    # One print of the whole table: rich's cost is per call, and a table may have
    # thousands of rows.
    out.print(Text("\n").join(render(columns, rows, width)), soft_wrap=True)
