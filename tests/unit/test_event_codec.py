"""The event contract: envelopes round-trip, and bad bytes fail with a precise reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.events import (
    CATALOG,
    InvalidEventError,
    InvalidReason,
    decode,
    encode,
    new_event,
    subject_for,
)
from shared.events.data import JobAccepted, JobRequested
from shared.events.types import Bundle, CapacityClass
from tests.events import job_requested

names = st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,20}\Z")
argv = st.lists(st.text(max_size=40), min_size=1, max_size=5).map(tuple)


@given(
    job_id=names,
    owner=names,
    entrypoint=argv,
    gpus=st.integers(0, 16),
    workers=st.integers(1, 256),
    capacity=st.sampled_from(CapacityClass),
    env=st.dictionaries(
        st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,10}\Z"), st.text(max_size=20), max_size=4
    ),
)
def test_a_job_request_survives_encode_and_decode(  # noqa: PLR0917  # hypothesis passes by name
    job_id: str,
    owner: str,
    entrypoint: tuple[str, ...],
    gpus: int,
    workers: int,
    capacity: CapacityClass,
    env: dict[str, str],
) -> None:
    data = JobRequested(
        job_id=job_id,
        owner=owner,
        entrypoint=entrypoint,
        worker=Bundle(gpus=gpus),
        num_workers=workers,
        capacity=capacity,
        env=env,
    )
    event = new_event(data, source="tests", time=datetime(2026, 1, 1, tzinfo=UTC))
    assert decode(encode(event)) == event


@given(st.binary(max_size=2_000))
def test_decoding_arbitrary_bytes_either_succeeds_or_says_why(raw: bytes) -> None:
    try:
        decode(raw)
    except InvalidEventError as error:
        reason, detail = error.reason, error.detail
    else:
        return
    assert reason in InvalidReason
    assert detail


@given(
    st.dictionaries(
        st.sampled_from(["specversion", "id", "type", "source", "time", "data"]),
        st.one_of(st.none(), st.integers(), st.text(max_size=30)),
    )
)
def test_decoding_malformed_envelopes_says_why(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidEventError):
        decode(json.dumps(fields).encode())


def test_a_type_that_does_not_match_its_data_is_invalid() -> None:
    raw = encode(job_requested()).replace(b"spotrain.job.requested.v1", b"spotrain.job.accepted.v1")
    with pytest.raises(InvalidEventError) as caught:
        decode(raw)
    assert caught.value.reason is InvalidReason.INVALID_DATA


def test_an_unknown_version_names_the_known_ones() -> None:
    raw = encode(job_requested()).replace(b".requested.v1", b".requested.v7")
    with pytest.raises(
        InvalidEventError, match=r"v7 of spotrain.job.requested is not known \(known: v1\)"
    ):
        decode(raw)


def test_an_event_too_large_to_publish_is_refused_before_it_leaves() -> None:
    huge = job_requested(env={f"VAR_{n}": "x" * 4000 for n in range(20)})
    with pytest.raises(InvalidEventError) as caught:
        encode(huge)
    assert caught.value.reason is InvalidReason.TOO_LARGE


@pytest.mark.parametrize(
    "field",
    [
        pytest.param({"job_id": "Has Spaces"}, id="job-id-with-spaces"),
        pytest.param({"owner": "$(reboot)"}, id="owner-with-shell"),
        pytest.param({"num_workers": 0}, id="no-workers"),
        pytest.param({"entrypoint": ()}, id="empty-entrypoint"),
        pytest.param({"env": {"1BAD": "x"}}, id="bad-env-name"),
        pytest.param({"unknown_field": 1}, id="unknown-field"),
    ],
)
def test_job_requests_outside_the_contract_are_refused(field: dict[str, object]) -> None:
    valid = json.loads(encode(job_requested()))
    valid["data"].update(field)
    if field == {"entrypoint": ()}:
        valid["data"]["entrypoint"] = []
    with pytest.raises(InvalidEventError) as caught:
        decode(json.dumps(valid).encode())
    assert caught.value.reason is InvalidReason.INVALID_DATA


def test_every_catalog_entry_has_a_versioned_type_and_its_own_subject() -> None:
    subjects = [spec.subject() for spec in CATALOG.values()]
    assert len(set(subjects)) == len(subjects)
    for event_type, spec in CATALOG.items():
        assert (
            event_type
            == f"spotrain.{spec.model.aggregate}.{spec.model.event}.v{spec.model.version}"
        )
    assert subject_for(JobAccepted, "team-a") == "team-a.job.accepted"
