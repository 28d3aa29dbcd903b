"""`spotrain`: the one command data scientists and operators type.

It answers at once: the root knows each command by name and summary only, and imports a
command's module (the client, the bus, the event models, the cost ledger) when that
command runs or its own help is asked for. Errors are one line on stderr and a non-zero
exit, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import typer

# Typer 0.29 vendors click: its commands and contexts are those of typer._click.
from typer import _click as click
from typer.core import TyperCommand, TyperGroup

from shared.cli.console import CliError

_LOCAL = "Local stack"
_JOBS = "Jobs"
_CAPACITY = "Capacity and cost"
_OPERATE = "Operate"


@dataclass(frozen=True)
class ListedCommand:
    """A command as the root lists it, before its module is imported."""

    name: str
    module: str
    """Its module, whose `register(app)` adds it (and its neighbours) to an app."""
    summary: str
    panel: str


COMMANDS: tuple[ListedCommand, ...] = (
    ListedCommand("submit", "shared.cli.jobs", "Submit a training job; prints its id.", _JOBS),
    ListedCommand("ls", "shared.cli.jobs", "My jobs: state, attempt, capacity, GPUs, age.", _JOBS),
    ListedCommand("show", "shared.cli.jobs", "A job's record and its event history.", _JOBS),
    ListedCommand("logs", "shared.cli.jobs", "A job's logs from Ray, across its attempts.", _JOBS),
    ListedCommand("watch", "shared.cli.jobs", "A live progress bar: step, loss, ETA.", _JOBS),
    ListedCommand("cancel", "shared.cli.jobs", "Stop a job and its running attempt.", _JOBS),
    ListedCommand("top", "shared.cli.top", "Pools, jobs and cost on one live screen.", _JOBS),
    ListedCommand("ui", "shared.cli.local", "The web page: jobs, their story, cost, pools.", _JOBS),
    ListedCommand(
        "pools", "shared.cli.jobs", "Each pool: nodes, GPUs, price, pending demand.", _CAPACITY
    ),
    ListedCommand(
        "teams", "shared.cli.jobs", "Each team: quota, GPUs held and lent, budget.", _CAPACITY
    ),
    ListedCommand(
        "cost", "shared.cli.cost", "Cost, GPU-hours, waste and the saving on spot.", _CAPACITY
    ),
    ListedCommand("up", "shared.cli.local", "Start the local stack.", _LOCAL),
    ListedCommand("down", "shared.cli.local", "Stop what `spotrain up` started.", _LOCAL),
    ListedCommand("status", "shared.cli.local", "Each part of the local stack, healthy?", _LOCAL),
    ListedCommand(
        "preempt", "shared.cli.local", "Preempt a node as the cloud would: notice, kill.", _LOCAL
    ),
    ListedCommand(
        "demo", "shared.cli.local", "Train on spot, preempt it, watch it resume.", _LOCAL
    ),
    ListedCommand(
        "simulate", "shared.cli.local", "Replay a trace through the scaler's policy.", _OPERATE
    ),
    ListedCommand(
        "events", "shared.cli.events", "The event stream: tail, export, replay, what-if.", _OPERATE
    ),
    ListedCommand("users", "shared.cli.users", "People with credentials of their own.", _OPERATE),
    ListedCommand(
        "nats-config", "shared.cli.nats_config", "A NATS configuration, a user per role.", _OPERATE
    ),
    ListedCommand(
        "schema", "shared.cli.local", "The JSON Schemas of the events, and AsyncAPI.", _OPERATE
    ),
)
_LISTED = {c.name: c for c in COMMANDS}


class LazyCommands(TyperGroup):
    """The root group: it lists every command from `COMMANDS` and builds one only when
    click resolves it to run it, show its help or complete its options."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [c.name for c in COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        built = self.commands.get(cmd_name)
        if built is not None:
            return built
        listed = _LISTED.get(cmd_name)
        if listed is None:
            return None
        # What the root's help reads: a name, a summary and a panel, nothing imported.
        placeholder = TyperCommand(listed.name, help=listed.summary, short_help=listed.summary)
        placeholder.rich_help_panel = listed.panel
        return placeholder

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in _LISTED and args[0] not in self.commands:
            self.commands[args[0]] = build_command(_LISTED[args[0]])
        return super().resolve_command(ctx, args)


def build_command(listed: ListedCommand) -> click.Command:
    """The real click command behind a listed one, from its module."""
    module = importlib.import_module(listed.module)
    holder = typer.Typer()
    module.register(holder)
    command = typer.main.get_group(holder).commands[listed.name]
    command.rich_help_panel = listed.panel  # type: ignore[attr-defined]
    return command


app = typer.Typer(
    name="spotrain",
    cls=LazyCommands,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def spotrain() -> None:
    """Train on many GPUs with one command, on cheap spot capacity that may vanish."""


def main(argv: Sequence[str] | None = None) -> NoReturn:
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
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as error:
        if bus_did_not_answer(error):
            _fail(BUS_DID_NOT_ANSWER, 1)
        if not said_to_the_user(error):
            raise
        _fail(str(error), getattr(error, "exit_code", 1))
    sys.exit(result if isinstance(result, int) else 0)


_USER_ERRORS = {
    "shared.client": ("PlatformError",),
    "shared.localstack.stack": ("StackError",),
    "shared.messaging.jetstream": ("BusPermissionError", "BusAuthenticationError"),
}
"""Errors a command ends with that are the user's news, not a bug: by module, since the
root does not import those modules (a module not imported raised none of them)."""


def said_to_the_user(error: Exception) -> bool:
    """Whether `error` is reported as one line rather than as a traceback."""
    if isinstance(error, CliError):
        return True
    for module_name, names in _USER_ERRORS.items():
        module = sys.modules.get(module_name)
        if module is not None and isinstance(error, tuple(getattr(module, n) for n in names)):
            return True
    return False


BUS_DID_NOT_ANSWER = (
    "the platform's bus did not answer in time (a NATS server lost, or its cluster still "
    "electing a leader); try again in a minute"
)


def bus_did_not_answer(error: Exception) -> bool:
    """Whether `error` is NATS giving up on an answer, after the bus's own tries through a
    leader election: news about the platform, not a bug of the command."""
    errors = sys.modules.get("nats.errors")
    return errors is not None and isinstance(error, errors.TimeoutError)


def _fail(message: str, exit_code: int) -> NoReturn:
    first, *rest = message.strip().splitlines() or ["failed"]
    print(f"spotrain: error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)
    sys.exit(exit_code)
