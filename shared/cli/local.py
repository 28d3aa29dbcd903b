"""The local stack's commands: up, down, status, preempt, and the demo, simulate and
schema tools that run on this machine."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from shared.cli.console import CliError, OutputOption, duration_s, err, out, print_table
from shared.cli.tables import Column, Output
from shared.localstack import stack
from shared.localstack.confinement import can_confine
from shared.localstack.market import check_market_pools
from shared.localstack.settings import LocalStackSettings
from shared.spot_traces import SpotMarketOption, parse_spot_market


def register(app: typer.Typer) -> None:
    for command in (up, down, status, ui, schema, demo, preempt):
        app.command()(command)
    app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(simulate)


def up(  # noqa: PLR0917  # a typer command: its options are its parameters
    secure: Annotated[
        bool,
        typer.Option(
            "--secure", help="One NATS user per component, allowed only the subjects it needs."
        ),
    ] = False,
    prometheus: Annotated[
        bool, typer.Option("--prometheus", help="Also run Prometheus, scraping services and Ray.")
    ] = False,
    spot_market: Annotated[
        list[str] | None,
        typer.Option(
            "--spot-market",
            metavar="POOL=FILE[,SPEEDUP]",
            help="The spot pool follows a market trace (../shared/traces/spot), one trace "
            "hour in 3600/SPEEDUP s: growth fails while it is stocked out, held nodes are "
            "preempted with a notice when its count drops. Repeatable.",
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas",
            metavar="N",
            min=1,
            max=3,
            help="N replicas of each service: requests are shared, and the work done once "
            "(resizes, resumes, submissions to Ray) by the replica holding its service's "
            "lease; another takes over within seconds of its loss.",
        ),
    ] = None,
    ray_ft: Annotated[
        bool,
        typer.Option(
            "--ray-ft",
            help="The Ray head keeps its state in Redis (the stack's own redis-server, or "
            "SPOTRAIN_LOCAL_RAY_REDIS_ADDRESS): a head killed and started again finds its "
            "jobs running. Without it a head's loss costs each running job a resume.",
        ),
    ] = False,
    nats_cluster: Annotated[
        int | None,
        typer.Option(
            "--nats-cluster",
            metavar="N",
            min=1,
            max=5,
            help="N NATS servers in one JetStream cluster on loopback: the stream and every "
            "bucket kept on three of them (or N, if fewer), so losing one loses nothing.",
        ),
    ] = None,
) -> None:
    """Start the local stack: NATS JetStream, a Ray head, the four services."""
    markets = _spot_markets(spot_market or [])
    env = LocalStackSettings()  # a flag turns a setting on; without it the environment decides
    settings = LocalStackSettings(
        secure=secure or env.secure,
        prometheus=prometheus or env.prometheus,
        nats_servers=nats_cluster or env.nats_servers,
        service_replicas=replicas or env.service_replicas,
        ray_ft=ray_ft or env.ray_ft,
    )
    statuses = stack.up(
        settings, progress=lambda line: err.print(f"[dim]{line}[/dim]"), markets=markets
    )
    _print_statuses(statuses)
    # One line whatever the terminal's width: a person copies the export whole.
    out.print(
        f"stack is up; state in {settings.home}; export SPOTRAIN_NATS_URL={settings.nats_url}",
        soft_wrap=True,
        highlight=False,
    )
    if not settings.is_secure:
        out.print(f"the web page: {settings.ui_url} (spotrain ui)", soft_wrap=True, highlight=False)
    if settings.is_secure:
        cli_env = settings.nats_auth_dir / "cli.env"
        out.print(
            f"secure bus: load the CLI's credentials with: set -a; . {cli_env}; set +a",
            soft_wrap=True,
        )
        if not can_confine():
            err.print(
                "job code is not confined (that takes root and unshare): a job can read "
                f"this stack's files in {settings.home}",
                soft_wrap=True,
            )


def _spot_markets(values: list[str]) -> list[SpotMarketOption]:
    try:
        options = [parse_spot_market(value) for value in values]
        check_market_pools(options)
    except ValueError as error:
        raise CliError(str(error), 2) from None
    return options


def down() -> None:
    """Stop everything `spotrain up` started, and nothing else."""
    settings = LocalStackSettings()
    stopped = stack.down(settings, progress=lambda line: err.print(f"[dim]{line}[/dim]"))
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def status(output: OutputOption = Output.TABLE) -> None:
    """Show each part of the local stack and whether it is healthy (exit 1 if not)."""
    statuses = stack.status(LocalStackSettings())
    _print_statuses(statuses, output)
    if any(s.state is not stack.State.HEALTHY for s in statuses):
        raise typer.Exit(1)


def ui(
    url: Annotated[
        bool, typer.Option("--url", help="Print the page's address, for scripts; open nothing.")
    ] = False,
) -> None:
    """Open the local stack's web page: jobs, a job's story across its attempts, cost per
    experiment, pools and teams."""
    settings = LocalStackSettings()
    if settings.is_secure:
        raise CliError(
            "a secure stack serves no page: it would show every person's jobs to whoever "
            "opens it (deploy the chart's page behind your cluster's sign-in instead)"
        )
    import webbrowser  # noqa: PLC0415  # only this command opens a browser

    address = settings.ui_url
    if not stack.answers(f"{address}/healthz"):
        raise CliError(f"the page is not up at {address}: start the stack (spotrain up)")
    if url or not webbrowser.open(address):
        print(address)


def schema(
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for the JSON Schemas and AsyncAPI document.")
    ] = Path("docs/events"),
) -> None:
    """Write the JSON Schema of every event and an AsyncAPI 3 document."""
    from shared.events.schema_export import write_documents  # noqa: PLC0415  # rarely used, slow

    written = write_documents(out_dir)
    out.print(f"wrote {len(written)} files to {out_dir}")


def demo(
    workdir: Annotated[Path, typer.Option(help="The folder of examples/train_digits.py.")] = Path(
        "examples"
    ),
    notice: Annotated[
        str, typer.Option(help="Preemption notice, e.g. 10s; 0 preempts without notice.")
    ] = "0",
    preemptions: Annotated[
        int, typer.Option(min=1, max=3, help="Preempt the job this many times in a row.")
    ] = 1,
    timeout: Annotated[
        str | None, typer.Option(help="How long the whole demo may take (5m; 8m with --market).")
    ] = None,
    market: Annotated[
        bool,
        typer.Option(
            "--market",
            help="A deadline job rides a stock-out of the stack's spot market: spot, "
            "on-demand, back to spot (start the stack with `up --spot-market`).",
        ),
    ] = False,
) -> None:
    """Train on a spot node, preempt it mid-run, and watch the job resume from its checkpoint."""
    if market:
        from shared.cli.market_demo import run_market_demo  # noqa: PLC0415  # imports nats

        timeout_s = duration_s(timeout or "8m")
        asyncio.run(run_market_demo(out, workdir=workdir, timeout_s=timeout_s))
        return
    from shared.cli.demo import DemoRun, run_demo  # noqa: PLC0415  # imports nats and numpy

    run = DemoRun(preempt_at_steps=(70, 130, 190)[:preemptions])
    asyncio.run(
        run_demo(
            out,
            workdir=workdir,
            notice_s=duration_s(notice),
            timeout_s=duration_s(timeout or "5m"),
            run=run,
        )
    )


def simulate(context: typer.Context) -> None:
    """Replay a job trace through the scaler's policy and others, `simulate deadline`: one
    job with a deadline on a spot market trace, or `simulate teams`: a trace shared by
    teams under fair share (--help for options)."""
    # The simulator belongs to the scaler, and the CLI may not import a service: it runs
    # as the scaler's own tool, with the arguments as given.
    result = subprocess.run(
        [sys.executable, "-m", "services.scaler.simulation", *context.args], check=False
    )
    if result.returncode:
        raise typer.Exit(result.returncode)


def preempt(
    node: Annotated[
        str | None, typer.Argument(help="A node of the local stack (see `spotrain pools --nodes`).")
    ] = None,
    notice: Annotated[
        str, typer.Option(help="Notice before the kill, e.g. 30s; 0 kills without notice.")
    ] = "30s",
    pick_random: Annotated[
        bool, typer.Option("--random", help="Preempt a running spot node picked at random.")
    ] = False,
    job: Annotated[
        str | None, typer.Option("--job", help="Preempt the node this job's attempt runs on.")
    ] = None,
) -> None:
    """Preempt a node of the local stack as the cloud would: a notice, the deadline, the kill."""
    from shared.localstack.nodes import (  # noqa: PLC0415  # only this command needs them
        NodeFolder,
        NoSuchNodeError,
        pick_node,
    )
    from shared.localstack.nodes import preempt as preempt_node  # noqa: PLC0415

    notice_s = duration_s(notice)
    if sum((node is not None, pick_random, job is not None)) != 1:
        raise CliError("name a node, or pass --random or --job JOB (one of them)", 2)
    if job is not None:
        from shared.cli.job_actions import running_node  # noqa: PLC0415  # imports the client

        node = running_node(job)
    folder = NodeFolder(LocalStackSettings().node_dir)
    try:
        target = pick_node(folder, node, capacity="spot" if pick_random else None)
    except NoSuchNodeError as error:
        raise CliError(str(error)) from None
    done = preempt_node(
        folder,
        target,
        notice_s=notice_s,
        on_notice=lambda n: out.print(
            f"notice posted: {n.node} ({target.pool}) goes at {n.deadline:%H:%M:%S}"
        ),
    )
    out.print(f"preempted {done.node} ({done.pool}): killed {done.processes} processes")


_STATE_COLOURS = {
    stack.State.HEALTHY.value: "green",
    stack.State.UNHEALTHY.value: "red",
    stack.State.STOPPED.value: "dim",
}


def _print_statuses(statuses: list[stack.ComponentStatus], output: Output = Output.TABLE) -> None:
    columns = [
        Column("component"),
        Column("state", style=_STATE_COLOURS.get),
        Column("leads", priority=1),
        Column("endpoint", priority=1),
        Column("pid", priority=2),
    ]
    rows = [
        {
            "component": s.name,
            "state": str(s.state),
            "leads": {True: "yes", False: "-", None: ""}[s.leads],
            "pid": str(s.pid or "-"),
            "endpoint": s.endpoint,
        }
        for s in statuses
    ]
    as_json = [
        {
            "component": s.name,
            "state": str(s.state),
            "leads": s.leads,
            "pid": s.pid,
            "endpoint": s.endpoint,
        }
        for s in statuses
    ]
    print_table(columns, rows, output, as_json)
