"""How a process reaches the bus; every client reads `SPOTRAIN_NATS_URL`."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Self

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from shared.events import DEFAULT_PREFIX


class Role(StrEnum):
    """The platform's own NATS users, one each; a service's role has the service's name.
    Any other user is a person (`spotrain users add`). The permissions of each are in
    `shared.natsauth`."""

    SUBMITTER = "submitter"
    SCALER = "scaler"
    PREEMPTION_WATCHER = "preemption_watcher"
    CHECKPOINTER = "checkpointer"
    METADATA_AGENT = "metadata_agent"
    CLI = "cli"
    SLACK = "slack"
    UI = "ui"
    OPS = "ops"


def default_stream_name(prefix: str) -> str:
    """The stream of a prefix when none is named: the prefix in capitals."""
    return prefix.upper().replace("-", "_")


class BusSettings(BaseSettings):
    """Connection and stream settings shared by every service and client."""

    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_", extra="ignore", frozen=True, populate_by_name=True
    )

    nats_url: str = Field(
        "nats://127.0.0.1:4222",
        pattern=r"^(nats|tls|ws|wss)://[^\s,]+(,(nats|tls|ws|wss)://[^\s,]+)*$",
    )
    """One server or a comma-separated list, each nats://, tls://, ws:// or wss://."""
    nats_creds_file: str | None = None
    """A NATS credentials file, one per service in production."""
    nats_user: str | None = None
    """A user of the server's own `authorization` block (`spotrain nats-config`)."""
    nats_password: SecretStr | None = None
    nats_inbox_prefix: str = Field("_INBOX", pattern=r"^[A-Za-z0-9_-]+$")
    """Where replies come back; one per role, so that no role can read another's replies."""
    nats_tls_ca_file: Path | None = None
    """The CA that signed the server's certificate, when it is not a public one."""
    nats_tls_cert_file: Path | None = None
    """A client certificate, for a server that verifies clients (mutual TLS)."""
    nats_tls_key_file: Path | None = None
    nats_tls_hostname: str | None = None
    """The name the server's certificate must carry, when it differs from the URL's host."""
    subject_prefix: str = Field(DEFAULT_PREFIX, pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    stream_name: str | None = None
    """Defaults to the subject prefix in capitals."""
    stream_max_age_s: float = Field(30 * 86_400, gt=0)
    """Long enough to replay a month of events after an incident."""
    stream_max_bytes: int = Field(8 * 1024**3, gt=0)
    stream_max_msg_bytes: int = Field(1024**2, gt=0)
    replicas: int = Field(
        1,
        ge=1,
        le=5,
        validation_alias=AliasChoices("SPOTRAIN_REPLICAS", "SPOTRAIN_STREAM_REPLICAS"),
    )
    """Copies of the stream and of every bucket and store, each on its own server: at most
    the cluster's servers. 3 survives the loss of one server of three, and a write is
    acknowledged once two of them hold it; 1 is a single server's."""
    duplicate_window_s: float = Field(120, gt=0)
    connect_timeout_s: float = Field(30, gt=0)
    """How long to keep trying the first connection before giving up."""
    refused_is_final: bool = False
    """Give up the first connection at once when it is refused (nothing listens there)
    rather than retry until `connect_timeout_s`: a person's client says so at once, where
    a service waits for a server that is starting."""
    publish_timeout_s: float = Field(30, gt=0)
    """How long a publish retries through a server restart before it fails."""
    ack_wait_s: float = Field(60, gt=0)

    @model_validator(mode="after")
    def _pairs_are_complete(self) -> Self:
        if self.nats_password is not None and self.nats_user is None:
            msg = "nats_password needs nats_user"
            raise ValueError(msg)
        if (self.nats_tls_cert_file is None) != (self.nats_tls_key_file is None):
            msg = "nats_tls_cert_file and nats_tls_key_file go together"
            raise ValueError(msg)
        return self

    @property
    def nats_servers(self) -> list[str]:
        """`nats_url` as the servers it lists."""
        return self.nats_url.split(",")

    @property
    def stream(self) -> str:
        return self.stream_name or default_stream_name(self.subject_prefix)


CREDENTIALS_VARIABLE = "SPOTRAIN_CREDENTIALS"
DEFAULT_CREDENTIALS = Path("~/.spotrain/credentials")


def credentials_file() -> Path | None:
    """A person's credentials file (`spotrain users add --out`): the one
    `SPOTRAIN_CREDENTIALS` names, else `~/.spotrain/credentials` if there is one."""
    named = os.environ.get(CREDENTIALS_VARIABLE)
    if named:
        return Path(named).expanduser()
    default = DEFAULT_CREDENTIALS.expanduser()
    return default if default.is_file() else None


class ClientBusSettings(BusSettings):
    """A person's connection (the CLI, a notebook, the SDK): their credentials file, with
    whatever the environment sets on top. Services never read it: theirs is their own."""

    refused_is_final: bool = True

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = credentials_file()
        if path is None:
            return (init_settings, env_settings, file_secret_settings)
        from_file = DotEnvSettingsSource(settings_cls, env_file=path, env_prefix="SPOTRAIN_")
        return (init_settings, env_settings, from_file, file_secret_settings)
