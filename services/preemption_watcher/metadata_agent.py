"""python -m services.preemption_watcher.metadata_agent: the `metadata` source as an agent on
each node (a DaemonSet on GKE), relaying its own VM's preemption notice onto the bus."""

from __future__ import annotations

import asyncio
import sys
from contextlib import AsyncExitStack

from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from services.preemption_watcher.adapters.gce_metadata import (
    DEFAULT_METADATA_URL,
    GKE_POOL_LABEL,
    SPOT_NOTICE_S,
    MetadataClient,
    MetadataNoticeSource,
)
from services.preemption_watcher.handlers import Deps, relay
from services.preemption_watcher.policy import Backoff
from shared.clock import Clock, SystemClock
from shared.events.types import Name
from shared.messaging import EventBus
from shared.runtime import RuntimeSettings, ServiceDefinition, Watch, run
from shared.runtime.service import Bootstrap
from shared.setting_errors import setting_error_line

AGENT = "metadata_agent"


class MetadataAgentSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_METADATA_AGENT_", extra="ignore", frozen=True
    )

    metadata_url: str = Field(DEFAULT_METADATA_URL, pattern=r"^http://[^/?#\s]+(/[^?#\s]*)?$")
    """The metadata server's `computeMetadata/v1`; another one only for a local fake."""
    notice_s: float = Field(SPOT_NOTICE_S, gt=0, le=3600)
    """How long the VM has once `preempted` turns TRUE: the notice's deadline."""
    node: Name | None = None
    """The node's name (on GKE, the downward API's `spec.nodeName`); if unset, read from
    `instance/name`, which GKE's metadata server does not serve."""
    pool: Name | None = None
    """The node's pool; if unset, read from GKE's node labels in the instance attributes."""
    pool_label: str = GKE_POOL_LABEL
    poll_timeout_s: int = Field(60, ge=1, le=3600)
    """`timeout_sec` of each long poll: the server answers at least this often."""
    connect_timeout_s: float = Field(2, gt=0)
    retry_first_s: float = Field(0.5, gt=0)
    retry_cap_s: float = Field(30, gt=0)


def agent_bootstrap(settings: MetadataAgentSettings, clock: Clock | None = None) -> Bootstrap:
    """The agent's wiring: one watch, the metadata source relayed as the watcher relays its own."""

    async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
        deps = Deps(bus=bus, clock=clock or SystemClock())
        source = MetadataNoticeSource(
            MetadataClient(settings.metadata_url, connect_timeout_s=settings.connect_timeout_s),
            deps.clock,
            node=settings.node,
            pool=settings.pool,
            pool_label=settings.pool_label,
            notice_s=settings.notice_s,
            poll_timeout_s=settings.poll_timeout_s,
            backoff=Backoff(first_s=settings.retry_first_s, cap_s=settings.retry_cap_s),
        )

        async def watch(stop: asyncio.Event) -> None:
            await relay(source, deps, stop)

        return ServiceDefinition(name=AGENT, watches=[Watch(name="source-metadata", run=watch)])

    return bootstrap


def main() -> None:
    try:
        settings = MetadataAgentSettings()
    except ValidationError as error:
        sys.stderr.write(f"{AGENT}: error: {setting_error_line(error)}\n")
        raise SystemExit(2) from None
    run(AGENT, agent_bootstrap(settings), lambda: settings)


if __name__ == "__main__":
    main()
