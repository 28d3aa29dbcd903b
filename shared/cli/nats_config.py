"""`spotrain nats-config`: a NATS server configuration with one user per role."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shared.cli.console import CliError, out
from shared.events import DEFAULT_PREFIX
from shared.natsauth import TABLE, TlsFiles, write_nats_config
from shared.natsauth.files import add_person, person_env, read_people, write_env_file

_PREFIX = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_STREAM = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _person(text: str) -> tuple[str, str, bool]:
    name, _, rest = text.partition("=")
    team, _, role = rest.partition(":")
    if not name or not team or role not in ("", "admin"):
        raise CliError(f"--person {text!r}: NAME=TEAM or NAME=TEAM:admin", 2)
    return name, team, role == "admin"


def register(app: typer.Typer) -> None:
    app.command(name="nats-config")(nats_config)


def nats_config(  # noqa: PLR0917  # a typer command: its options are its parameters
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for the configuration and the credentials.")
    ],
    prefix: Annotated[str, typer.Option(help="The subject prefix of the platform.")] = (
        DEFAULT_PREFIX
    ),
    stream: Annotated[
        str | None, typer.Option(help="The stream's name; the prefix in capitals if unset.")
    ] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="The server's certificate.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The server's private key.")] = None,
    tls_ca: Annotated[
        Path | None, typer.Option(help="The CA of client certificates (and of the server's).")
    ] = None,
    tls_verify: Annotated[
        bool, typer.Option("--tls-verify", help="Require client certificates (mutual TLS).")
    ] = False,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="New passwords, instead of keeping those in --out.")
    ] = False,
    person: Annotated[
        list[str] | None,
        typer.Option(
            "--person",
            help="NAME=TEAM or NAME=TEAM:admin: a credential of their own, which may only ask"
            " the platform's desk (repeat it; people already in --out are kept).",
        ),
    ] = None,
) -> None:
    """Write a nats-server configuration: one user per service and client role, each
    allowed only the subjects its work takes; passwords and per-role env files beside it."""
    if not _PREFIX.match(prefix):
        raise CliError(f"not a subject prefix: {prefix!r} (lower case, digits, '-', '_')", 2)
    if stream is not None and not _STREAM.match(stream):
        raise CliError(f"not a stream name: {stream!r} (letters, digits, '-', '_')", 2)
    if (tls_cert is None) != (tls_key is None):
        raise CliError("--tls-cert and --tls-key go together", 2)
    if tls_cert is None and (tls_ca is not None or tls_verify):
        raise CliError("--tls-ca and --tls-verify need --tls-cert and --tls-key", 2)
    if tls_verify and tls_ca is None:
        raise CliError("--tls-verify needs --tls-ca, the CA client certificates chain to", 2)
    tls = (
        TlsFiles(cert_file=tls_cert, key_file=tls_key, ca_file=tls_ca, verify=tls_verify)
        if tls_cert is not None and tls_key is not None
        else None
    )
    people = [_person(text) for text in person or []]
    try:
        for name, team, admin in people:
            if name not in read_people(out_dir):
                add_person(out_dir, name, team=team, admin=admin)
        written = write_nats_config(out_dir, prefix=prefix, stream=stream, tls=tls, rotate=rotate)
    except ValueError as error:
        raise CliError(f"spotrain nats-config: {error}", 2) from None
    except OSError as error:
        raise CliError(f"cannot write {out_dir}: {error.strerror or error}") from None
    for name, found in read_people(out_dir).items():
        env_file = out_dir / "people" / f"{name}.env"
        env_file.parent.mkdir(exist_ok=True, mode=0o700)
        write_env_file(
            env_file,
            person_env(
                name,
                found,
                prefix=prefix,
                stream=stream,
                tls_ca_file=tls.ca_file if tls else None,
            ),
        )

    table = Table("role (NATS user)", "what it may do", "environment file")
    for spec in TABLE:
        table.add_row(spec.role.value, spec.summary, str(written.env_files[spec.role]))
    out.print(table)
    if read_people(out_dir):
        out.print(
            f"people: {', '.join(read_people(out_dir))}; each one's credentials file is "
            f"{out_dir / 'people'}/<name>.env (SPOTRAIN_CREDENTIALS=<file>, with SPOTRAIN_NATS_URL)"
        )
    out.print(f"server: nats-server --jetstream --config {written.server_config}")
    out.print("a component of a role: set -a; . <environment file>; set +a")
