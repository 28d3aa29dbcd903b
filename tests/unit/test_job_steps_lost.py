"""The steps an attempt reached that the next one runs again, read from the record."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.jobs import Attempt, steps_lost

AT = datetime(2026, 12, 4, tzinfo=UTC)


def attempt(number: int, *, step: int | None = None, from_step: int = 0) -> Attempt:
    return Attempt(
        number=number, submission_id=f"j-{number}", submitted_at=AT, step=step, from_step=from_step
    )


@pytest.mark.parametrize(
    ("reached", "resumed_from", "lost"),
    [
        pytest.param(60, 40, 20, id="back-to-the-checkpoint"),
        pytest.param(60, 60, 0, id="checkpointed-on-notice"),
        pytest.param(None, 0, None, id="never-reported"),
        # A checkpoint past the last report (written after it): nothing run twice.
        pytest.param(60, 65, 0, id="checkpoint-ahead-of-the-report"),
    ],
)
def test_steps_lost(reached: int | None, resumed_from: int, lost: int | None) -> None:
    assert steps_lost(attempt(1, step=reached), attempt(2, from_step=resumed_from)) == lost
