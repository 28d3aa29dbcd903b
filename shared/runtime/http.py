"""A tiny HTTP endpoint per service: `/metrics` for Prometheus, `/healthz` for probes.

asyncio's own server keeps the services free of a web framework they would use for two
routes; it speaks just enough HTTP/1.1 for Prometheus and kubelet probes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


async def start_http_endpoint(
    host: str,
    port: int,
    is_healthy: Callable[[], bool],
    registry: CollectorRegistry = REGISTRY,
) -> asyncio.Server:
    """Serve until the returned server is closed; `port=0` picks a free port."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                pass
            method, _, target = request_line.decode("latin-1").partition(" ")
            path = target.split(" ", 1)[0].split("?", 1)[0]
            status, content_type, body = _route(method, path, is_healthy, registry)
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(respond, host, port)


def _route(
    method: str, path: str, is_healthy: Callable[[], bool], registry: CollectorRegistry
) -> tuple[int, str, bytes]:
    if method != "GET":
        return 405, "text/plain", b"only GET\n"
    if path == "/metrics":
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)
    if path in ("/healthz", "/readyz"):
        if is_healthy():
            return 200, "text/plain", b"ok\n"
        return 503, "text/plain", b"unhealthy\n"
    return 404, "text/plain", b"not found\n"
