"""`spotrain`: the one command data scientists and operators type.

Errors are one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.table import Table

from shared.cli.console import CliError, err, out
from shared.cli.jobs import register_job_commands
from shared.client import PlatformError
from shared.localstack import stack
from shared.localstack.settings import LocalStackSettings

app = typer.Typer(
    name="spotrain",
    help="Train on many GPUs with one command, on cheap spot capacity that may vanish.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def up() -> None:
    """Start the local stack: NATS JetStream, a Ray head, the four services."""
    settings = LocalStackSettings()
    statuses = stack.up(settings, progress=lambda line: err.print(f"[dim]{line}[/dim]"))
    _print_statuses(statuses)
    out.print(
        f"stack is up; state in {settings.home}; export SPOTRAIN_NATS_URL={settings.nats_url}"
    )


@app.command()
def down() -> None:
    """Stop everything `spotrain up` started, and nothing else."""
    settings = LocalStackSettings()
    stopped = stack.down(settings, progress=lambda line: err.print(f"[dim]{line}[/dim]"))
    out.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def status() -> None:
    """Show each part of the local stack and whether it is healthy (exit 1 if not)."""
    statuses = stack.status(LocalStackSettings())
    _print_statuses(statuses)
    if any(s.state is not stack.State.HEALTHY for s in statuses):
        raise typer.Exit(1)


@app.command()
def schema(
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for the JSON Schemas and AsyncAPI document.")
    ] = Path("docs/events"),
) -> None:
    """Write the JSON Schema of every event and an AsyncAPI 3 document."""
    from shared.events.schema_export import write_documents  # noqa: PLC0415  # rarely used, slow

    written = write_documents(out_dir)
    out.print(f"wrote {len(written)} files to {out_dir}")


@app.command()
def demo(
    timeout_s: Annotated[float, typer.Option(help="How long to wait for the platform.")] = 30,
) -> None:
    """Send a job request through the running stack and show the platform's answer."""
    from shared.cli.demo import run_demo  # noqa: PLC0415  # nats is imported only when needed

    asyncio.run(run_demo(out, timeout_s=timeout_s))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def simulate(context: typer.Context) -> None:
    """Replay a job trace through the scaler's policy and others (--help for options)."""
    # The simulator belongs to the scaler, and the CLI may not import a service: it runs
    # as the scaler's own tool, with the arguments as given.
    result = subprocess.run(
        [sys.executable, "-m", "services.scaler.simulate", *context.args], check=False
    )
    if result.returncode:
        raise typer.Exit(result.returncode)


register_job_commands(app)


def _print_statuses(statuses: list[stack.ComponentStatus]) -> None:
    table = Table("component", "state", "pid", "endpoint")
    colours = {
        stack.State.HEALTHY: "green",
        stack.State.UNHEALTHY: "red",
        stack.State.STOPPED: "dim",
    }
    for s in statuses:
        table.add_row(s.name, f"[{colours[s.state]}]{s.state}[/]", str(s.pid or "-"), s.endpoint)
    out.print(table)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point of the console script."""
    try:
        # Without standalone mode, click returns a command's exit code instead of exiting.
        result = app(args=argv, standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        _fail("aborted", 130)
    except typer.TyperException as error:
        # Usage errors: unknown option, missing or invalid argument.
        message = error.format_message() if hasattr(error, "format_message") else str(error)
        _fail(message, getattr(error, "exit_code", 2))
    except (CliError, stack.StackError, PlatformError) as error:
        _fail(str(error), getattr(error, "exit_code", 1))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    sys.exit(result if isinstance(result, int) else 0)


def _fail(message: str, exit_code: int) -> NoReturn:
    first, *rest = message.strip().splitlines() or ["failed"]
    print(f"spotrain: error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)
    sys.exit(exit_code)
