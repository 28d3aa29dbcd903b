"""Replay's pure parts: windows, type names, JSON lines, the copies a replay publishes, and
how a service's consumer takes a copy as the event it is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.events import encode, subject_for, subject_matches
from shared.events.catalog import replay_subject
from shared.events.data import JobCancelRequested, JobQueued, JobRequested, JobStarted, NodeLost
from shared.messaging import DeadLetterReason, Subscription
from shared.messaging.dead_letters import MSG_ID, ORIGINAL_SEQ, ORIGINAL_SUBJECT
from shared.messaging.delivery import Ack, DeadLetter, Delivery, settle
from shared.messaging.ports import StreamRecord
from shared.natsauth import replay_subjects
from shared.replay import (
    REPLAY_RUN,
    UnknownEventTypeError,
    event_types,
    moment,
    parse_lines,
    plan_replay,
    window,
)
from shared.replay.jsonl import one_per_line
from tests.events import NOW, job_requested

LATER = NOW + timedelta(hours=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("90s", NOW - timedelta(seconds=90), id="seconds"),
        pytest.param("10m", NOW - timedelta(minutes=10), id="minutes"),
        pytest.param("2h", NOW - timedelta(hours=2), id="hours"),
        pytest.param("1d", NOW - timedelta(days=1), id="days"),
        pytest.param("1.5h", NOW - timedelta(minutes=90), id="fractions"),
        pytest.param("now", NOW, id="now"),
        pytest.param("2026-11-30T10:00:00+00:00", datetime(2026, 11, 30, 10, tzinfo=UTC), id="iso"),
        pytest.param("2026-11-30T10:00:00Z", datetime(2026, 11, 30, 10, tzinfo=UTC), id="zulu"),
    ],
)
def test_a_moment_is_a_duration_back_or_an_iso_time(text: str, expected: datetime) -> None:
    assert moment(text, now=NOW) == expected


def test_an_iso_time_without_a_zone_is_local_time() -> None:
    at = moment("2026-11-30T10:00:00", now=NOW)
    assert at.tzinfo is not None
    assert at == datetime(2026, 11, 30, 10).astimezone()


@pytest.mark.parametrize(
    ("since", "until", "message"),
    [
        pytest.param("soon", None, "--since takes a duration back", id="not-a-moment"),
        pytest.param("10x", None, "--since takes a duration back", id="unknown-unit"),
        pytest.param("1h", "yesterday-ish", "--until takes a duration back", id="bad-until"),
        pytest.param("1h", "2h", "--until 2h is not after --since 1h", id="empty"),
        pytest.param("now", None, "--since now is not in the past", id="since-now"),
    ],
)
def test_a_bad_window_says_which_flag(since: str, until: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        window(since, until, now=NOW)


def test_a_window_runs_until_now_by_default() -> None:
    assert window("1h", None, now=NOW) == (NOW - timedelta(hours=1), NOW)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        pytest.param(["job.started"], {JobStarted}, id="aggregate-and-event"),
        pytest.param(["spotrain.job.queued.v1"], {JobQueued}, id="full-type"),
        pytest.param(["job.requested", "node.lost"], {JobRequested, NodeLost}, id="several"),
    ],
)
def test_types_are_named_as_people_say_them(names: list[str], expected: set[type[Any]]) -> None:
    assert set(event_types(names)) == expected


def test_an_aggregate_names_all_its_events_and_no_name_names_all() -> None:
    jobs = event_types(["job"])
    assert JobCancelRequested in jobs
    assert all(m.aggregate == "job" for m in jobs)
    assert len(event_types([])) > len(jobs)


def test_an_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(UnknownEventTypeError, match=r"no event type 'job\.bogus'; known: .*"):
        event_types(["job.bogus"])


def test_lines_are_validated_with_the_codec_and_rejected_by_number() -> None:
    event = job_requested("job-1")
    good = encode(event)
    lines = [
        good + b"\n",
        b"\n",
        b"{not json\n",
        b'{"specversion": "1.0", "type": "spotrain.job.requested.v9"}\n',
        good.replace(b'"job_id":"job-1"', b'"job_id":"Job 1"') + b"\r\n",
    ]
    parsed, rejected = parse_lines(lines)
    assert [(p.number, p.raw, p.event) for p in parsed] == [(1, good, event)]
    assert [r.number for r in rejected] == [3, 4, 5]
    assert str(rejected[0]).startswith("line 3: not-json: ")
    assert str(rejected[1]).startswith("line 4: unknown-version: version v9 of spotrain.job")
    assert str(rejected[2]).startswith("line 5: invalid-data: ")
    assert all("\n" not in str(r) for r in rejected)


def test_a_message_written_over_several_lines_does_not_fit_a_line() -> None:
    assert one_per_line(b'{"a": 1}') == b'{"a": 1}'
    assert one_per_line(b'{\n"a": 1}') is None


def _record(seq: int, data: bytes, subject: str = "spotrain.job.requested") -> StreamRecord:
    return StreamRecord(seq=seq, subject=subject, data=data, headers={}, stored_at=NOW)


def test_a_replay_copies_each_event_byte_for_byte_to_the_services_replay_subject() -> None:
    first, second = job_requested("job-1"), job_requested("job-2")
    records = [_record(7, encode(first)), _record(9, b"garbage"), _record(12, encode(second))]
    plan = plan_replay(records, service="submitter", run="r1", prefix="spotrain")
    assert [c.subject for c in plan.copies] == ["spotrain.replay.submitter.job.requested"] * 2
    assert [c.data for c in plan.copies] == [encode(first), encode(second)]
    assert plan.copies[0].headers == {
        MSG_ID: f"{first.id}.replay.r1",
        REPLAY_RUN: "r1",
        ORIGINAL_SUBJECT: "spotrain.job.requested",
        ORIGINAL_SEQ: "7",
    }
    assert plan.counts() == {"spotrain.job.requested.v1": 2}
    assert plan.invalid == 1


def test_the_replay_subjects_are_the_ones_only_ops_may_publish_to() -> None:
    subject = replay_subject("scaler", JobQueued, "acme")
    assert subject == "acme.replay.scaler.job.queued"
    assert subject_matches(replay_subjects("acme"), subject)
    assert subject_matches("acme.>", subject), "inside the stream: a replay is on the record"


async def _nothing(event: Any) -> None:
    return None


def test_a_consumer_takes_its_events_and_their_replays_to_itself_only() -> None:
    subscription = Subscription(service="submitter", routes={JobRequested: _nothing})
    assert subscription.filter_subjects("spotrain") == [
        "spotrain.job.requested",
        "spotrain.job.requested.>",
        "spotrain.replay.submitter.job.requested",
    ]


async def test_a_replayed_event_reaches_the_handler_of_its_type() -> None:
    handled: list[tuple[str, str]] = []

    async def on_requested(event: Any) -> None:
        handled.append((event.type, event.data.job_id))

    subscription = Subscription(service="submitter", routes={JobRequested: on_requested})
    data = encode(job_requested("job-r"))
    delivery = Delivery(
        subject="spotrain.replay.submitter.job.requested",
        data=data,
        num_delivered=1,
        stream_seq=3,
    )
    assert await settle(delivery, subscription, "spotrain") == Ack()
    assert handled == [("spotrain.job.requested.v1", "job-r")]


@pytest.mark.parametrize(
    "subject",
    [
        pytest.param("spotrain.replay.scaler.job.requested", id="another-services-replay"),
        pytest.param("spotrain.replay.submitter.job.queued", id="replay-subject-of-another-type"),
        pytest.param(subject_for(JobQueued), id="original-subject-of-another-type"),
    ],
)
async def test_an_event_on_a_subject_not_its_own_is_dead_lettered(subject: str) -> None:
    subscription = Subscription(service="submitter", routes={JobRequested: _nothing})
    delivery = Delivery(
        subject=subject, data=encode(job_requested()), num_delivered=1, stream_seq=1
    )
    outcome = await settle(delivery, subscription, "spotrain")
    assert isinstance(outcome, DeadLetter)
    assert outcome.reason is DeadLetterReason.WRONG_SUBJECT
