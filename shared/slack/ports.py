"""What the Slack bot needs from the world, each with the semantics it relies on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from shared.events.data import JobRequested
from shared.jobs import JobRecord
from shared.pools import PoolsStatus
from shared.slack.model import ExperimentCost, JobCost


class PlatformUnavailableError(RuntimeError):
    """The bus or a bucket did not answer; nothing was changed. Retry later."""


class Platform(Protocol):
    """The platform as the bus shows it: requests go out as events, state is read from
    the buckets their single writers keep. Reads are eventually consistent: a job just
    requested has no record until the submitter admits it."""

    async def submit(self, request: JobRequested, *, source: str) -> None:
        """Publish `job.requested`; the submitter answers on the bus, not here."""
        ...

    async def cancel(self, job_id: str, *, requested_by: str, source: str) -> None:
        """Publish `job.cancel_requested`; idempotent for the submitter."""
        ...

    async def job(self, job_id: str) -> JobRecord | None:
        """The job's record; None when the submitter has none (yet)."""
        ...

    async def jobs_of(self, owner: str, limit: int) -> Sequence[JobRecord]:
        """The owner's most recent jobs, newest first."""
        ...

    async def spend(self) -> PoolsStatus | None:
        """The scaler's latest view of the pools and what they cost per hour; None before
        its first pass."""
        ...


class ChatRefusedError(Exception):
    """Slack refused the message for good (`not_in_channel`, `channel_not_found`,
    `is_archived`, a bad token): sending it again changes nothing."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class ChatUnavailableError(Exception):
    """Slack could not take the message now (rate limited, down); try again after
    `retry_after_s`."""

    def __init__(self, error: str, retry_after_s: float) -> None:
        super().__init__(error)
        self.retry_after_s = retry_after_s


class Chat(Protocol):
    """Slack's Web API as the bot uses it. Not idempotent: a retried post may show twice."""

    async def post(self, channel: str, text: str, *, thread_ts: str | None = None) -> str:
        """Post a message, in a thread when `thread_ts` is given; returns the message's
        `ts`, which a reply uses as its `thread_ts`. Raises `ChatRefusedError` or
        `ChatUnavailableError`."""
        ...


class CostSource(Protocol):
    """What jobs and experiments cost. None means cost is not known at all, which the
    bot says plainly, as opposed to a known cost of zero."""

    async def job_cost(self, job_id: str) -> JobCost | None: ...

    async def experiment_costs(self, owner: str) -> Sequence[ExperimentCost] | None: ...
