"""The Slack bot's decisions: submissions, who may see or cancel a job, what a job's
thread hears; and that the deciding modules stay pure."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.events.data import (
    EventData,
    InterruptionCause,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobProgress,
    JobRejected,
    JobRequested,
    JobResumed,
    JobStarted,
    JobSucceeded,
    RejectionReason,
)
from shared.events.types import CapacityClass
from shared.jobs import JobRecord, JobState
from shared.policy.teams import parse_teams
from shared.slack import replies
from shared.slack.commands import Submit
from shared.slack.model import JobCost, Origin, Project
from shared.slack.policy import (
    Allowed,
    Post,
    Refusal,
    Refused,
    SeenSignatures,
    Skip,
    SkipReason,
    may_cancel,
    may_see,
    notice_for,
    owner_of,
    plan_submission,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ALICE, BOB = "UALICE001", "UBOB00001"
OWNERS = {ALICE: "alice", BOB: "bob"}
PROJECTS = {
    "digits": Project(entrypoint=("python", "examples/train_digits.py"), env={"DATA_DIR": "/data"})
}
ORIGIN = Origin(channel="CTRAINING1", user=ALICE, thread_ts="1764500000.000001")


def record(
    job_id: str = "digits-3f9a1c",
    owner: str = "alice",
    state: JobState = JobState.RUNNING,
    labels: dict[str, str] | None = None,
) -> JobRecord:
    request = JobRequested(
        job_id=job_id,
        owner=owner,
        entrypoint=("python", "train.py"),
        labels=ORIGIN.labels() if labels is None else labels,
    )
    return JobRecord(
        request=request, request_event_id="e1", state=state, accepted_at=NOW, updated_at=NOW
    )


def test_a_slack_user_acts_as_the_owner_they_are_mapped_to() -> None:
    assert owner_of(ALICE, OWNERS) == "alice"
    assert owner_of("UNOBODY01", OWNERS) is None


def test_a_submission_runs_the_registered_entrypoint_as_the_mapped_owner() -> None:
    """Project argv + the user's arguments; resources, capacity and the Slack origin."""
    command = Submit(
        project="digits", args=("--lr", "0.1"), gpus=2, workers=2, capacity=CapacityClass.SPOT
    )
    origin = Origin(channel="CTRAINING1", user=ALICE)

    plan = plan_submission(
        command, owner="alice", origin=origin, projects=PROJECTS, job_id="digits-3f9a1c"
    )

    assert isinstance(plan, JobRequested)
    assert plan.job_id == "digits-3f9a1c"
    assert plan.owner == "alice"
    assert plan.entrypoint == ("python", "examples/train_digits.py", "--lr", "0.1")
    assert (plan.worker.gpus, plan.num_workers, plan.capacity) == (2, 2, CapacityClass.SPOT)
    assert plan.experiment == "digits", "the project names the experiment by default"
    assert plan.labels == {"slack-channel": "CTRAINING1", "slack-user": ALICE}
    assert plan.env == {"DATA_DIR": "/data"}
    assert plan.working_dir is None


@pytest.mark.parametrize(
    ("command", "owner", "reason"),
    [
        pytest.param(Submit(project="nope"), "alice", Refusal.UNKNOWN_PROJECT, id="unknown"),
        pytest.param(
            Submit(project="digits"), "not a name", Refusal.INVALID_REQUEST, id="invalid-owner"
        ),
    ],
)
def test_a_submission_that_cannot_run_is_refused(
    command: Submit, owner: str, reason: Refusal
) -> None:
    plan = plan_submission(
        command, owner=owner, origin=ORIGIN, projects=PROJECTS, job_id="digits-3f9a1c"
    )
    assert isinstance(plan, Refused)
    assert plan.reason is reason


@pytest.mark.parametrize(
    ("found", "see", "cancel"),
    [
        pytest.param(record(), None, None, id="own-running-job"),
        pytest.param(None, Refusal.NO_SUCH_JOB, Refusal.NO_SUCH_JOB, id="no-such-job"),
        pytest.param(
            record(owner="bob"), Refusal.NOT_YOUR_JOB, Refusal.NOT_YOUR_JOB, id="bobs-job"
        ),
        pytest.param(
            record(owner="bob", state=JobState.SUCCEEDED),
            Refusal.NOT_YOUR_JOB,
            Refusal.NOT_YOUR_JOB,
            id="bobs-ended-job-says-not-yours-first",
        ),
        pytest.param(
            record(state=JobState.SUCCEEDED), None, Refusal.ALREADY_ENDED, id="own-ended-job"
        ),
    ],
)
def test_a_user_sees_and_cancels_their_own_jobs_only(
    found: JobRecord | None, see: Refusal | None, cancel: Refusal | None
) -> None:
    for decision, expected in (
        (may_see("alice", "digits-3f9a1c", found), see),
        (may_cancel("alice", "digits-3f9a1c", found), cancel),
    ):
        if expected is None:
            assert decision == Allowed(found)  # type: ignore[arg-type]
        else:
            assert isinstance(decision, Refused)
            assert decision.reason is expected
            assert decision.subject == "digits-3f9a1c"


