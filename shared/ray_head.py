"""Ray's head as the services see it: up, or away. The one place that knows which errors of
Ray's job SDK and GCS client mean "the head does not answer; ask again once it is back"
rather than an answer about a job or a node.

A head is a pod like any other on GKE (evicted, OOM-killed, moved by an upgrade, on a node
that is itself preempted). While it is away the services keep the platform's own state: no
job fails and no node is lost for it, and what Ray would have been asked is asked again.
"""

from __future__ import annotations

import os
import re
import socket
import sys

_SERVER_ERROR = re.compile(r"status code 5\d\d")
"""Ray's job SDK raises RuntimeError("Request failed with status code 503: …") when the
dashboard answers but its GCS does not (a head still starting, or half gone)."""

_RAY_UNAVAILABLE = frozenset({"RpcError", "GetTimeoutError"})
"""Errors of Ray's GCS client when the GCS is gone (by name: `ray` is imported only by the
adapters that call it)."""


def head_replaced(error: BaseException) -> bool:
    """Whether a GCS client made for the head that went talks to its replacement: a head
    back without its state is another cluster, and the client must be made again."""
    return "WrongClusterID" in str(error)


class RayHeadUnavailableError(Exception):
    """Ray's head did not answer (down, or starting again): what was asked is asked again
    once it is back; never a job's failure nor a node's loss."""


def head_unavailable(error: BaseException) -> bool:
    """Whether `error`, raised by a call to Ray, says only that the head did not answer."""
    if isinstance(error, ConnectionError | TimeoutError):
        # The job SDK's own "Failed to connect to Ray" when it is built is a ConnectionError.
        return True
    if isinstance(error, RuntimeError) and _SERVER_ERROR.search(str(error)):
        return True
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & _RAY_UNAVAILABLE:
        return True
    # requests' ConnectionError and Timeout (the job SDK's transport) are not the builtin
    # ones.
    module = type(error).__module__
    return module.startswith(("requests.", "urllib3.")) and bool(
        names & {"ConnectionError", "Timeout", "NewConnectionError", "MaxRetryError"}
    )


def redis_refusal(at: str, secret: str, *, timeout_s: float = 2.0) -> str | None:
    """Why the Redis at `at` (host:port) cannot keep a head's state, in one line; None when
    it answers PING with this password."""
    host, _, port = at.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as connection:
            connection.settimeout(timeout_s)
            request = (
                _command("PING") if not secret else _command("AUTH", secret) + _command("PING")
            )
            connection.sendall(request)
            replies = _replies(connection, 2 if secret else 1)
    except (OSError, ValueError) as error:
        return f"nothing answers as Redis at {at} ({error})"
    if not replies or replies[-1] != "+PONG":
        first_error = next((r for r in replies if r.startswith("-")), "")
        if "WRONGPASS" in first_error or "invalid password" in first_error.lower():
            return f"the Redis at {at} refuses the password"
        if "NOAUTH" in first_error:
            return f"the Redis at {at} wants a password (SPOTRAIN_LOCAL_RAY_REDIS_PASSWORD)"
        return f"the Redis at {at} does not answer PING: {first_error or replies}"
    return None


def _command(*words: str) -> bytes:
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        encoded = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(encoded), encoded))
    return b"".join(parts)


def _replies(connection: socket.socket, count: int) -> list[str]:
    """The first line of each of `count` replies (simple strings and errors are one line)."""
    received = b""
    while received.count(b"\r\n") < count:
        chunk = connection.recv(4096)
        if not chunk:
            break
        received += chunk
    return [line.decode(errors="replace") for line in received.split(b"\r\n")[:count] if line]


def main(argv: list[str]) -> int:
    """`python -m shared.ray_head check-redis`: the chart's pre-install check of the Redis
    that will keep the head's state (SPOTRAIN_RAY_REDIS_ADDRESS, _PASSWORD); one line and
    exit 1 when it cannot."""
    if argv != ["check-redis"]:
        print("usage: python -m shared.ray_head check-redis", file=sys.stderr)
        return 2
    at = os.environ.get("SPOTRAIN_RAY_REDIS_ADDRESS", "")
    if not re.fullmatch(r"[^:\s]+:\d{1,5}", at):
        print(f"SPOTRAIN_RAY_REDIS_ADDRESS={at!r} is not host:port", file=sys.stderr)
        return 2
    why = redis_refusal(at, os.environ.get("SPOTRAIN_RAY_REDIS_PASSWORD", ""))
    if why is not None:
        print(f"ray fault tolerance: {why}", file=sys.stderr)
        return 1
    print(f"the Redis at {at} answers: the head can keep its state there")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
