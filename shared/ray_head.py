"""Ray's head as the services see it: up, or away. The one place that knows which errors of
Ray's job SDK and GCS client mean "the head does not answer; ask again once it is back"
rather than an answer about a job or a node.

A head is a pod like any other on GKE (evicted, OOM-killed, moved by an upgrade, on a node
that is itself preempted). While it is away the services keep the platform's own state: no
job fails and no node is lost for it, and what Ray would have been asked is asked again.
"""

from __future__ import annotations

import re

_SERVER_ERROR = re.compile(r"status code 5\d\d")
"""Ray's job SDK raises RuntimeError("Request failed with status code 503: …") when the
dashboard answers but its GCS does not (a head still starting, or half gone)."""

_RAY_UNAVAILABLE = frozenset({"RpcError", "GetTimeoutError"})
"""Errors of Ray's GCS client when the GCS is gone (by name: `ray` is imported only by the
adapters that call it)."""


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
