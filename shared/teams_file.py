"""The teams file read from disk; what it means is `shared.policy.teams`'s."""

from __future__ import annotations

from pathlib import Path

from shared.policy.teams import Teams, TeamsError, parse_teams


def load_teams(path: Path) -> Teams:
    try:
        text = path.read_text()
    except OSError as error:
        raise TeamsError(f"{path}: cannot read it: {error.strerror or error}") from None
    return parse_teams(text, source=str(path))
