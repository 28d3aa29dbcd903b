"""The ledger against a Cloud Billing export made in the documented BigQuery schema."""

from __future__ import annotations

from datetime import date, timedelta
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events.types import CapacityClass
from shared.policy.cost.attribution import NodeLife
from shared.policy.cost.billing_export import (
    ExportError,
    ExportForm,
    Match,
    guess_form,
    ledger_by_node_day,
    read_export,
    reconcile,
)
from tests.billing_exports import BilledNode, as_csv, as_json_lines, rows
from tests.events import NOW

DAY = NOW.replace(hour=0, minute=0, second=0, microsecond=0)


def life(node: BilledNode) -> NodeLife:
    return NodeLife(
        node=node.node,
        pool=node.gke_pool,
        capacity=CapacityClass.SPOT,
        gpus=1,
        cpus=4,
        price_per_hour_usd=node.price_per_hour_usd,
        on_demand_price_per_hour_usd=node.price_per_hour_usd * 3,
        start=node.start,
        end=node.end,
    )


NODES = [
    BilledNode(
        "gpu-spot-1",
        "gpu-spot",
        0.68,
        DAY + timedelta(hours=22, minutes=13),
        DAY + timedelta(hours=26, seconds=7),
    ),
    BilledNode(
        "gpu-spot-2",
        "gpu-spot",
        0.68,
        DAY + timedelta(hours=1),
        DAY + timedelta(hours=1, minutes=20),
    ),
]


def ledger_of(nodes: list[BilledNode]) -> dict[tuple[str, date], Fraction]:
    return ledger_by_node_day([life(n) for n in nodes], now=DAY + timedelta(days=3))


@pytest.mark.parametrize("form", list(ExportForm))
def test_an_export_of_the_same_node_lives_matches_every_node_day(form: ExportForm) -> None:
    export = rows(NODES)
    text = as_json_lines(export) if form is ExportForm.JSON_LINES else as_csv(export)
    result = reconcile(ledger_of(NODES), read_export(text, form), known_pools={"gpu-spot"})
    assert [(d.node, d.day, d.match) for d in result.days] == [
        ("gpu-spot-1", DAY.date(), Match.MATCHED),
        ("gpu-spot-1", DAY.date() + timedelta(days=1), Match.MATCHED),
        ("gpu-spot-2", DAY.date(), Match.MATCHED),
    ]
    assert result.problems == ()
    assert abs(result.ledger_usd - result.bill_usd) < Fraction(1, 10_000)


def test_a_node_day_split_at_midnight_utc() -> None:
    ours = ledger_of(NODES[:1])
    first = ours[("gpu-spot-1", DAY.date())]
    assert first == Fraction(68, 100) * Fraction(3600 + 47 * 60, 3600)


@pytest.mark.parametrize(
    ("drop", "expected"),
    [
        (["cost"], "lacks the column(s) cost"),
        (["usage_start_time", "currency"], "lacks the column(s) usage_start_time, currency"),
        (["resource.name", "labels"], "no resource.name and no labels column"),
    ],
)
def test_missing_columns_are_refused_with_their_names(drop: list[str], expected: str) -> None:
    with pytest.raises(ExportError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        read_export(as_csv(rows(NODES), drop=drop), ExportForm.CSV)


def test_another_currency_is_converted_at_the_exports_rate_or_reported() -> None:
    converted = read_export(
        as_json_lines(rows(NODES, currency="EUR", rate=0.92)), ExportForm.JSON_LINES
    )
    result = reconcile(ledger_of(NODES), converted, known_pools={"gpu-spot"})
    assert {d.match for d in result.days} == {Match.MATCHED}
    without_rate = [
        dict(r, currency_conversion_rate=None) for r in rows(NODES, currency="EUR", rate=0.92)
    ]
    refused = read_export(as_json_lines(without_rate), ExportForm.JSON_LINES)
    assert refused.lines == ()
    [problem] = refused.problems
    assert problem.startswith(f"{len(without_rate)} row(s) in EUR, not USD")


def test_every_kind_of_difference_is_its_own_line() -> None:
    stranger = BilledNode(
        "gke-other-pool-9f2c", "other-team-pool", 2.0, DAY, DAY + timedelta(hours=2)
    )
    unrecorded = BilledNode("gpu-spot-7", "gpu-spot", 0.68, DAY, DAY + timedelta(hours=1))
    export = rows([NODES[0], stranger, unrecorded])
    export[0] = dict(export[0], cost=export[0]["cost"] + 0.5)  # the bill says more
    storage = dict(export[1], resource={"name": None}, labels=[])
    text = as_json_lines([*export, storage])
    result = reconcile(
        ledger_of(NODES), read_export(text, ExportForm.JSON_LINES), known_pools={"gpu-spot"}
    )
    matches = {(d.node, d.day): d.match for d in result.days}
    assert matches[("gpu-spot-1", DAY.date())] is Match.DIFFERS
    assert matches[("gpu-spot-7", DAY.date())] is Match.NOT_IN_LEDGER
    assert matches[("gpu-spot-2", DAY.date())] is Match.NOT_BILLED
    assert matches[("gke-other-pool-9f2c", DAY.date())] is Match.NOT_IN_LEDGER
    assert len(result.problems) == 2
    assert any("1 row(s) name no node" in p for p in result.problems)
    assert any(
        p.startswith("node gke-other-pool-9f2c (GKE node pool other-team-pool) is billed $")
        and p.endswith("belongs to no pool spotrain knows")
        for p in result.problems
    )


def test_a_day_the_export_does_not_cover_is_not_called_missing() -> None:
    """An export of yesterday says nothing of today: the ledger's today is left out."""
    export = [r for r in rows(NODES) if r["usage_start_time"].startswith(str(DAY.date()))]
    result = reconcile(
        ledger_of(NODES),
        read_export(as_json_lines(export), ExportForm.JSON_LINES),
        known_pools={"gpu-spot"},
    )
    assert {d.day for d in result.days} == {DAY.date()}


def test_forms_are_told_apart_by_name_then_content() -> None:
    assert guess_form("bill.jsonl", "") is ExportForm.JSON_LINES
    assert guess_form("bill.txt", '{"cost": 1}') is ExportForm.JSON_LINES
    assert guess_form("bill.csv", "usage_start_time,cost") is ExportForm.CSV


lives = st.lists(
    st.tuples(
        st.integers(0, 4 * 86400), st.integers(1, 2 * 86400), st.sampled_from([0.35, 0.68, 3.67])
    ),
    min_size=1,
    max_size=6,
)


@given(lives)
@settings(max_examples=60, deadline=None)
def test_any_node_lives_billed_hourly_per_sku_match_the_ledger(
    spans: list[tuple[int, int, float]],
) -> None:
    nodes = [
        BilledNode(
            f"n{i}",
            "gpu-spot",
            price,
            DAY + timedelta(seconds=lo),
            DAY + timedelta(seconds=lo + length),
        )
        for i, (lo, length, price) in enumerate(spans)
    ]
    ours = ledger_by_node_day([life(n) for n in nodes], now=DAY + timedelta(days=10))
    result = reconcile(
        ours, read_export(as_csv(rows(nodes)), ExportForm.CSV), known_pools={"gpu-spot"}
    )
    assert {d.match for d in result.days} <= {Match.MATCHED}
    assert sum(ours.values(), Fraction(0)) == result.ledger_usd
