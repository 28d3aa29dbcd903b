"""The watcher's decisions (issue 36, 4 and 6): a training pod's notice from its node pool's
shutdown grace, and a node's deadline from the signs its Node shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.preemption_watcher.policy import NoticeRules, node_deadline, pod_notice_s

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("grace", "critical", "expected"),
    [
        pytest.param(0, 0, 15.0, id="none-set-gkes-default"),
        pytest.param(30, 15, 15.0, id="gkes-default-said"),
        pytest.param(120, 15, 105.0, id="the-longer-notice"),
        pytest.param(120, 0, 120.0, id="nothing-kept-for-critical-pods"),
        pytest.param(600, 15, 105.0, id="past-what-gke-allows"),
        pytest.param(30, 45, 0.0, id="critical-pods-take-it-all"),
    ],
)
def test_pod_notice(grace: int, critical: int, expected: float) -> None:
    assert pod_notice_s(grace, critical, 15.0) == expected


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=0, max_value=10_000))
def test_a_pods_notice_never_exceeds_the_grace_gke_allows(grace: int, critical: int) -> None:
    notice = pod_notice_s(grace, critical, 15.0)
    assert 0 <= notice <= min(grace, 120)


RULES = NoticeRules(pool_notice_s={"gpu-spot-long": 105.0})


def _deadline(**signs: object) -> datetime | None:
    base: dict[str, object] = {
        "now": NOW,
        "pool": "gpu-spot",
        "is_spot": True,
        "termination_taint_at": None,
        "tainted": False,
        "maintenance_at": None,
        "shutting_down_since": None,
        "shutting_down": False,
        "rules": RULES,
    }
    return node_deadline(**{**base, **signs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("signs", "expected_s"),
    [
        pytest.param({}, None, id="no-sign"),
        pytest.param({"tainted": True}, 15, id="spot-taint-default-notice"),
        pytest.param(
            {"tainted": True, "termination_taint_at": NOW - timedelta(seconds=5)},
            10,
            id="spot-taint-from-its-time",
        ),
        pytest.param({"tainted": True, "pool": "gpu-spot-long"}, 105, id="pool-longer-notice"),
        pytest.param({"tainted": True, "is_spot": False}, 3600, id="on-demand-taint-an-hour"),
        pytest.param(
            {"shutting_down": True, "shutting_down_since": NOW - timedelta(seconds=3)},
            12,
            id="kubelet-shutdown",
        ),
        pytest.param(
            {"shutting_down": True, "pool": "gpu-spot-long"}, 105, id="kubelet-shutdown-longer"
        ),
        pytest.param({"maintenance_at": NOW + timedelta(hours=3)}, None, id="maintenance-far"),
        pytest.param({"maintenance_at": NOW + timedelta(minutes=30)}, 1800, id="maintenance-near"),
        pytest.param(
            {
                "maintenance_at": NOW + timedelta(minutes=30),
                "shutting_down": True,
            },
            15,
            id="earliest-sign-wins",
        ),
        pytest.param({"tainted": True, "pool": None}, 15, id="no-pool-default"),
    ],
)
def test_node_deadline(signs: dict[str, object], expected_s: int | None) -> None:
    expected = None if expected_s is None else NOW + timedelta(seconds=expected_s)
    assert _deadline(**signs) == expected
