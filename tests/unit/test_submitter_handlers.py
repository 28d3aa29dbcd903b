"""The submitter's handlers through the in-memory bus."""

from __future__ import annotations

from services.submitter.handlers import Deps, on_job_requested
from shared.events import decode, subject_for
from shared.events.data import JobAccepted
from shared.messaging.memory import InMemoryBus
from tests.events import job_requested
from tests.fakes.clock import FixedClock


async def test_a_request_is_accepted_once_however_often_it_arrives() -> None:
    bus = InMemoryBus()
    clock = FixedClock()
    deps = Deps(bus=bus, clock=clock)
    request = job_requested("job-7", experiment="resnet")
    await on_job_requested(request, deps)
    await on_job_requested(request, deps)
    [stored] = await bus.read(subject_for(JobAccepted))
    accepted = decode(stored.data)
    assert accepted.data == JobAccepted(job_id="job-7", owner="alice", experiment="resnet")
    assert accepted.time == clock.now()
    assert accepted.subject == "job-7"
