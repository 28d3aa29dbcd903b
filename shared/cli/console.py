"""Where the CLI writes, and the error it reports as one line."""

from __future__ import annotations

from rich.console import Console

out = Console()
err = Console(stderr=True)


class CliError(Exception):
    """A failure to report as one line; the exit code rides along."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
