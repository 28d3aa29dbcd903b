"""Slack's side of the bot: a Bolt `AsyncApp` with the `/train` listener, served by
aiohttp. Bolt checks every request's signature and timestamp; this module only
translates between Bolt and the handlers."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import structlog
from aiohttp import web
from pydantic import ValidationError
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from shared.slack import handlers
from shared.slack.handlers import Deps, SlashCommand
from shared.slack.policy import SeenSignatures

log = structlog.get_logger()
T = TypeVar("T")

MAX_BODY_BYTES = 64 * 1024
"""A slash command's form is a few hundred bytes; anything far larger is not from Slack."""
_TIMESTAMP = re.compile(r"[0-9]{1,12}", re.ASCII)


class InFlight:
    """The submissions still being carried out after Slack got its answer, so that a
    stopping bot finishes them before it closes the bus."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    async def run(self, work: Awaitable[T]) -> T:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await task

    async def wait(self, timeout_s: float) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout_s)


def build_app(
    *, signing_secret: str, client: AsyncWebClient, command: str, deps: Deps, inflight: InFlight
) -> AsyncApp:
    """The Bolt app: request verification on (signature and a timestamp within five
    minutes, as Bolt checks them), one listener for the slash command."""
    app = AsyncApp(
        name="spotrain-slack",
        signing_secret=signing_secret,
        client=client,
        # Bolt's default, spelled out: it must never be switched off, tests included.
        request_verification_enabled=True,
        logger=_bolt_logger(),
    )

    async def on_command(ack: AsyncAck, command: dict[str, Any], respond: AsyncRespond) -> None:
        try:
            slash = SlashCommand.model_validate(command)
        except ValidationError:
            await ack(text=":warning: I cannot read that request (no user or channel).")
            return
        try:
            answer = await handlers.answer(slash, deps)
        except Exception:  # a bug must still answer Slack rather than time it out
            log.exception("slack.command_failed", user=slash.user_id)
            await ack(text=":boom: Something went wrong on our side; it is logged.")
            return
        await ack(text=answer.text, response_type="ephemeral")
        if answer.pending is not None:
            problem = await inflight.run(handlers.carry_out(answer.pending, deps))
            if problem is not None:
                await respond(text=problem, response_type="ephemeral", replace_original=False)

    app.command(command)(on_command)
    return app


def web_app(bolt: AsyncApp, path: str, signing_secret: str) -> web.Application:
    """aiohttp in front of Bolt: POST on `path` only, small bodies only, each signed
    request once."""
    verifier = SignatureVerifier(signing_secret)
    seen = SeenSignatures(seen={})

    async def dispatch(request: web.Request) -> web.Response:
        # Bolt answers a timestamp that is not a number with a 500; it is a forgery, 401.
        timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
        if not _TIMESTAMP.fullmatch(timestamp):
            return web.json_response({"error": "invalid request"}, status=401)
        body = await request.read()
        signature = request.headers.get("X-Slack-Signature", "")
        # Remembered once Slack's signature holds (so no forgery fills the memory), and a
        # request sent again while it would still hold is refused.
        if verifier.is_valid(body, timestamp, signature) and not seen.first_time(
            signature, float(timestamp), time.time()
        ):
            log.warning("slack.replayed", timestamp=timestamp)
            return web.json_response({"error": "this request was taken already"}, status=401)
        bolt_response = await bolt.async_dispatch(await to_bolt_request(request))
        return await to_aiohttp_response(bolt_response)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(path, dispatch)
    return app


class _ToStructlog(logging.Handler):
    """Bolt logs through the standard library; its lines join the service's JSON log."""

    def emit(self, record: logging.LogRecord) -> None:
        log.log(
            record.levelno,
            "slack.bolt",
            message=record.getMessage(),
            logger=record.name,
            exc_info=record.exc_info or False,
        )


def _bolt_logger() -> logging.Logger:
    logger = logging.getLogger("spotrain.slack.bolt")
    if not logger.handlers:
        logger.addHandler(_ToStructlog())
        logger.propagate = False
        logger.setLevel(logging.INFO)
    return logger
