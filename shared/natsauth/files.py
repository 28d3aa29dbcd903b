"""Writes a NATS configuration folder: the server's configuration, the passwords, and one
environment file per role that a component loads to connect as that role."""

from __future__ import annotations

import os
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from shared.desk import person_inbox_prefix
from shared.events import DEFAULT_PREFIX
from shared.events.types import Name
from shared.messaging.settings import Role, default_stream_name
from shared.natsauth.permissions import (
    TABLE,
    BusNames,
    inbox_prefix,
    permissions,
    person_permissions,
)
from shared.natsauth.server_config import (
    CREDENTIALS_FILE,
    SERVER_CONFIG_FILE,
    TlsFiles,
    password_variable,
    render_credentials,
    render_server_config,
)

_SECRET_MODE = 0o600
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")
"""A person's name, as an event's `Name` takes it."""
PEOPLE_FILE = "people.json"
"""The people with credentials of their own, their teams and passwords (mode 0600)."""


@dataclass(frozen=True)
class NatsConfig:
    """What `write_nats_config` wrote, and the environment each role connects with."""

    directory: Path
    server_config: Path
    """Start the server with `nats-server --config <this>` (flags may add ports, store)."""
    credentials: Path
    env_files: Mapping[Role, Path]
    """`<role>.env`, mode 0600: `set -a; . <file>` or a Kubernetes secret."""
    environments: Mapping[Role, Mapping[str, str]]

    @property
    def server_argv(self) -> list[str]:
        """What to add to nats-server's command line (after `--jetstream`, ports, store)."""
        return ["--config", str(self.server_config)]

    def env(self, role: Role | str) -> dict[str, str]:
        """The `SPOTRAIN_*` variables a component of this role needs besides the URL."""
        return dict(self.environments[Role(role)])


def role_env(
    role: Role,
    password: str,
    *,
    prefix: str,
    stream: str | None,
    tls_ca_file: Path | None,
) -> dict[str, str]:
    """The settings a role's component reads (`BusSettings`, env prefix `SPOTRAIN_`)."""
    env = {
        "SPOTRAIN_NATS_USER": role.value,
        "SPOTRAIN_NATS_PASSWORD": password,
        "SPOTRAIN_NATS_INBOX_PREFIX": inbox_prefix(role),
        "SPOTRAIN_SUBJECT_PREFIX": prefix,
    }
    if stream is not None:
        env["SPOTRAIN_STREAM_NAME"] = stream
    if tls_ca_file is not None:
        env["SPOTRAIN_NATS_TLS_CA_FILE"] = str(tls_ca_file)
    return env


def write_nats_config(
    directory: Path,
    *,
    prefix: str = DEFAULT_PREFIX,
    stream: str | None = None,
    tls: TlsFiles | None = None,
    rotate: bool = False,
    server_name: str | None = None,
) -> NatsConfig:
    """Write `nats-server.conf`, `credentials.conf` and `<role>.env` into `directory`.

    Idempotent: the passwords already in the folder are kept, so a running server and its
    clients stay in step, unless `rotate` asks for new ones. `tls.ca_file` is taken to be
    the CA of the server's certificate too, for the clients' environment.
    """
    names = BusNames(prefix=prefix, stream=stream or default_stream_name(prefix))
    passwords = {} if rotate else read_passwords(directory / CREDENTIALS_FILE)
    passwords = {spec.role: passwords.get(spec.role) or _new_password() for spec in TABLE}
    people = read_people(directory)

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    credentials = directory / CREDENTIALS_FILE
    _write_secret(
        credentials,
        render_credentials(passwords, {name: p.password for name, p in people.items()}),
    )
    server_config = directory / SERVER_CONFIG_FILE
    text = render_server_config(
        permissions(names),
        prefix=prefix,
        stream=names.stream,
        tls=tls,
        people={name: person_permissions(name, names) for name in people},
        server_name=server_name,
    )
    server_config.write_text(text, encoding="utf-8")

    environments = {
        role: role_env(
            role,
            password,
            prefix=prefix,
            stream=stream,
            tls_ca_file=tls.ca_file if tls else None,
        )
        for role, password in passwords.items()
    }
    env_files = {}
    for role, env in environments.items():
        env_files[role] = directory / f"{role.value}.env"
        write_env_file(env_files[role], env)
    return NatsConfig(
        directory=directory,
        server_config=server_config,
        credentials=credentials,
        env_files=env_files,
        environments=environments,
    )


class Person(BaseModel):
    """Someone with a credential of their own (`spotrain users add`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    team: Name
    admin: bool = False
    password: str


class People(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    people: dict[Name, Person] = {}


def read_people(directory: Path) -> dict[str, Person]:
    """The people of the folder's `people.json`; none when there is no such file."""
    path = directory / PEOPLE_FILE
    if not path.is_file():
        return {}
    return dict(People.model_validate_json(path.read_text(encoding="utf-8")).people)


def add_person(directory: Path, name: str, *, team: str, admin: bool = False) -> Person:
    """Give `name` a credential of their own in the folder (a new password if they had
    one: adding again is how a credential is replaced). A ValueError if the name is taken
    by a role, or is not a name; rewrite the configuration (`write_nats_config`) and have
    the server reload it for the credential to work."""
    for what, value in (("", name), ("team ", team)):
        if not _NAME.fullmatch(value):
            rule = "letters, digits and . _ @ -, from a letter or digit"
            msg = f"{what}{value!r} is not a name: {rule}"
            raise ValueError(msg)
    if name in {role.value for role in Role}:
        raise ValueError(f"{name!r} is a service's or a client role's name, not a person's")
    person = Person(team=team, admin=admin, password=_new_password())
    people = People(people={**read_people(directory), name: person})
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_secret(directory / PEOPLE_FILE, people.model_dump_json(indent=2))
    return person


def person_env(
    name: str,
    person: Person,
    *,
    prefix: str = DEFAULT_PREFIX,
    stream: str | None = None,
    tls_ca_file: Path | None = None,
) -> dict[str, str]:
    """What a person's CLI, notebook or SDK connects with (their credentials file)."""
    env = {
        "SPOTRAIN_NATS_USER": name,
        "SPOTRAIN_NATS_PASSWORD": person.password,
        "SPOTRAIN_NATS_INBOX_PREFIX": person_inbox_prefix(name),
        "SPOTRAIN_SUBJECT_PREFIX": prefix,
    }
    if stream is not None:
        env["SPOTRAIN_STREAM_NAME"] = stream
    if tls_ca_file is not None:
        env["SPOTRAIN_NATS_TLS_CA_FILE"] = str(tls_ca_file)
    return env


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """An environment file (`KEY=value` lines, shell-quoted), never readable by others."""
    lines = [f"{key}={shlex.quote(value)}" for key, value in env.items()]
    _write_secret(path, "\n".join([*lines, ""]))


def read_passwords(credentials: Path) -> dict[Role, str]:
    """The passwords of an earlier `write_nats_config`; none when there is no such file."""
    if not credentials.is_file():
        return {}
    by_variable = {password_variable(role): role for role in Role}
    found = {}
    for line in credentials.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r'([A-Z_]+): "([A-Za-z0-9_-]+)"', line.strip())
        if match and match.group(1) in by_variable:
            found[by_variable[match.group(1)]] = match.group(2)
    return found


def _new_password() -> str:
    return secrets.token_urlsafe(24)


def _write_secret(path: Path, text: str) -> None:
    """Written beside and renamed into place, never readable by others, not even briefly."""
    staging = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _SECRET_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        staging.replace(path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
