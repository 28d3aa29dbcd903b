"""`--secret ENVVAR=NAME`: the attempt gets the platform's secret as an environment
variable; the value is looked up at submission and never enters an event, a record or a
log; a job naming a secret the platform does not have is refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from services.submitter.adapters.secret_files import SecretFiles
from services.submitter.handlers import Deps, on_job_requested
from shared.events.data import JobRequested, RejectionReason
from shared.messaging.memory import InMemoryBus
from shared.policy.teams import parse_teams
from tests.events import job_requested
from tests.fakes.submitter import (
    FakeRay,
    FixedSecrets,
    FixedTeams,
    InMemoryJobStore,
    InMemoryTeamHolds,
    place_queued,
    submitter_deps,
)

TOKEN = "hf_s3cr3t-value-that-must-not-leak"  # noqa: S105  # a fake, to look for leaks


@pytest.fixture
def deps(tmp_path: Path) -> Deps:
    return submitter_deps(tmp_path, secrets=FixedSecrets({"hf-token": TOKEN}))


async def test_the_attempt_gets_the_secret_and_nothing_else_sees_its_value(deps: Deps) -> None:
    with structlog.testing.capture_logs() as logs:
        await on_job_requested(job_requested("j-1", secrets={"HF_TOKEN": "hf-token"}), deps)
        await place_queued(deps)
    ray = deps.ray
    assert isinstance(ray, FakeRay)
    [(plan, _)] = ray.submitted
    assert plan.env_vars["HF_TOKEN"] == TOKEN
    bus = deps.bus
    assert isinstance(bus, InMemoryBus)
    assert all(TOKEN.encode() not in message.data for message in bus.messages)
    store = deps.store
    assert isinstance(store, InMemoryJobStore)
    record, _ = store.records["j-1"]
    assert TOKEN not in record.model_dump_json()
    assert record.request.secrets == {"HF_TOKEN": "hf-token"}
    assert TOKEN not in repr(logs)


async def test_a_secret_the_platform_does_not_have_is_refused(deps: Deps) -> None:
    await on_job_requested(job_requested("j-2", secrets={"API_KEY": "nope"}), deps)
    bus = deps.bus
    assert isinstance(bus, InMemoryBus)
    store = deps.store
    assert isinstance(store, InMemoryJobStore)
    record, _ = store.records["j-2"]
    assert record.rejection is RejectionReason.INVALID
    assert record.detail is not None
    assert record.detail.startswith("the platform has no secret nope (")
    ray = deps.ray
    assert isinstance(ray, FakeRay)
    assert ray.submitted == []


def test_a_variable_is_either_plain_or_a_secret() -> None:
    with pytest.raises(ValueError, match="TOKEN is set both as an environment variable and"):
        JobRequested(
            job_id="j", owner="a", entrypoint=("x",), env={"TOKEN": "x"}, secrets={"TOKEN": "t"}
        )
    with pytest.raises(ValueError, match="secrets"):
        JobRequested(job_id="j", owner="a", entrypoint=("x",), secrets={"TOKEN": "../etc"})


async def test_secret_files_are_read_from_the_folder_only(tmp_path: Path) -> None:
    (tmp_path / "hf-token").write_text(TOKEN + "\n")
    (tmp_path / "nlp").mkdir()
    (tmp_path / "nlp" / "hf-token").write_text("nlp-only\n")
    secrets = SecretFiles(tmp_path)
    assert await secrets.value("hf-token", None) == TOKEN, "the trailing newline is not it"
    assert await secrets.value("missing", None) is None
    # A team's secrets are its folder's: never the platform's top files, nor another's.
    assert await secrets.value("hf-token", "nlp") == "nlp-only"
    assert await secrets.value("hf-token", "vision") is None


TEAMS = parse_teams(
    """
[teams.vision]
members = ["alice"]
[teams.nlp]
members = ["bob"]
"""
)


async def test_a_job_gets_its_own_teams_secrets_only(tmp_path: Path) -> None:
    """Alice (vision) names nlp's secret: refused with one line, and Ray never sees it;
    bob (nlp) gets it."""
    deps = submitter_deps(
        tmp_path,
        secrets=FixedSecrets({"nlp/hf-token": TOKEN}),
        teams=FixedTeams(TEAMS),
        holds=InMemoryTeamHolds(),
    )
    await on_job_requested(
        job_requested("j-a", owner="alice", secrets={"HF_TOKEN": "hf-token"}), deps
    )
    await on_job_requested(
        job_requested("j-b", owner="bob", secrets={"HF_TOKEN": "hf-token"}), deps
    )
    await place_queued(deps)
    store = deps.store
    assert isinstance(store, InMemoryJobStore)
    refused, _ = store.records["j-a"]
    assert refused.rejection is RejectionReason.INVALID
    assert (refused.detail or "").startswith("team vision has no secret hf-token (")
    ray = deps.ray
    assert isinstance(ray, FakeRay)
    assert [(plan.submission_id, plan.env_vars["HF_TOKEN"]) for plan, _ in ray.submitted] == [
        ("j-b-1", TOKEN)
    ]
