"""Declare spotrain's JetStream stream, key-value buckets and object stores (the chart's
pre-install hook).

Runs with the services' image and their SPOTRAIN_* bus settings, and declares through the
services' own code, so the configurations match what each service re-declares at start.
Safe to repeat: an existing stream is brought to these settings, existing buckets are kept.
"""

from __future__ import annotations

import asyncio

import structlog

from services.scaler.adapters.kv_demand import KvDemandStore
from services.submitter.adapters.desk_allowances import KvAllowances
from services.submitter.adapters.kv_job_store import KvJobStore
from services.submitter.adapters.team_holds import KvTeamHolds
from shared.desk import allowances_bucket
from shared.jobs import jobs_bucket, refusals_bucket
from shared.logs import configure_logging
from shared.messaging import BusSettings
from shared.messaging.jetstream import BusSettingsError, JetStreamBus
from shared.policy.teams import teams_bucket
from shared.pools import pools_bucket
from shared.workspace import declare_stores, uploads_bucket, workspaces_bucket

log = structlog.get_logger()


async def declare(settings: BusSettings) -> None:
    bus = await JetStreamBus.connect(settings, name="jetstream-setup")
    try:
        await bus.ensure_stream()
        await KvJobStore.open(bus, jobs_bucket(bus.prefix))
        await KvDemandStore.open(bus, pools_bucket(bus.prefix))
        await KvTeamHolds.open(bus, teams_bucket(bus.prefix))
        await KvAllowances.open(bus, bus.prefix)
        await declare_stores(bus, bus.prefix)
        buckets = [
            jobs_bucket(bus.prefix),
            refusals_bucket(jobs_bucket(bus.prefix)),
            pools_bucket(bus.prefix),
            teams_bucket(bus.prefix),
            workspaces_bucket(bus.prefix),
            uploads_bucket(bus.prefix),
            allowances_bucket(bus.prefix),
        ]
        log.info("jetstream.declared", stream=settings.stream, buckets=buckets)
    finally:
        await bus.close()


def main() -> None:
    configure_logging(json=True, level="info")
    try:
        asyncio.run(declare(BusSettings()))
    except BusSettingsError as error:
        # One line, naming the setting: the Job's log is where an operator looks.
        raise SystemExit(f"jetstream-setup: error: {error}") from None


if __name__ == "__main__":
    main()
