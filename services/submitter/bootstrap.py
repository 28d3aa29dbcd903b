"""The only place that names the submitter's concrete adapters."""

from __future__ import annotations

from contextlib import AsyncExitStack

from services.submitter import metrics
from services.submitter.adapters.desk_allowances import KvAllowances
from services.submitter.adapters.kv_job_store import KvJobStore
from services.submitter.adapters.progress import StorageProgressReader
from services.submitter.adapters.ray_jobs import RayJobSubmission
from services.submitter.adapters.records_desk import RecordsDesk
from services.submitter.adapters.secret_files import SecretFiles
from services.submitter.adapters.team_holds import KvTeamHolds
from services.submitter.adapters.teams_file import TeamsFile
from services.submitter.adapters.workspaces import ObjectStoreWorkspaces
from services.submitter.handlers import (
    SERVICE,
    SUBSCRIPTIONS,
    Deps,
    admit_waiting,
    track_attempts,
)
from services.submitter.policy import Quotas
from services.submitter.settings import SubmitterSettings
from shared.clock import SystemClock
from shared.jobs import jobs_bucket
from shared.messaging import EventBus, Subscription, bind_routes
from shared.policy.teams import teams_bucket
from shared.pools import PoolsBucket, pools_bucket
from shared.runtime import ServiceDefinition, Ticker, Watch
from shared.workspace import declare_stores, workspaces_bucket


async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
    settings = SubmitterSettings()
    metrics.declare()
    # Declared by their writer at start, never on first use by whoever comes first.
    await declare_stores(bus, bus.prefix)
    # A bad teams file stops the start here, with its one line; once running, a bad edit
    # is refused and the last valid teams stay (TeamsFile).
    teams = TeamsFile(settings.teams_file) if settings.teams_file is not None else None
    holds = await KvTeamHolds.open(bus, teams_bucket(bus.prefix)) if teams is not None else None
    deps = Deps(
        bus=bus,
        clock=SystemClock(),
        store=await KvJobStore.open(
            bus,
            jobs_bucket(bus.prefix),
            refusals_max_age_s=settings.refused_records_max_age_s,
        ),
        ray=RayJobSubmission(settings.ray_address),
        workspaces=ObjectStoreWorkspaces(bus, settings.workspace_cache_dir),
        progress=StorageProgressReader(),
        quotas=Quotas(
            max_gpus_per_job=settings.max_gpus_per_job,
            max_gpus_per_owner=settings.max_gpus_per_owner,
            max_waiting_per_owner=settings.max_waiting_per_owner,
        ),
        checkpoint_root=settings.checkpoint_root,
        teams=teams,
        holds=holds,
        min_runtime_before_preemption_s=settings.min_runtime_before_preemption_s,
        give_way_grace_s=settings.give_way_grace_s,
        short_of_workers_fallback_s=settings.short_of_workers_fallback_s,
        worker_check_interval_s=settings.track_interval_s * 5,
        pools=PoolsBucket(bus.bucket(pools_bucket(bus.prefix))) if teams is not None else None,
        default_max_hours=settings.default_max_hours,
        driver_labels=settings.driver_labels,
        admission_view_max_age_s=settings.admission_view_max_age_s,
        secrets=SecretFiles(settings.secrets_dir),
        workspace_bucket=workspaces_bucket(bus.prefix),
    )

    async def track() -> None:
        await track_attempts(deps)

    async def give_quota() -> None:
        await admit_waiting(deps)

    # Quota frees for owners as for teams: waiting jobs are looked at with or without one.
    tickers = [
        # Submissions to Ray and admissions from the queue, once: by the lease's holder.
        # Requests are shared by every replica through the durable consumer.
        Ticker(
            name="track-attempts",
            interval_s=settings.track_interval_s,
            tick=track,
            leader_only=True,
        ),
        Ticker(
            name="admit-waiting",
            interval_s=settings.track_interval_s,
            tick=give_quota,
            leader_only=True,
        ),
    ]

    # People with credentials of their own read jobs through the desk, never the bucket.
    # A person's share of requests is theirs across the replicas, not theirs from each.
    allowances = await KvAllowances.open(bus, bus.prefix)
    desk = RecordsDesk(bus, deps.store, teams, deps.ray, allowances, kept=deps.progress)

    return ServiceDefinition(
        name=SERVICE,
        subscriptions=[
            Subscription(
                service=SERVICE,
                routes=bind_routes(SUBSCRIPTIONS, deps),
                max_concurrency=settings.max_concurrency,
            )
        ],
        tickers=tickers,
        watches=[Watch(name="records-desk", run=desk.run)],
    )
