"""The metadata source's pure parts: what it asks the server next, how it reads the answers,
how long it waits after a failure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.preemption_watcher.adapters.gce_metadata import (
    MetadataClient,
    MetadataReply,
    PreemptedReading,
    UnexpectedReplyError,
    pool_from_kube_labels,
    preempted_path,
    read_instance_name,
    read_pool,
    read_preempted,
)
from services.preemption_watcher.policy import Backoff, notice_key

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POOL_LABEL = "cloud.google.com/gke-nodepool"


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        pytest.param(None, "instance/preempted", id="first-look-answers-at-once"),
        pytest.param(
            PreemptedReading(preempted=False, etag="0123456789abcdef"),
            "instance/preempted?wait_for_change=true&last_etag=0123456789abcdef&timeout_sec=60",
            id="then-waits-past-the-last-etag",
        ),
        pytest.param(
            PreemptedReading(preempted=False, etag=None),
            "instance/preempted?wait_for_change=true&timeout_sec=60",
            id="no-etag-waits-for-the-next-change",
        ),
        pytest.param(
            PreemptedReading(preempted=True, etag="a&b=c"),
            "instance/preempted?wait_for_change=true&last_etag=a%26b%3Dc&timeout_sec=60",
            id="etag-is-quoted",
        ),
    ],
)
def test_next_request_for_preempted(seen: PreemptedReading | None, expected: str) -> None:
    """A plain read first, then long polls past what was seen."""
    assert preempted_path(seen, timeout_s=60) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(MetadataReply(200, "TRUE", "e1"), PreemptedReading(True, "e1"), id="true"),
        pytest.param(MetadataReply(200, "FALSE", "e0"), PreemptedReading(False, "e0"), id="false"),
        pytest.param(
            MetadataReply(200, "TRUE\n", None), PreemptedReading(True, None), id="newline-no-etag"
        ),
    ],
)
def test_reads_preempted(reply: MetadataReply, expected: PreemptedReading) -> None:
    """TRUE and FALSE, with the ETag to wait past next."""
    assert read_preempted(reply) == expected


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(MetadataReply(503, "", None), id="maintenance-503"),
        pytest.param(MetadataReply(403, "Missing header", None), id="forbidden"),
        pytest.param(MetadataReply(404, "", None), id="not-on-gce"),
        pytest.param(MetadataReply(200, "MAYBE", "e"), id="neither-true-nor-false"),
        pytest.param(MetadataReply(200, "", "e"), id="empty"),
    ],
)
def test_anything_else_from_preempted_is_unexpected(reply: MetadataReply) -> None:
    """Retried like an outage, never read as FALSE."""
    with pytest.raises(UnexpectedReplyError):
        read_preempted(reply)


def test_reads_the_instance_name() -> None:
    """The VM's name is the node's name."""
    assert read_instance_name(MetadataReply(200, "gke-a-spot-1f2e\n", "e")) == "gke-a-spot-1f2e"


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(MetadataReply(500, "gke-a", None), id="error-status"),
        pytest.param(MetadataReply(200, "", None), id="empty"),
        pytest.param(MetadataReply(200, "a b/c", None), id="not-a-name"),
    ],
)
def test_a_bad_instance_name_is_unexpected(reply: MetadataReply) -> None:
    """A node name that events could not carry is refused at startup, not at the notice."""
    with pytest.raises(UnexpectedReplyError):
        read_instance_name(reply)


@pytest.mark.parametrize(
    ("kube_labels", "expected"),
    [
        pytest.param(
            "cloud.google.com/gke-boot-disk=pd-balanced,cloud.google.com/gke-nodepool=gpu-spot,"
            "cloud.google.com/gke-spot=true",
            "gpu-spot",
            id="among-other-labels",
        ),
        pytest.param("cloud.google.com/gke-nodepool=gpu-spot\n", "gpu-spot", id="trailing-newline"),
        pytest.param("cloud.google.com/gke-spot=true", None, id="absent"),
        pytest.param("", None, id="empty"),
        pytest.param("cloud.google.com/gke-nodepool", None, id="no-value"),
        pytest.param("cloud.google.com/gke-nodepool=bad pool", None, id="not-a-name"),
        pytest.param("x.cloud.google.com/gke-nodepool=other", None, id="only-exact-key"),
    ],
)
def test_pool_from_gke_node_labels(kube_labels: str, expected: str | None) -> None:
    """The pool label's value, only if it is a name an event can carry."""
    assert pool_from_kube_labels(kube_labels, POOL_LABEL) == expected


def test_no_pool_off_gke() -> None:
    """No kube-labels attribute (404) means no pool; other errors are retried."""
    assert read_pool(MetadataReply(404, "", None), POOL_LABEL) is None
    with pytest.raises(UnexpectedReplyError):
        read_pool(MetadataReply(503, "", None), POOL_LABEL)


def test_the_notice_key_is_the_etag_of_true_else_the_time() -> None:
    """The ETag repeats when the same notice is read again; the time is the fallback."""
    assert notice_key("node-1", "abc", NOW) == "node-1@abc"
    assert notice_key("node-1", None, NOW) == "node-1@2026-11-30T12:00:00+00:00"


def test_backoff_doubles_from_the_first_pause_up_to_the_cap() -> None:
    """0.5, 1, 2, 4 ... then the cap."""
    backoff = Backoff(first_s=0.5, cap_s=3)
    assert [backoff.delay_s(n) for n in range(1, 6)] == [0.5, 1, 2, 3, 3]


@given(
    first_s=st.floats(0.001, 10),
    cap_s=st.floats(0.001, 600),
    failures=st.integers(1, 10_000),
)
def test_backoff_stays_within_the_cap_and_never_shrinks(
    first_s: float, cap_s: float, failures: int
) -> None:
    """Never above the cap, never below the first pause (when that fits), nondecreasing."""
    backoff = Backoff(first_s=first_s, cap_s=cap_s)
    delay = backoff.delay_s(failures)
    assert 0 < delay <= cap_s
    assert delay >= min(first_s, cap_s)
    assert backoff.delay_s(failures + 1) >= delay


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("https://metadata.google.internal/computeMetadata/v1", id="https"),
        pytest.param("metadata.google.internal/computeMetadata/v1", id="no-scheme"),
        pytest.param("http:///computeMetadata/v1", id="no-host"),
    ],
)
def test_the_client_only_speaks_plain_http_to_a_host(url: str) -> None:
    """The metadata server is plain http on a link-local host; anything else is a mistake."""
    with pytest.raises(ValueError, match="plain http"):
        MetadataClient(url)
