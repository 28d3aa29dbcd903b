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

_PREFIX = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_STREAM = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
    try:
        written = write_nats_config(out_dir, prefix=prefix, stream=stream, tls=tls, rotate=rotate)
    except OSError as error:
        raise CliError(f"cannot write {out_dir}: {error.strerror or error}") from None

    table = Table("role (NATS user)", "what it may do", "environment file")
    for spec in TABLE:
        table.add_row(spec.role.value, spec.summary, str(written.env_files[spec.role]))
    out.print(table)
    out.print(f"server: nats-server --jetstream --config {written.server_config}")
    out.print("a component of a role: set -a; . <environment file>; set +a")