TEAMS = parse_teams(
    """
[teams.vision]
members = ["alice", "bob", "carol"]
admins = ["carol"]
[teams.nlp]
members = ["dave"]
admins = ["dave"]
"""
)


@pytest.mark.parametrize(
    ("who", "refusal"),
    [
        pytest.param("bob", None, id="the-owner"),
        pytest.param("carol", None, id="an-admin-of-the-owners-team"),
        pytest.param("alice", Refusal.NOT_YOUR_JOB, id="a-member-of-the-same-team"),
        pytest.param("dave", Refusal.NOT_YOUR_JOB, id="an-admin-of-another-team"),
    ],
)
def test_a_team_admin_may_cancel_the_teams_jobs_from_slack(
    who: str, refusal: Refusal | None
) -> None:
    """The submitter's rule (it decides in the end), so that Slack does not refuse first."""
    bobs = record(owner="bob")
    decision = may_cancel(who, "digits-3f9a1c", bobs, teams=TEAMS)
    if refusal is None:
        assert decision == Allowed(bobs)
    else:
        assert isinstance(decision, Refused)
        assert decision.reason is refusal
    ended = record(owner="bob", state=JobState.SUCCEEDED)
    if refusal is None:
        later = may_cancel(who, "digits-3f9a1c", ended, teams=TEAMS)
        assert isinstance(later, Refused)
        assert later.reason is Refusal.ALREADY_ENDED


JOB = "`digits-3f9a1c`"


@pytest.mark.parametrize(
    ("data", "text"),
    [
        pytest.param(
            JobAccepted(job_id="digits-3f9a1c", owner="alice"),
            f":inbox_tray: {JOB} accepted; waiting for capacity.",
            id="accepted",
        ),
        pytest.param(
            JobStarted(job_id="digits-3f9a1c", attempt=1, submission_id="s-1", pool="gpu-spot"),
            f":rocket: {JOB} is running on gpu-spot.",
            id="started",
        ),
        pytest.param(
            JobInterrupted(
                job_id="digits-3f9a1c",
                attempt=1,
                node="spot-7",
                cause=InterruptionCause.PREEMPTED,
            ),
            f":warning: {JOB} attempt 1 was interrupted: its spot node was preempted (spot-7)."
            " It resumes from its latest checkpoint.",
            id="preempted",
        ),
        pytest.param(
            JobResumed(
                job_id="digits-3f9a1c",
                attempt=2,
                from_checkpoint="file:///ckpt/120",
                from_step=120,
                steps_lost=3,
                capacity=CapacityClass.SPOT,
            ),
            f":arrows_counterclockwise: {JOB} resumes as attempt 2 from step 120 on spot "
            "capacity (3 step(s) lost).",
            id="resumed",
        ),
        pytest.param(
            JobStarted(job_id="digits-3f9a1c", attempt=2, submission_id="s-2"),
            f":rocket: {JOB} is running again (attempt 2).",
            id="started-again",
        ),
        pytest.param(
            JobSucceeded(job_id="digits-3f9a1c", attempt=2),
            f":white_check_mark: <@{ALICE}> {JOB} succeeded after 2 attempts.",
            id="succeeded",
        ),
        pytest.param(
            JobFailed(job_id="digits-3f9a1c", attempt=1, message="ValueError: <!channel> & co"),
            f":x: <@{ALICE}> {JOB} failed (attempt 1).\n"
            "```ValueError: &lt;!channel&gt; &amp; co```",
            id="failed-with-its-message-escaped",
        ),
        pytest.param(
            JobRejected(
                job_id="digits-3f9a1c",
                reason=RejectionReason.QUOTA_EXCEEDED,
                detail="16 GPUs > <@UBOB00001>",
            ),
            f":no_entry: <@{ALICE}> {JOB} was rejected (quota-exceeded): "
            "16 GPUs &gt; &lt;@UBOB00001&gt;",
            id="rejected",
        ),
        pytest.param(
            JobCancelled(job_id="digits-3f9a1c", attempt=1),
            f":stop_sign: <@{ALICE}> {JOB} was cancelled.",
            id="cancelled",
        ),
    ],
)
def test_a_jobs_state_change_is_posted_in_its_thread(data: EventData, text: str) -> None:
    assert notice_for(data, record(), OWNERS) == Post(
        channel="CTRAINING1", thread_ts="1764500000.000001", text=text
    )


