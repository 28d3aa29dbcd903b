"""The Slack bot's adapters: the platform through the bus and the client SDK, Slack
through slack-sdk's Web API client, and the cost source that knows nothing yet."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp
import nats.errors
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from shared.client import PlatformError, SpotrainClient
from shared.clock import Clock
from shared.events import new_event
from shared.events.data import JobCancelRequested, JobRequested
from shared.jobs import JobRecord
from shared.messaging import EventBus
from shared.policy.cost import CostRow, job_costs
from shared.pools import PoolsStatus
from shared.slack.model import ExperimentCost, JobCost
from shared.slack.ports import ChatRefusedError, ChatUnavailableError, PlatformUnavailableError

# Web API errors that say "not now" rather than "never".
_TRANSIENT_SLACK_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
_UNREACHABLE = (PlatformError, nats.errors.Error, TimeoutError, OSError)


class BusPlatform:
    """`Platform` over the JetStream bus the service runs on."""

    def __init__(self, bus: EventBus, clock: Clock) -> None:
        self._bus = bus
        self._clock = clock
        # The SDK's reads (the jobs and pools buckets) on the service's own connection;
        # the runtime, not the client, closes it.
        self._client = SpotrainClient(bus, clock)

    async def submit(self, request: JobRequested, *, source: str) -> None:
        # Published here rather than with `SpotrainClient.submit`, which names the source
        # `cli/...` and waits for the answer, which the job's thread reports instead.
        event = new_event(request, source=source, time=self._clock.now(), subject=request.job_id)
        try:
            await self._bus.publish(event)
        except _UNREACHABLE as error:
            raise PlatformUnavailableError(str(error)) from error

    async def cancel(self, job_id: str, *, requested_by: str, source: str) -> None:
        data = JobCancelRequested(job_id=job_id, requested_by=requested_by)
        event = new_event(data, source=source, time=self._clock.now(), subject=job_id)
        try:
            await self._bus.publish(event)
        except _UNREACHABLE as error:
            raise PlatformUnavailableError(str(error)) from error

    async def job(self, job_id: str) -> JobRecord | None:
        try:
            return await self._client.job(job_id)
        except _UNREACHABLE as error:
            raise PlatformUnavailableError(str(error)) from error

    async def jobs_of(self, owner: str, limit: int) -> Sequence[JobRecord]:
        try:
            records = await self._client.jobs()
        except _UNREACHABLE as error:
            raise PlatformUnavailableError(str(error)) from error
        return [r for r in records if r.request.owner == owner][:limit]

    async def spend(self) -> PoolsStatus | None:
        try:
            return await self._client.pools()
        except _UNREACHABLE as error:
            raise PlatformUnavailableError(str(error)) from error


class WebApiChat:
    """`Chat` on slack-sdk's `AsyncWebClient` (whose `base_url` tests point at a fake)."""

    def __init__(self, client: AsyncWebClient) -> None:
        self._client = client

    async def post(self, channel: str, text: str, *, thread_ts: str | None = None) -> str:
        try:
            response = await self._client.chat_postMessage(
                channel=channel,
                text=text,
                thread_ts=thread_ts,
                unfurl_links=False,
                unfurl_media=False,
            )
        except SlackApiError as error:
            code = str(error.response.get("error", "unknown_error"))
            if error.response.status_code == 429 or code in _TRANSIENT_SLACK_ERRORS:
                headers = {k.lower(): str(v) for k, v in error.response.headers.items()}
                retry_after = headers.get("retry-after", "")
                delay_s = (
                    float(retry_after) if retry_after.isascii() and retry_after.isdigit() else 5.0
                )
                raise ChatUnavailableError(code, delay_s) from error
            raise ChatRefusedError(code) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ChatUnavailableError(type(error).__name__, 5.0) from error
        return str(response["ts"])


class LedgerCosts:
    """Costs from the platform's own ledger (`shared.policy.cost`): every node-second attributed to
    the attempts that held it; read from the bus on each question."""

    def __init__(self, client: SpotrainClient) -> None:
        self._client = client

    async def job_cost(self, job_id: str) -> JobCost | None:
        row = job_costs(await self._client.costs()).get(job_id)
        if row is None:
            return None
        return JobCost(job_id=job_id, total_usd=float(row.cost_usd), gpu_hours=float(row.gpu_hours))

    async def experiment_costs(self, owner: str) -> Sequence[ExperimentCost] | None:
        ledger = await self._client.costs()
        totals: dict[str, tuple[set[str], CostRow]] = {}
        for charge in ledger.attribution.charges:
            info = ledger.inputs.jobs.get(charge.job_id) if charge.job_id else None
            if info is None or info.owner != owner:
                continue
            experiment = info.experiment or "(none)"
            jobs, row = totals.get(experiment, (set(), CostRow(key=experiment)))
            totals[experiment] = ({*jobs, info.job_id}, row.plus(charge))
        return [
            ExperimentCost(
                experiment=experiment,
                jobs=len(jobs),
                total_usd=float(row.cost_usd),
                gpu_hours=float(row.gpu_hours),
            )
            for experiment, (jobs, row) in sorted(totals.items())
        ]
