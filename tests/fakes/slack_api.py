"""A local fake of Slack's Web API, for what the bot calls: `auth.test` (Bolt, once) and
`chat.postMessage`, plus response URLs, where Bolt's `respond` posts. It checks the bot
token like Slack does (HTTP 200, `ok: false`), can refuse a channel or rate-limit, and
records every call. Point slack-sdk at it with `AsyncWebClient(base_url=api.url)`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Self

from aiohttp import web


@dataclass(frozen=True)
class Posted:
    """One `chat.postMessage` that Slack accepted."""

    channel: str
    text: str
    thread_ts: str | None
    ts: str


@dataclass(frozen=True)
class Responded:
    """One message posted to a response URL (`/respond/<name>`)."""

    name: str
    text: str
    response_type: str | None


class FakeSlackApi:
    BOT_USER_ID = "UBOT00001"
    TEAM_ID = "T0TEST001"

    def __init__(self, token: str = "xoxb-test-token") -> None:  # noqa: S107  # a fake's token
        self.token = token
        self.posts: list[Posted] = []
        self.responses: list[Responded] = []
        self.calls: list[str] = []
        """Every Web API method called, in order, accepted or not."""
        self._refused: dict[str, str] = {}
        self._rate_limited = 0
        self._ts = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The Web API's base URL, as slack-sdk's `base_url` takes it."""
        return f"http://127.0.0.1:{self.port}/api/"

    def response_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/respond/{name}"

    def refuse(self, channel: str, error: str = "not_in_channel") -> None:
        """Answer every post to `channel` with this error, as Slack does for a channel the
        bot is not in."""
        self._refused[channel] = error

    def rate_limit(self, posts: int) -> None:
        """Answer the next `posts` posts with HTTP 429 and `Retry-After: 1`."""
        self._rate_limited = posts

    def posted_in(self, channel: str) -> list[Posted]:
        return [p for p in self.posts if p.channel == channel]

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_post("/respond/{name}", self._respond)
        self._runner = web.AppRunner(app, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        self.calls.append(method)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        args = await _arguments(request)
        if method == "auth.test":
            return web.json_response(
                {
                    "ok": True,
                    "url": "https://spotrain-test.slack.com/",
                    "team": "spotrain-test",
                    "user": "spotrain",
                    "team_id": self.TEAM_ID,
                    "user_id": self.BOT_USER_ID,
                    "bot_id": "B0TEST001",
                }
            )
        if method == "chat.postMessage":
            return self._post_message(args)
        return web.json_response({"ok": False, "error": "unknown_method"}, status=404)

    def _post_message(self, args: dict[str, Any]) -> web.Response:
        if self._rate_limited > 0:
            self._rate_limited -= 1
            return web.json_response(
                {"ok": False, "error": "ratelimited"}, status=429, headers={"Retry-After": "1"}
            )
        channel = str(args.get("channel", ""))
        if not channel or not args.get("text"):
            return web.json_response({"ok": False, "error": "no_text"})
        if channel in self._refused:
            return web.json_response({"ok": False, "error": self._refused[channel]})
        ts = f"1764500000.{next(self._ts):06d}"
        thread_ts = args.get("thread_ts")
        self.posts.append(
            Posted(channel=channel, text=str(args["text"]), thread_ts=thread_ts, ts=ts)
        )
        return web.json_response(
            {"ok": True, "channel": channel, "ts": ts, "message": {"text": args["text"]}}
        )

    async def _respond(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.responses.append(
            Responded(
                name=request.match_info["name"],
                text=str(body.get("text", "")),
                response_type=body.get("response_type"),
            )
        )
        return web.Response(text="ok")


async def _arguments(request: web.Request) -> dict[str, Any]:
    """Slack takes arguments as JSON, as a form, or in the query string."""
    args: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        args.update(await request.json())
    elif request.can_read_body:
        args.update(await request.post())
    return args
