"""`TeamsSource` on the teams file: read again when it changes; a change that does not
parse is logged with its one-line reason and the last valid teams stay in force."""

from __future__ import annotations

from pathlib import Path

import structlog

from shared.policy.teams import Teams, TeamsError
from shared.teams_file import load_teams

log = structlog.get_logger()


class TeamsFile:
    def __init__(self, path: Path) -> None:
        """Reads the file at once: a submitter does not start on a bad one."""
        self._path = path
        self._teams = load_teams(path)
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self._path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def current(self) -> Teams:
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            try:
                self._teams = load_teams(self._path)
                log.info("teams.reloaded", teams=sorted(self._teams.teams))
            except TeamsError as error:
                log.error("teams.file_refused", error=str(error), kept=sorted(self._teams.teams))
        return self._teams
