"""The checkpointer's handlers through the in-memory bus and fakes of its ports."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from services.checkpointer.handlers import (
    Deps,
    on_job_interrupted,
    on_node_lost,
    on_node_preempting,
)
from services.checkpointer.model import LatestCheckpoint, RecoveryConfig
from shared.events import decode, new_event
from shared.events.data import (
    InterruptionCause,
    JobInterrupted,
    JobResumed,
    NodeLost,
    NodePreempting,
    NoticeSource,
)
from shared.jobs import AttemptState
from shared.messaging.memory import InMemoryBus
from tests.events import NOW
from tests.fakes.checkpointer import FakeCheckpoints, FakeJobs, FakePools, FakeRayNodes
from tests.fakes.clock import FixedClock
from tests.unit.test_checkpointer_policy import attempt, record


@pytest.fixture
def deps() -> Deps:
    return Deps(
        bus=InMemoryBus(),
        clock=FixedClock(NOW),
        jobs=FakeJobs(record(attempt(1, AttemptState.RUNNING, nodes=("gpu-spot-1",), step=45))),
        checkpoints=FakeCheckpoints(),
        ray=FakeRayNodes({"gpu-spot-1"}),
        config=RecoveryConfig(),
        pools=FakePools(),
    )


def published(deps: Deps) -> list[Any]:
    assert isinstance(deps.bus, InMemoryBus)
    return [decode(m.data) for m in deps.bus.messages]


def lost(node: str) -> Any:
    return new_event(NodeLost(node=node, source=NoticeSource.LOCAL), source="t", time=NOW)


async def test_a_notice_drains_the_node_and_asks_its_attempts_to_checkpoint(deps: Deps) -> None:
    deadline = NOW + timedelta(seconds=30)
    notice = NodePreempting(node="gpu-spot-1", deadline=deadline, source=NoticeSource.LOCAL)
    await on_node_preempting(new_event(notice, source="t", time=NOW), deps)
    assert isinstance(deps.ray, FakeRayNodes)
    assert deps.ray.drained == [("gpu-spot-1", deadline)]
    assert isinstance(deps.checkpoints, FakeCheckpoints)
    [(uri, request)] = deps.checkpoints.requests
    assert (uri, request.job_id, request.attempt) == ("file:///c/job-1", "job-1", 1)
    assert request.save_by == deadline, "the job is told how long its notice is"
    assert published(deps) == [], "a notice resumes nothing by itself"


async def test_a_lost_node_resumes_its_jobs_once_however_the_news_arrives(deps: Deps) -> None:
    assert isinstance(deps.checkpoints, FakeCheckpoints)
    deps.checkpoints.latest_by_uri["file:///c/job-1"] = LatestCheckpoint("file:///c/s40", 40)
    await on_node_lost(lost("gpu-spot-1"), deps)
    await on_node_lost(lost("gpu-spot-1"), deps)
    interrupted = JobInterrupted(
        job_id="job-1", attempt=1, node="gpu-spot-1", cause=InterruptionCause.NODE_LOST
    )
    await on_job_interrupted(new_event(interrupted, source="submitter", time=NOW), deps)
    events = published(deps)
    assert {event.id for event in events} == {"job-resumed-job-1-2"}, "one id: one resume"
    resumed = events[0].data
    assert isinstance(resumed, JobResumed)
    assert (resumed.attempt, resumed.from_step, resumed.steps_lost) == (2, 40, 5)


async def test_a_node_without_jobs_resumes_nothing(deps: Deps) -> None:
    await on_node_lost(lost("gpu-spot-9"), deps)
    assert published(deps) == []
