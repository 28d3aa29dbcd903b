"""`spotrain users add`: a person's own credential on a secure local stack. Whatever they
submit or cancel with it is on their own name: the server lets them publish requests on
that name only, and the services take a request only from its sender's own subject."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Annotated

import typer

from shared.cli.console import CliError, err, out
from shared.localstack import stack
from shared.localstack.settings import LocalStackSettings
from shared.messaging.jetstream import BusAuthenticationError, BusUnavailableError, JetStreamBus
from shared.messaging.settings import CREDENTIALS_VARIABLE, BusSettings
from shared.natsauth.files import add_person, person_env, write_env_file
from shared.policy.teams import Teams, membership_refusal
from shared.teams_file import load_teams

users_app = typer.Typer(help="People with credentials of their own (a secure stack).")


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")


@users_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Their name: what their jobs are owned by.")],
    team: Annotated[str, typer.Option("--team", help="The team they belong to.")],
    out_file: Annotated[
        Path, typer.Option("--out", help="Where to write their credentials file (mode 0600).")
    ],
    admin: Annotated[bool, typer.Option("--admin", help="An admin of their team.")] = False,
) -> None:
    """Give someone a credential of their own (again: a new password, the old one stops)."""
    settings = LocalStackSettings()
    if not settings.is_secure:
        raise CliError("people have credentials on a secure stack only: spotrain up --secure", 2)
    if out_file.is_dir():
        raise CliError(f"--out {out_file} is a folder; name the file to write", 2)
    teams = _submitters_teams()
    refusal = membership_refusal(teams, name, team, admin=admin)
    if refusal is not None:
        raise CliError(f"spotrain users add: {refusal}", 2)
    try:
        person = add_person(settings.nats_auth_dir, name, team=team, admin=admin)
    except ValueError as error:
        raise CliError(f"spotrain users add: {error}", 2) from None
    stack.nats_auth(settings)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    write_env_file(out_file, person_env(name, person))
    if not stack.reload_nats(settings):
        err.print("the stack's NATS server is not running: the credential works from the next up")
    elif not asyncio.run(_accepted(settings, person_env(name, person))):
        raise CliError(f"the stack's NATS server did not take {name}'s credential; see its log")
    out.print(
        f"{name} ({'admin of ' if admin else ''}team {team}) submits and cancels as {name}: "
        f"export {CREDENTIALS_VARIABLE}={out_file}",
        soft_wrap=True,
    )
    if teams is None:
        err.print(
            f"no teams file ({TEAMS_FILE_VARIABLE}): the submitter groups nobody, so {name} "
            "reads their own jobs only, and --team and --admin change nothing yet"
        )


TEAMS_FILE_VARIABLE = "SPOTRAIN_SUBMITTER_TEAMS_FILE"
"""The submitter's teams file, as the stack's submitter reads it (the one source of
membership: `users add` agrees with it or refuses)."""


def _submitters_teams() -> Teams | None:
    named = os.environ.get(TEAMS_FILE_VARIABLE) or os.environ.get("SPOTRAIN_TEAMS_FILE")
    if not named:
        return None
    try:
        return load_teams(Path(named))
    except (OSError, ValueError) as error:
        raise CliError(f"spotrain users add: the teams file {named}: {error}", 2) from None


async def _accepted(settings: LocalStackSettings, env: dict[str, str], wait_s: float = 10) -> bool:
    """Whether the server, reloading, lets the new credential in within `wait_s`: the
    command returns once the credential works."""
    fields = {key.removeprefix("SPOTRAIN_").lower(): value for key, value in env.items()}
    bus = BusSettings.model_validate(
        {**fields, "nats_url": settings.nats_url, "connect_timeout_s": 2}
    )
    deadline = time.monotonic() + wait_s
    while True:
        try:
            connected = await JetStreamBus.connect(bus, name="spotrain-users")
        except (BusAuthenticationError, BusUnavailableError):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
            continue
        await connected.close()
        return True
