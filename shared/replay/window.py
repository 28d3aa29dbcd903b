"""The time window of a read: `--since 2h`, `--until 2026-11-30T12:00`. Pure: `now` is given."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def moment(text: str, *, now: datetime, flag: str = "--since") -> datetime:
    """A duration back from `now` (90s, 10m, 2h, 1d), `now`, or an ISO 8601 time (local
    time if it names no zone); timezone-aware. ValueError, naming `flag`, otherwise."""
    text = text.strip()
    if text == "now":
        return now
    match = _DURATION.match(text)
    if match is not None:
        value, unit = match.groups()
        return now - timedelta(seconds=float(value) * _UNIT_S[unit])
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        msg = f"{flag} takes a duration back (90s, 10m, 2h, 1d) or an ISO time, not {text!r}"
        raise ValueError(msg) from None
    return at if at.tzinfo is not None else at.astimezone()


def window(since: str, until: str | None, *, now: datetime) -> tuple[datetime, datetime]:
    """`[since, until)`, until `now` by default; ValueError if it is empty or in the future."""
    start = moment(since, now=now, flag="--since")
    end = moment(until, now=now, flag="--until") if until is not None else now
    if start >= now:
        raise ValueError(f"--since {since} is not in the past")
    if end <= start:
        raise ValueError(f"--until {until} is not after --since {since}")
    return start, end
