"""The Slack bot's value types: who asked, from where, and the projects it may run.

Plain data, no I/O: the policy, the handlers and the settings all speak in these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from shared.events.types import EnvName, Frozen, ShortText

SlackUserId = Annotated[str, StringConstraints(pattern=r"^[UW][A-Z0-9]{2,31}$")]
"""A Slack user id (`U…`, or `W…` on Enterprise Grid): stable, unlike display names."""
ChannelId = Annotated[str, StringConstraints(pattern=r"^[CDG][A-Z0-9]{2,31}$")]
"""A public channel (`C…`), a private one (`G…`) or a direct message (`D…`)."""
MessageTs = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,12}\.[0-9]{1,9}$")]
"""A message's `ts`, which is also the id of the thread it starts."""
ProjectName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")]

# Where a job's updates go, kept in the job's own labels: they travel with the request
# into the submitter's record, so the bot keeps no state of its own and survives restarts.
LABEL_CHANNEL = "slack-channel"
LABEL_THREAD = "slack-thread"
LABEL_USER = "slack-user"


class Origin(Frozen):
    """Where a request came from in Slack, and so where its job's updates go."""

    channel: ChannelId
    user: SlackUserId
    thread_ts: MessageTs | None = None

    def labels(self) -> dict[str, str]:
        labels = {LABEL_CHANNEL: self.channel, LABEL_USER: self.user}
        if self.thread_ts is not None:
            labels[LABEL_THREAD] = self.thread_ts
        return labels

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Self | None:
        """The origin a job's labels name; None when they name none, or not a valid one."""
        channel, user = labels.get(LABEL_CHANNEL), labels.get(LABEL_USER)
        if channel is None or user is None:
            return None
        try:
            return cls(channel=channel, user=user, thread_ts=labels.get(LABEL_THREAD))
        except ValueError:
            return None


class Project(BaseModel):
    """A training entrypoint registered with the bot: Slack has no working directory to
    pack, so `/train submit NAME` runs code that is already in the training image."""

    # Not strict: settings arrive as JSON, where an argv is a list.
    model_config = ConfigDict(frozen=True, extra="forbid")

    entrypoint: Annotated[tuple[ShortText, ...], Field(min_length=1, max_length=64)]
    """The command, as an argv list, relative to the image's working directory."""
    description: Annotated[str, Field(max_length=200)] = ""
    env: Annotated[dict[EnvName, Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = (
        Field(default_factory=dict)
    )


class JobCost(Frozen):
    """What one job has cost so far."""

    job_id: str
    total_usd: Annotated[float, Field(ge=0)]
    gpu_hours: Annotated[float, Field(ge=0)]


class ExperimentCost(Frozen):
    """What one owner's experiment has cost so far, all its jobs together."""

    experiment: str
    jobs: Annotated[int, Field(ge=0)]
    total_usd: Annotated[float, Field(ge=0)]
    gpu_hours: Annotated[float, Field(ge=0)]
