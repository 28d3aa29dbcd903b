"""The records desk's pure parts: who reads which job, how answers are paged, and what a
hidden job's cost events keep."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from services.submitter import policy
from shared.desk import (
    HIDDEN_OWNER,
    MOST_STAGED_BYTES,
    PART_BYTES,
    REQUESTS_BURST,
    REQUESTS_PER_S,
    DeskAsk,
    Forward,
    UploadPart,
    alias,
    asker,
    desk_subject,
    desk_subjects,
    forward_request,
    hidden,
    page,
    part_offsets,
    person_event_id,
    person_inbox_prefix,
    replies_to_asker,
    staged_by,
    staging_refusal,
    take_request,
    teams_status_for,
)
from shared.events import Event, decode, encode, new_event, subject_matches
from shared.events.data import (
    EventData,
    JobAccepted,
    JobCancelRequested,
    JobCheckpointed,
    JobFailed,
    JobRequested,
    JobResumed,
    JobStarted,
)
from shared.events.types import CapacityClass
from shared.jobs import JobRecord, JobState
from shared.policy.teams import TeamHold, TeamHolds, Teams, TeamsStatus, parse_teams
from shared.workspace import DEFAULT_LIMIT_BYTES

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
TEAMS = parse_teams(
    """
[teams.vision]
members = ["alice", "bob", "jane.doe"]
admins = ["jane.doe"]
[teams.nlp]
members = ["carol"]
"""
)


def record(owner: str, team: str | None = None) -> JobRecord:
    return JobRecord(
        request=JobRequested(job_id="job-1", owner=owner, entrypoint=("python", "t.py")),
        request_event_id="ev-1",
        state=JobState.QUEUED,
        accepted_at=NOW,
        updated_at=NOW,
        team=team,
    )


@pytest.mark.parametrize(
    ("owner", "team", "reader", "teams", "readable"),
    [
        pytest.param("alice", None, "alice", None, True, id="own-job-no-teams"),
        pytest.param("alice", None, "bob", None, False, id="anothers-no-teams"),
        pytest.param("alice", "vision", "bob", TEAMS, True, id="a-team-mate"),
        pytest.param("alice", "vision", "jane.doe", TEAMS, True, id="the-teams-admin"),
        pytest.param("alice", "vision", "carol", TEAMS, False, id="another-team"),
        pytest.param("alice", None, "bob", TEAMS, True, id="team-from-the-file"),
        # Admitted under nlp before alice moved to vision: nlp's, not bob's to read.
        pytest.param("alice", "nlp", "bob", TEAMS, False, id="the-team-it-ran-under"),
        pytest.param("alice", "nlp", "carol", TEAMS, True, id="read-by-that-team"),
        pytest.param("alice", "vision", "dave", TEAMS, False, id="in-no-team"),
    ],
)
def test_who_reads_a_job(
    owner: str, team: str | None, reader: str, teams: Teams | None, readable: bool
) -> None:
    assert policy.may_read(record(owner, team), reader, teams) is readable


@pytest.mark.parametrize("person", ["alice", "jane.doe", "j@acme.com"])
def test_an_ask_names_its_sender_and_lies_outside_the_event_stream(person: str) -> None:
    subject = desk_subject("spotrain", person)
    assert asker(subject, "spotrain") == person
    assert subject_matches(desk_subjects("spotrain"), subject)
    assert not subject_matches("spotrain.>", subject)
    assert asker("spotrain.job.requested.alice", "spotrain") is None
    assert asker("spotrain_desk.", "spotrain") is None


def test_an_ask_waits_twenty_seconds_at_most() -> None:
    with pytest.raises(ValueError, match="less than or equal to 20"):
        DeskAsk.model_validate({"ask": "history", "job_id": "job-1", "wait_s": 60})
    with pytest.raises(ValueError, match="ask"):
        DeskAsk.model_validate({"ask": "everything"})


@given(st.lists(st.integers(min_value=1, max_value=300), max_size=40), st.integers(1, 1000))
def test_a_page_fits_its_limit_and_always_moves_on(sizes: list[int], limit: int) -> None:
    count = page(sizes, lambda size: size, limit)
    assert count <= len(sizes)
    if sizes:
        assert count >= 1
        assert count == 1 or sum(sizes[:count]) <= limit
        assert count == len(sizes) or sum(sizes[: count + 1]) > limit


def test_a_hidden_jobs_request_keeps_the_bill_and_nothing_else() -> None:
    request = JobRequested(
        job_id="alice-7",
        owner="alice",
        experiment="sentiment",
        entrypoint=("python", "train.py", "--token", "s3cr3t"),
        labels={"slack.user": "U1"},
        env={"API_TOKEN": "s3cr3t"},
        secrets={"HF_TOKEN": "hf"},
        pip=("private-package==1.0",),
        num_workers=2,
    )
    event = new_event(request, source="cli/alice", time=NOW, subject="alice-7")
    shown = decode(encode(hidden(event)))  # still a valid event on the way to the reader
    assert isinstance(shown.data, JobRequested)
    assert shown.data.job_id == alias("alice-7") == shown.subject
    assert (shown.data.owner, shown.data.num_workers) == (HIDDEN_OWNER, 2)
    assert shown.time == NOW
    text = encode(shown).decode()
    for secret in ("alice", "s3cr3t", "sentiment", "U1", "hf", "private-package", event.id):
        assert secret not in text


def test_each_hidden_event_of_a_job_is_under_the_same_alias() -> None:
    events: list[Event[Any]] = [
        new_event(JobAccepted(job_id="a-1", owner="alice", experiment="x"), source="s", time=NOW),
        new_event(
            JobStarted(job_id="a-1", attempt=1, submission_id="a-1-1", pool="spot", nodes=("n",)),
            source="s",
            time=NOW,
        ),
        new_event(
            JobFailed(job_id="a-1", attempt=1, message="KeyError: s3cr3t"), source="s", time=NOW
        ),
    ]
    shown = [decode(encode(hidden(e))) for e in events]
    assert {getattr(e.data, "job_id", None) for e in shown} == {alias("a-1")}
    assert "s3cr3t" not in "".join(encode(e).decode() for e in shown)
    assert "alice" not in "".join(encode(e).decode() for e in shown)
    assert alias("a-1") != alias("a-2")


@pytest.mark.parametrize(
    ("reply", "person", "answered"),
    [
        pytest.param(f"{person_inbox_prefix('alice')}.x1", "alice", True, id="her-inbox"),
        pytest.param(f"{person_inbox_prefix('bob')}.x1", "alice", False, id="bobs-inbox"),
        pytest.param("spotrain.job.requested.bob", "alice", False, id="the-event-stream"),
        pytest.param("spotrain_desk.bob", "alice", False, id="an-ask-as-bob"),
        pytest.param(person_inbox_prefix("alice"), "alice", False, id="the-bare-prefix"),
        pytest.param("", "alice", False, id="no-reply"),
    ],
)
def test_the_desk_answers_the_askers_own_inbox_only(
    reply: str, person: str, answered: bool
) -> None:
    assert replies_to_asker(reply, person) is answered


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20), st.uuids())
def test_a_persons_request_ids_are_theirs_alone(alice: str, bob: str, event: Any) -> None:
    mine = person_event_id(alice, event.hex)
    assert mine == person_event_id(alice, event.hex), "a request sent twice is one"
    assert mine.startswith("person:"), "no service's id has this namespace"
    if alice != bob:
        assert mine != person_event_id(bob, event.hex)
    # An id the envelope takes (pattern and length), whatever the name and client id.
    new_event(JobAccepted(job_id="job-1", owner="alice"), source="t", time=NOW, event_id=mine)


def _part(size: int, offset: int, length: int) -> tuple[UploadPart, bytes]:
    raw = b"x" * length
    return UploadPart(sha256="0" * 64, size=size, offset=offset, data=""), raw


@pytest.mark.parametrize(
    ("size", "offset", "length", "problem"),
    [
        pytest.param(PART_BYTES * 2, 0, PART_BYTES, None, id="a-first-part"),
        pytest.param(PART_BYTES + 5, PART_BYTES, 5, None, id="the-last-part"),
        pytest.param(PART_BYTES * 2, 7, PART_BYTES, "multiples", id="a-part-out-of-step"),
        pytest.param(PART_BYTES * 2, PART_BYTES * 2, 1, "multiples", id="past-the-end"),
        pytest.param(PART_BYTES * 2, 0, 10, "not 262144", id="a-short-part"),
        pytest.param(100, 0, 101, "not 100", id="a-long-last-part"),
    ],
)
def test_a_workspace_goes_up_in_whole_parts_in_order(
    size: int, offset: int, length: int, problem: str | None
) -> None:
    part, raw = _part(size, offset, length)
    found = part.part_problem(raw)
    assert (found is None) if problem is None else (problem in (found or ""))


@given(st.integers(min_value=1, max_value=5 * PART_BYTES))
def test_the_parts_of_a_workspace_cover_it_once(size: int) -> None:
    offsets = list(part_offsets(size))
    lasts = [UploadPart(sha256="0" * 64, size=size, offset=o, data="").is_last for o in offsets]
    assert lasts == [False] * (len(offsets) - 1) + [True]
    assert sum(min(PART_BYTES, size - o) for o in offsets) == size


def test_an_upload_part_is_refused_past_the_workspace_limit() -> None:
    with pytest.raises(ValidationError):
        UploadPart(sha256="0" * 64, size=DEFAULT_LIMIT_BYTES + 1, offset=0, data="")


def test_a_persons_share_of_requests_is_a_burst_then_a_rate() -> None:
    allowance = None
    for _ in range(REQUESTS_BURST):
        allowance, wait_s = take_request(allowance, 100.0)
        assert wait_s is None
    allowance, wait_s = take_request(allowance, 100.0)
    assert wait_s == pytest.approx(1 / REQUESTS_PER_S)
    allowance, wait_s = take_request(allowance, 100.0 + 1 / REQUESTS_PER_S)
    assert wait_s is None, "after the wait it says, one more goes"
    _, wait_s = take_request(allowance, 100.0 + 1 / REQUESTS_PER_S)
    assert wait_s is not None


@given(st.lists(st.floats(min_value=0, max_value=5), min_size=1, max_size=400))
def test_no_person_sends_more_than_the_burst_and_the_rate_allow(gaps: list[float]) -> None:
    allowance, now, sent = None, 0.0, 0
    for gap in gaps:
        now += gap
        allowance, wait_s = take_request(allowance, now)
        sent += wait_s is None
        assert sent <= REQUESTS_BURST + now * REQUESTS_PER_S + 1e-9


@pytest.mark.parametrize("job_id", ["bob-secret-run", "job", "spot"])
def test_a_hidden_jobs_id_is_nowhere_in_its_events(job_id: str) -> None:
    """Not in an attempt's Ray submission id, a checkpoint's URI, or who asked to cancel;
    and an id that is also a word of the event (`job`, `spot`) leaves the event whole."""
    events: list[EventData] = [
        JobStarted(job_id=job_id, attempt=2, submission_id=f"{job_id}-2"),
        JobResumed(
            job_id=job_id,
            attempt=3,
            from_checkpoint=f"gs://b/checkpoints/{job_id}/step-10",
            from_step=10,
            capacity=CapacityClass.SPOT,
        ),
        JobCheckpointed(job_id=job_id, attempt=3, step=10, uri=f"gs://b/{job_id}/10"),
        JobCancelRequested(job_id=job_id, requested_by="bob"),
    ]
    for data in events:
        event = new_event(data, source="submitter", time=NOW, subject=job_id)
        shown = decode(encode(hidden(event)))  # still a valid event of its type
        assert shown.type == event.type
        fields = shown.data.model_dump(mode="json")
        assert fields["job_id"] == alias(job_id)
        leaked = {k: v for k, v in fields.items() if isinstance(v, str) and job_id in v}
        assert not {k for k in leaked if k not in ("capacity",)}, leaked
        assert "bob" not in encode(shown).decode()


def test_the_teams_status_shows_other_teams_holds_under_an_alias() -> None:
    hold: dict[str, Any] = {
        "capacity": CapacityClass.SPOT,
        "gpus": 2,
        "priority": 5,
        "borrowed": False,
        "since": NOW,
    }
    holds = TeamHolds(
        holds={
            "a-1": TeamHold(job_id="a-1", team="vision", owner="alice", **hold),
            "c-1": TeamHold(job_id="c-1", team="nlp", owner="carol", **hold),
        }
    )
    status = TeamsStatus(teams=TEAMS, holds=holds, at=NOW)
    seen = teams_status_for(status, "bob")  # vision, as alice
    assert seen.holds.holds["a-1"].owner == "alice"
    [other] = [h for key, h in seen.holds.holds.items() if key != "a-1"]
    assert (other.job_id, other.owner, other.gpus) == (alias("c-1"), HIDDEN_OWNER, 2)
    assert "carol" not in seen.holds.model_dump_json()
    assert "c-1" not in seen.holds.model_dump_json()


def _request_of(owner: str, event_id: str = "client-1") -> bytes:
    data = JobRequested(job_id="j-1", owner=owner, entrypoint=("python", "t.py"))
    return encode(new_event(data, source=f"cli/{owner}", time=NOW, event_id=event_id))


@pytest.mark.parametrize(
    ("raw", "person", "outcome"),
    [
        pytest.param(_request_of("alice"), "alice", "spotrain.job.requested.alice", id="hers"),
        pytest.param(
            encode(
                new_event(
                    JobCancelRequested(job_id="j-1", requested_by="jane.doe"),
                    source="cli",
                    time=NOW,
                )
            ),
            "jane.doe",
            "spotrain.job.cancel_requested.jane.doe",
            id="a-cancel-of-a-dotted-name",
        ),
        pytest.param(_request_of("bob"), "alice", "not-the-sender", id="in-bobs-name"),
        pytest.param(b'{"hello": 1}', "alice", "not-an-event", id="not-an-event"),
        pytest.param(b"{", "alice", "not-json", id="not-json"),
        pytest.param(
            encode(new_event(JobAccepted(job_id="j-1", owner="alice"), source="x", time=NOW)),
            "alice",
            "unknown-type",
            id="a-fact-not-a-request",
        ),
    ],
)
def test_the_desk_forwards_a_persons_own_requests_only(
    raw: bytes, person: str, outcome: str
) -> None:
    decided = forward_request(raw, person, "spotrain")
    if isinstance(decided, Forward):
        assert decided.subject == outcome
        assert decided.event.id.startswith("person:")
        again = forward_request(raw, person, "spotrain")  # a retry: the same id, stored once
        assert isinstance(again, Forward)
        assert again.event.id == decided.event.id
    else:
        assert decided.reason == outcome, decided
        assert "\n" not in decided.answer


@pytest.mark.parametrize(
    ("first_parts", "size", "refused"),
    [
        pytest.param({}, MOST_STAGED_BYTES, False, id="the-whole-share-at-once"),
        pytest.param({}, MOST_STAGED_BYTES + 1, True, id="past-the-share"),
        pytest.param({f"ann.{'a' * 64}.{0:012d}": MOST_STAGED_BYTES}, 1, True, id="share-held"),
        pytest.param(
            {f"bob.{'a' * 64}.{0:012d}": MOST_STAGED_BYTES}, MOST_STAGED_BYTES, False,
            id="another-persons-staging-is-theirs",
        ),
        pytest.param(
            {f"ann.{'a' * 64}.{PART_BYTES:012d}": MOST_STAGED_BYTES}, MOST_STAGED_BYTES, False,
            id="only-first-parts-reserve",
        ),
        pytest.param(
            {f"ann.{'a' * 64}.{0:012d}": 3, f"ann.{'b' * 64}.{0:012d}": 4},
            MOST_STAGED_BYTES - 7, False, id="reservations-add-up",
        ),
    ],
)  # fmt: skip
def test_what_one_person_may_stage(first_parts: dict[str, int], size: int, refused: bool) -> None:
    problem = staging_refusal(staged_by("ann", first_parts), size)
    assert (problem is not None) is refused
