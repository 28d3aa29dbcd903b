"""`%spotrain` and `%%spotrain`: the CLI's job commands as IPython magics.

Every error the user can cause or meet (bad options, a missing script, a rejection, a stack
that is not running) is one `UsageError` line in the notebook, never a traceback.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import nats.errors
import typer
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from shared.cli.console import CliError
from shared.client import PlatformError
from shared.jobs import JobRecord, JobState
from shared.notebook.loop_thread import run_blocking
from shared.notebook.submission import SubmittedJob, cancel, parse_submit, submit
from shared.notebook.watch import watch
from shared.workspace import WorkspaceError

USAGE = """\
%spotrain submit SCRIPT [options] [-- ARGS]   submit a script of the working directory
%spotrain watch [JOB]                         live progress of a job (the last one submitted)
%spotrain cancel JOB                          stop a job
%%spotrain [options] [-- ARGS]                submit the cell as the script

Options are the CLI's: --gpus N, --workers N, --spot | --on-demand | --any, --workdir DIR,
--wait (watch until the end), ...; `%spotrain submit --help` lists them all."""

# What a user can meet: each becomes one line. Anything else is a bug and keeps its traceback.
_ONE_LINE = (
    CliError,
    PlatformError,
    WorkspaceError,
    typer.TyperException,
    nats.errors.Error,
    OSError,
    TimeoutError,
)


@magics_class
class SpotrainMagics(Magics):
    """`%spotrain submit|watch|cancel ...` and the `%%spotrain` cell magic."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.last_job: SubmittedJob | None = None

    @line_cell_magic
    def spotrain(self, line: str, cell: str | None = None) -> SubmittedJob | None:
        """Submit, watch or cancel spotrain jobs; `%spotrain help` says how."""
        return self.run(line, cell)

    def run(self, line: str, cell: str | None = None) -> SubmittedJob | None:
        """What `%spotrain LINE` (cell None) or a `%%spotrain LINE` cell does."""
        with _one_line_errors():
            argv = _split(line)
            if cell is not None:
                if argv[:1] == ["submit"]:
                    argv = argv[1:]
                return self._submit(argv, cell)
            match argv:
                case ["submit", *rest]:
                    return self._submit(rest, None)
                case ["watch"]:
                    if self.last_job is None:
                        raise CliError("no job submitted from this notebook yet: name one")
                    self._watch(self.last_job.job_id)
                case ["watch", job_id]:
                    self._watch(job_id)
                case ["cancel", job_id]:
                    run_blocking(lambda: cancel(job_id))
                    print(f"cancel requested for {job_id}")
                case [] | ["help"] | ["--help"] | ["-h"]:
                    print(USAGE)
                case [("watch" | "cancel") as command, *_]:
                    raise CliError(f"usage: %spotrain {command} JOB")
                case [command, *_]:
                    msg = f"unknown command {command!r}: use submit, watch or cancel"
                    raise CliError(msg)
            return None

    def _submit(self, argv: list[str], cell: str | None) -> SubmittedJob | None:
        options = parse_submit(argv, cell=cell)
        if options is None:
            return None  # --help
        job = run_blocking(lambda: submit(options, cell=cell))
        self.last_job = job
        if not options.wait:
            return job
        record = watch(job)
        job = self.last_job = replace(job, record=record)
        _raise_unless_succeeded(record)
        return job

    def _watch(self, job_id: str) -> None:
        _raise_unless_succeeded(watch(job_id))


def _raise_unless_succeeded(record: JobRecord) -> None:
    """A job that ended badly fails its cell, so that "run all" stops there."""
    if record.state is JobState.SUCCEEDED:
        return
    why = record.detail
    if why is None and record.current is not None and record.current.message:
        why = record.current.message.strip().splitlines()[-1]
    raise CliError(f"{record.job_id} {record.state.value}" + (f": {why}" if why else ""))


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as error:
        raise CliError(f"cannot read the line: {error}") from None


@contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except _ONE_LINE as error:
        raise UsageError(_message(error)) from None


def _message(error: BaseException) -> str:
    format_message: Callable[[], str] | None = getattr(error, "format_message", None)
    text = format_message() if format_message is not None else str(error)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines) or type(error).__name__
