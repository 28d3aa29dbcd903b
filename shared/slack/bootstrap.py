"""The only place that names the Slack bot's concrete adapters."""

from __future__ import annotations

from contextlib import AsyncExitStack

import structlog
from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from shared.client import SpotrainClient, new_job_id
from shared.clock import SystemClock
from shared.messaging import EventBus, Subscription, bind_routes
from shared.runtime import ServiceDefinition
from shared.runtime.service import Bootstrap
from shared.slack.adapters import BusPlatform, LedgerCosts, WebApiChat
from shared.slack.app import InFlight, build_app, web_app
from shared.slack.handlers import SERVICE, SUBSCRIPTIONS, Deps
from shared.slack.settings import SlackSettings
from shared.teams_file import load_teams

log = structlog.get_logger()


def bootstrap_for(settings: SlackSettings) -> Bootstrap:
    """The bot's bootstrap, for `shared.runtime.serve`: it listens for Slack on
    `settings.port` and consumes job events on the bus."""

    async def bootstrap(bus: EventBus, stack: AsyncExitStack) -> ServiceDefinition:
        clock = SystemClock()
        client = AsyncWebClient(
            token=settings.bot_token.get_secret_value(), base_url=settings.api_base_url
        )
        deps = Deps(
            platform=BusPlatform(bus, clock),
            chat=WebApiChat(client),
            costs=LedgerCosts(SpotrainClient(bus, clock)),
            clock=clock,
            owners=settings.owners,
            projects=settings.projects,
            new_job_id=lambda project: new_job_id([project]),
            command=settings.command,
            answer_within_s=settings.answer_within_s,
            teams=load_teams(settings.teams_file) if settings.teams_file is not None else None,
        )
        inflight = InFlight()
        # Closed in reverse: stop taking requests, finish the submissions under way, and
        # only then does the runtime close the bus.
        stack.push_async_callback(inflight.wait, settings.grace_period_s)
        bolt = build_app(
            signing_secret=settings.signing_secret.get_secret_value(),
            client=client,
            command=settings.command,
            deps=deps,
            inflight=inflight,
        )
        runner = web.AppRunner(
            web_app(bolt, settings.path, settings.signing_secret.get_secret_value()),
            shutdown_timeout=settings.grace_period_s,
        )
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        log.info(
            "slack.listening",
            host=settings.host,
            port=settings.port,
            path=settings.path,
            command=settings.command,
            owners=len(settings.owners),
            projects=sorted(settings.projects),
        )
        return ServiceDefinition(
            name=SERVICE,
            subscriptions=[
                # One at a time, so that a thread reads in the order things happened.
                Subscription(
                    service=SERVICE, routes=bind_routes(SUBSCRIPTIONS, deps), max_concurrency=1
                )
            ],
        )

    return bootstrap
