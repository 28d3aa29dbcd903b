"""The scaler's hard spend cap cannot be lifted by a job request: a request that carries a
budget is invalid data, and the scaler takes its budget from its own settings alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from services.scaler.handlers import SUBSCRIPTIONS
from services.scaler.model import Demand
from services.scaler.settings import ScalerSettings
from shared.events import InvalidEventError, InvalidReason, decode, encode
from tests.events import job_requested


def _request_with(**extra: Any) -> bytes:
    envelope = json.loads(encode(job_requested("job-rich")))
    data = extra.pop("data", {})
    envelope["data"].update(data)
    envelope.update(extra)
    return json.dumps(envelope).encode()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(
            _request_with(data={"budget_per_hour_usd": 1e9}),
            "data.budget_per_hour_usd",
            id="in-the-data",
        ),
        pytest.param(
            _request_with(budget_per_hour_usd=1e9), "budget_per_hour_usd", id="beside-the-data"
        ),
        pytest.param(
            _request_with(data={"max_spend_usd": None}), "data.max_spend_usd", id="any-spend-field"
        ),
    ],
)
def test_a_job_request_carrying_a_budget_is_invalid_data(raw: bytes, field: str) -> None:
    """Dead-lettered by the submitter, never admitted, so never queued for the scaler."""
    with pytest.raises(InvalidEventError) as caught:
        decode(raw)
    assert caught.value.reason is InvalidReason.INVALID_DATA
    assert f"{field}: Extra inputs are not permitted" in caught.value.detail


def test_nothing_the_scaler_hears_carries_a_budget() -> None:
    """The events it consumes and the demand it plans with have no field that could."""
    models: list[type[BaseModel]] = [*SUBSCRIPTIONS, Demand]
    fields = {name for model in models for name in model.model_fields}
    assert not {f for f in fields if "budget" in f or "spend" in f or f == "env"}


def test_the_budget_comes_from_the_scalers_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTRAIN_SCALER_BUDGET_PER_HOUR_USD", "12.5")
    assert ScalerSettings().policy_config().budget_per_hour_usd == 12.5
