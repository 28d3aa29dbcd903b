"""The job commands: submit, ls, show, logs, watch, cancel, pools, teams.

Their options and help only: what each does is in `shared.cli.job_actions`, imported when
it runs, so `spotrain ls --help` needs neither the bus nor the event models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shared.cli.console import OutputOption
from shared.cli.tables import Output, ShowOutput


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": True})(submit)
    app.command(name="ls")(list_jobs)
    app.command()(show)
    app.command()(logs)
    app.command()(watch)
    app.command()(cancel)
    app.command()(pools)
    app.command()(teams)


def submit(  # noqa: PLR0917  # a typer command: its options are its parameters
    context: typer.Context,
    script: Annotated[
        str, typer.Argument(help="A .py file in the working directory, or a command.")
    ],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the script, after --.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs per worker.")] = 0,
    workers: Annotated[
        str,
        typer.Option(
            help="Workers (nodes) for a multi-node job: N, or MIN..MAX for a Ray Train script "
            "that goes on with fewer when a node goes and grows back when capacity returns."
        ),
    ] = "1",
    cpus: Annotated[float, typer.Option(help="CPUs per worker.")] = 1.0,
    memory_gb: Annotated[float, typer.Option(help="Memory per worker, GB.")] = 0.0,
    gpu_type: Annotated[str | None, typer.Option(help="e.g. nvidia-l4.")] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot capacity only.")] = False,
    on_demand: Annotated[
        bool, typer.Option("--on-demand", help="On-demand capacity only.")
    ] = False,
    any_capacity: Annotated[
        bool, typer.Option("--any", help="Spot first, on-demand as fallback (default).")
    ] = False,
    priority: Annotated[int, typer.Option(min=0, max=9)] = 5,
    max_restarts: Annotated[int, typer.Option(min=0)] = 3,
    checkpoint_every: Annotated[str | None, typer.Option(help="e.g. 10m, 1h.")] = None,
    experiment: Annotated[str | None, typer.Option()] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable.")] = None,
    env: Annotated[list[str] | None, typer.Option(help="NAME=VALUE, repeatable.")] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            help="ENVVAR=SECRET, repeatable: the attempt gets the platform's secret SECRET "
            "as ENVVAR (a file of ~/.spotrain/secrets locally, a key of the chart's "
            "Secret on GKE); its value never enters the bus, a record or a log."
        ),
    ] = None,
    pip: Annotated[list[str] | None, typer.Option(help="A pip requirement, repeatable.")] = None,
    workdir: Annotated[Path, typer.Option(help="Folder packed and shipped with the job.")] = Path(),
    job_id: Annotated[
        str | None, typer.Option(help="Defaults to the script name + a suffix.")
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Follow the job to its end; exit 1 if it fails.")
    ] = False,
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=V1,V2,... repeatable: one job per point of the grid, all one "
            "experiment; KEY is a script argument (--KEY) or one of priority, gpus, cpus, "
            "memory-gb, max-restarts.",
        ),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            help="When the result is needed, an ISO time (local time if it names no zone), "
            "e.g. 2026-12-02T09:00: spot or on-demand is chosen so that it ends before."
        ),
    ] = None,
    within: Annotated[
        str | None, typer.Option(help="The deadline as a duration from now: 12h, 90m.")
    ] = None,
    estimate: Annotated[
        str | None,
        typer.Option(help="Expected run time, uninterrupted (6h), until the job says its pace."),
    ] = None,
    max_hours: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Stop the job after this many hours of running; a team with a budget "
            "admits it at GPUs x price x these hours.",
        ),
    ] = None,
) -> None:
    """Submit a training job; prints its id on the last line."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    job_actions.submit(context.params)


def list_jobs(
    everyone: Annotated[
        bool, typer.Option("--all", help="Everyone's jobs, not only mine.")
    ] = False,
    output: OutputOption = Output.TABLE,
) -> None:
    """My jobs: state, attempt, capacity, GPUs, age, cost."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    job_actions.list_jobs(everyone, output)


def show(
    job_id: str,
    all_events: Annotated[
        bool, typer.Option("--events", help="Every event, not the last 10.")
    ] = False,
    output: Annotated[
        ShowOutput, typer.Option("--output", "-o", help="text (a description) or json.")
    ] = ShowOutput.TEXT,
) -> None:
    """A job described: its state, attempts, progress, cost and last events."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    job_actions.show(job_id, all_events, output)


def logs(
    job_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until it ends.")
    ] = False,
    attempt: Annotated[int | None, typer.Option(help="One attempt; all by default.")] = None,
) -> None:
    """The job's logs across its attempts: from Ray, else the end of each attempt's output
    as the platform kept it beside its checkpoints (what Ray lost with its head)."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    job_actions.logs(job_id, follow, attempt)


def watch(
    job_id: Annotated[str | None, typer.Argument()] = None,
    experiment: Annotated[
        str | None, typer.Option(help="Every job of the experiment (a sweep), by state.")
    ] = None,
) -> None:
    """A live progress bar: step, loss, ETA, attempts; or an experiment's jobs."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    job_actions.watch(job_id, experiment)


def cancel(job_id: str) -> None:
    """Stop a job; its running attempt is stopped in Ray."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    job_actions.cancel(job_id)


def pools(
    learnt: Annotated[
        bool,
        typer.Option(
            "--learnt",
            help="Print what the scaler has learnt of each pool, as JSON: the file "
            "`spotrain simulate deadline --learnt POOL --knowledge FILE` starts from.",
        ),
    ] = False,
    nodes: Annotated[
        bool,
        typer.Option(
            "--nodes",
            help="Each node up now instead: its pool, capacity, GPUs, since when, and the "
            "jobs on it (the names `spotrain preempt` takes).",
        ),
    ] = False,
    output: OutputOption = Output.TABLE,
) -> None:
    """Each pool: nodes, busy and free GPUs, price, and the pending demand it can serve."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    if nodes:
        job_actions.nodes(output)
        return
    job_actions.pools(learnt, output)


def teams(
    as_json: Annotated[bool, typer.Option("--json", help="As -o json.")] = False,
    output: OutputOption = Output.TABLE,
) -> None:
    """Each team: members, guaranteed and borrowable GPUs, GPUs held, borrowed and lent,
    jobs waiting for quota, budget and spend this month."""
    from shared.cli import job_actions  # noqa: PLC0415  # when it runs, not for its help

    job_actions.teams(as_json, output)
