"""Submitting from a notebook with the CLI's own `submit` options, parsed by the same command.

A cell becomes a script: it is written into a temporary copy of the working directory (the
same files `spotrain submit` would ship, ignore rules included), which is uploaded instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import typer
import typer.main

from shared.cli.console import CliError

# The CLI's own rules for these options, shared rather than copied. They are private to the
# CLI until its `submit` is split into "options → request" and "upload → publish".
from shared.cli.job_actions import (
    build_request,
    request_fields,
    require_ray_train,
    script_entrypoint,
    script_source,
    sweep_requests,
)
from shared.cli.jobs import submit as cli_submit
from shared.client import SpotrainClient, current_user
from shared.events.data import JobRejected, JobRequested
from shared.jobs import JobRecord
from shared.messaging import BusSettings
from shared.workspace import WorkspaceError, ignore_patterns, is_ignored, pack, unpack

CELL_SCRIPT = "cell.py"
"""The file a `%%spotrain` cell becomes, unless the working directory has one already."""


@dataclass(frozen=True)
class SubmitOptions:
    """What `%spotrain submit ...` or a `%%spotrain ...` line asked for, validated."""

    fields: dict[str, Any]
    """The request's fields, without its working directory (uploaded at submission)."""
    workdir: Path
    script: str
    """The script run by `python`: the named one, or the cell's file."""
    wait: bool
    sweep: tuple[JobRequested, ...] = ()
    """A sweep's requests (`--sweep`), one per point; `fields` is then its first point's."""


@dataclass(frozen=True)
class SubmittedJob:
    """A job submitted from the notebook: pass it to `watch`, or use its `job_id`."""

    job_id: str
    request: JobRequested
    answered: bool
    """False when the submitter had not answered in time: the request is stored and waits."""
    record: JobRecord | None = None
    """The final record, when the submission waited for the end (`--wait`)."""
    sweep: tuple[str, ...] = ()
    """A sweep's job ids (`job_id` is then its experiment)."""
    rejected: tuple[str, ...] = ()
    """Why points of a sweep were refused, each `<job id>: <detail>`."""

    @classmethod
    def of_sweep(cls, requests: Sequence[JobRequested], answers: Mapping[str, Any]) -> SubmittedJob:
        rejected = tuple(
            f"{job_id}: {answer.data.detail}"
            for job_id, answer in sorted(answers.items())
            if answer is not None and isinstance(answer.data, JobRejected)
        )
        return cls(
            job_id=requests[0].experiment or requests[0].job_id,
            request=requests[0],
            answered=all(answer is not None for answer in answers.values()),
            sweep=tuple(r.job_id for r in requests),
            rejected=rejected,
        )

    def summary(self) -> str:
        if self.sweep:
            refused = (
                f", {len(self.rejected)} rejected ({self.rejected[0]})" if self.rejected else ""
            )
            return (
                f"sweep {self.job_id}: {len(self.sweep)} jobs{refused} · follow it: "
                f"spotrain watch --experiment {self.job_id}"
            )
        if self.record is not None:
            return f"{self.job_id}: {self.record.state.value}"
        state = "accepted" if self.answered else "requested (the submitter has not answered yet)"
        return f"{self.job_id}: {state} · follow it: %spotrain watch {self.job_id}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())


