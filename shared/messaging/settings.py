"""How a process reaches the bus; every client reads `SPOTRAIN_NATS_URL`."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.events import DEFAULT_PREFIX


class BusSettings(BaseSettings):
    """Connection and stream settings shared by every service and client."""

    model_config = SettingsConfigDict(env_prefix="SPOTRAIN_", extra="ignore", frozen=True)

    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds_file: str | None = None
    """A NATS credentials file, one per service in production."""
    subject_prefix: str = Field(DEFAULT_PREFIX, pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    stream_name: str | None = None
    """Defaults to the subject prefix in capitals."""
    stream_max_age_s: float = Field(30 * 86_400, gt=0)
    """Long enough to replay a month of events after an incident."""
    stream_max_bytes: int = Field(8 * 1024**3, gt=0)
    stream_max_msg_bytes: int = Field(1024**2, gt=0)
    stream_replicas: int = Field(1, ge=1, le=5)
    duplicate_window_s: float = Field(120, gt=0)
    connect_timeout_s: float = Field(30, gt=0)
    """How long to keep trying the first connection before giving up."""
    publish_timeout_s: float = Field(30, gt=0)
    """How long a publish retries through a server restart before it fails."""
    ack_wait_s: float = Field(60, gt=0)

    @property
    def stream(self) -> str:
        return self.stream_name or self.subject_prefix.upper().replace("-", "_")
