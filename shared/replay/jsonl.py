"""JSON lines of events, one CloudEvents envelope per line: what `spotrain events export`
writes and `import` and the what-if tool read. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.events import Event, EventData, InvalidEventError, decode


@dataclass(frozen=True)
class ParsedLine:
    """A valid event, with its bytes exactly as they were on the line."""

    number: int
    raw: bytes
    event: Event[EventData]


@dataclass(frozen=True)
class RejectedLine:
    number: int
    reason: str
    """`invalid-data: data.job_id: ...`, on one line."""

    def __str__(self) -> str:
        return f"line {self.number}: {self.reason}"


def parse_lines(lines: Iterable[bytes]) -> tuple[list[ParsedLine], list[RejectedLine]]:
    """Validate each line with the event codec; blank lines are skipped, lines count from 1."""
    parsed: list[ParsedLine] = []
    rejected: list[RejectedLine] = []
    for number, line in enumerate(lines, start=1):
        raw = line.rstrip(b"\r\n")
        if not raw.strip():
            continue
        try:
            parsed.append(ParsedLine(number, raw, decode(raw)))
        except InvalidEventError as error:
            reason = " ".join(f"{error.reason}: {error.detail}".split())
            rejected.append(RejectedLine(number, reason))
    return parsed, rejected


def one_per_line(data: bytes) -> bytes | None:
    """A stored message as one line: its bytes when they hold no line break (what our own
    publishers store), else None: a JSON document written over several lines by an outside
    publisher does not fit a line as stored."""
    return None if b"\n" in data or b"\r" in data else data