def parse_submit(argv: Sequence[str], *, cell: str | None = None) -> SubmitOptions | None:
    """The `submit` options as the CLI parses them; None when `--help` was asked for.

    With a cell there is no SCRIPT argument: the cell is the script, and what follows `--`
    are its arguments. Raises `CliError` or `typer.TyperException` with a one-line message.
    """
    if cell is not None:
        dash = list(argv).index("--") if "--" in argv else len(argv)
        workdir = _workdir_option(argv[:dash])
        script = cell_script_name(workdir, cell)
        argv = [script, *argv]
    command = typer.main.get_command(_SUBMIT)
    try:
        context = command.make_context("%spotrain submit", list(argv))
    except typer.Exit:
        return None  # --help: the command printed it
    params = context.params
    args = list(params["args"] or [])
    if cell is not None and args != list(argv[argv.index("--") + 1 :] if "--" in argv else []):
        raise CliError("the cell is the script: give its arguments after --", 2)
    workdir = Path(params["workdir"])
    if not workdir.is_dir():
        raise CliError(f"working directory {workdir} does not exist", 2)
    script = str(params["script"])
    entrypoint = (
        ["python", script, *args] if cell is not None else script_entrypoint(script, args, workdir)
    )
    if params.get("sweep"):
        source = cell if cell is not None else script_source(script, workdir)

        def entrypoint_of(point_args: list[str]) -> list[str]:
            if cell is not None:
                return ["python", script, *point_args]
            return script_entrypoint(script, point_args, workdir)

        points = sweep_requests(params, script, args, source, entrypoint_of)
        first = points[0].model_dump(exclude={"working_dir"})
        return SubmitOptions(
            fields=first, workdir=workdir, script=script, wait=False, sweep=tuple(points)
        )
    fields = request_fields(params, entrypoint)
    if fields["max_workers"] is not None:
        source = cell if cell is not None else script_source(script, workdir)
        require_ray_train(script, source, fields)
    build_request(fields)  # validated before anything is uploaded: a bad value costs nothing
    return SubmitOptions(fields=fields, workdir=workdir, script=script, wait=bool(params["wait"]))


def cell_script_name(workdir: Path, cell: str) -> str:
    """`cell.py`, or a name of the cell's hash when the working directory has a `cell.py`."""
    if not (workdir / CELL_SCRIPT).exists():
        return CELL_SCRIPT
    return f"cell_{hashlib.sha256(cell.encode()).hexdigest()[:8]}.py"


def cell_workspace(workdir: Path, cell: str, script: str, into: Path) -> Path:
    """`into` holding what would be shipped from `workdir`, plus the cell as `script`."""
    unpack(pack(workdir).data, into)
    if is_ignored(PurePosixPath(script), False, ignore_patterns(into)):
        msg = f"{script} is ignored by the working directory's ignore rules; rename or unignore it"
        raise WorkspaceError(msg)
    (into / script).write_text(cell if cell.endswith("\n") else cell + "\n")
    return into


async def submit(
    options: SubmitOptions, *, cell: str | None = None, settings: BusSettings | None = None
) -> SubmittedJob:
    """Upload the working directory (with the cell, if any), publish, wait for the answer.

    Raises `CliError` when the job is rejected or its files cannot be shipped, and
    `PlatformError` when the stack cannot be reached.
    """
    async with await SpotrainClient.connect(settings) as client:
        with tempfile.TemporaryDirectory(prefix="spotrain-cell-") as scratch:
            root = options.workdir
            try:
                if cell is not None:
                    root = await asyncio.to_thread(
                        cell_workspace, options.workdir, cell, options.script, Path(scratch)
                    )
                working_dir = await client.upload_workspace(root)
            except WorkspaceError as error:
                raise CliError(str(error), 2) from None
        if options.sweep:
            shipped = [r.model_copy(update={"working_dir": working_dir}) for r in options.sweep]
            answers = await client.submit_many(shipped)
            return SubmittedJob.of_sweep(shipped, answers)
        request = build_request({**options.fields, "working_dir": working_dir})
        answer = await client.submit(request)
    if answer is not None and isinstance(answer.data, JobRejected):
        raise CliError(f"rejected: {answer.data.detail}")
    return SubmittedJob(job_id=request.job_id, request=request, answered=answer is not None)


async def cancel(job_id: str, *, settings: BusSettings | None = None) -> None:
    async with await SpotrainClient.connect(settings) as client:
        await client.cancel(job_id, current_user())


# The CLI's `submit` command, for its parser: the magic takes exactly the CLI's options.
_SUBMIT = typer.Typer(add_completion=False)
_SUBMIT.command(context_settings={"allow_interspersed_args": True})(cli_submit)


def _workdir_option(argv: Sequence[str]) -> Path:
    """`--workdir` from a cell's line before the full parse, to name the cell's file."""
    for index, item in enumerate(argv):
        if item == "--workdir" and index + 1 < len(argv):
            return Path(argv[index + 1])
        if item.startswith("--workdir="):
            return Path(item.partition("=")[2])
    return Path()