def test_a_finished_jobs_post_carries_its_cost_when_known() -> None:
    cost = JobCost(job_id="digits-3f9a1c", total_usd=1.234, gpu_hours=2.5)
    notice = notice_for(JobSucceeded(job_id="digits-3f9a1c", attempt=1), record(), OWNERS, cost)
    assert isinstance(notice, Post)
    assert notice.text.endswith("succeeded. Cost: $1.23 (2.5 GPU-hours).")


_STARTED = JobStarted(job_id="digits-3f9a1c", attempt=1, submission_id="s-1")


@pytest.mark.parametrize(
    ("data", "found", "reason"),
    [
        pytest.param(
            JobProgress(job_id="digits-3f9a1c", attempt=1, step=5),
            record(),
            SkipReason.NOT_POSTED,
            id="progress-is-not-posted",
        ),
        pytest.param(_STARTED, None, SkipReason.UNKNOWN_JOB, id="unknown-job"),
        pytest.param(_STARTED, record(labels={}), SkipReason.NOT_FROM_SLACK, id="from-the-cli"),
        pytest.param(
            _STARTED,
            record(labels={"slack-channel": "not a channel", "slack-user": ALICE}),
            SkipReason.NOT_FROM_SLACK,
            id="malformed-labels",
        ),
        pytest.param(
            _STARTED,
            record(owner="bob"),
            SkipReason.ORIGIN_NOT_OWNER,
            id="labels-name-someone-else-than-the-owner",
        ),
        pytest.param(
            _STARTED,
            record(labels={"slack-channel": "CTRAINING1", "slack-user": "UNOBODY01"}),
            SkipReason.ORIGIN_NOT_OWNER,
            id="labels-name-an-unmapped-user",
        ),
    ],
)
def test_nothing_is_posted_for_jobs_without_a_trusted_slack_origin(
    data: EventData, found: JobRecord | None, reason: SkipReason
) -> None:
    assert notice_for(data, found, OWNERS) == Skip(reason)


def test_a_post_without_a_thread_goes_to_the_channel() -> None:
    labels = {"slack-channel": "CTRAINING1", "slack-user": ALICE}
    notice = notice_for(_STARTED, record(labels=labels), OWNERS)
    assert isinstance(notice, Post)
    assert (notice.channel, notice.thread_ts) == ("CTRAINING1", None)


def test_the_status_of_a_job_shows_its_state_attempt_and_age() -> None:
    found = record(state=JobState.RUNNING)
    text = replies.status(found, datetime(2026, 11, 30, 13, 30, tzinfo=UTC))
    assert text.splitlines()[0] == "`digits-3f9a1c`: *running*"
    assert "submitted 1h30m ago" in text


def test_an_announcement_escapes_what_the_user_typed() -> None:
    request = JobRequested(
        job_id="digits-3f9a1c",
        owner="alice",
        entrypoint=("python", "train.py", "<!here>", "a`b"),
    )
    text = replies.announcement(request, ORIGIN, "digits")
    assert "&lt;!here&gt;" in text
    assert "<!here>" not in text
    assert "a'b" in text


PURE = ("commands.py", "model.py", "policy.py", "replies.py")
FORBIDDEN = {"asyncio", "nats", "structlog", "slack_sdk", "slack_bolt", "aiohttp", "time",
             "uuid", "random", "secrets"}  # fmt: skip


@pytest.mark.parametrize("name", PURE)
def test_the_deciding_modules_are_pure(name: str) -> None:
    """No async, no clock, no ids, no I/O library in the parser, model, policy, texts."""
    path = Path(__file__).parents[2] / "shared" / "slack" / name
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, ast.AsyncFunctionDef | ast.Await), f"{name}: async"
        imported: list[Any] = []
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported = [node.module or ""]
        for module in imported:
            assert module.split(".")[0] not in FORBIDDEN, f"{name} imports {module}"
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("now", "utcnow", "today"), f"{name} reads the clock"


def test_a_signature_is_taken_once_within_its_window_and_then_forgotten() -> None:
    seen = SeenSignatures(seen={})
    assert seen.first_time("v0=a", 1000.0, now=1000.0)
    assert not seen.first_time("v0=a", 1000.0, now=1200.0), "replayed within 5 minutes"
    assert seen.first_time("v0=b", 1200.0, now=1200.0)
    # Long after its window (Bolt refuses its timestamp by then), it is no longer kept.
    assert seen.first_time("v0=c", 2000.0, now=2000.0)
    assert "v0=a" not in seen.seen
