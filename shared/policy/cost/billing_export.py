"""The ledger against the real bill: a Cloud Billing export to BigQuery, compared per node
and day. Pure: the caller reads the file and passes its text.

The export's documented columns are read (standard and detailed usage cost tables):
`usage_start_time`, `usage_end_time`, `cost`, `currency`, `currency_conversion_rate`,
`credits`, `labels`, `system_labels`, `sku.description`, and, in the detailed (resource
level) export, `resource.name`: the VM's name, which is the node's name on GKE. A VM of the
standard export, which names no resource, is found by its `spotrain-node` label (put on
the VMs the platform starts), and a row's node pool by GKE's `goog-k8s-node-pool-name`
label or the `spotrain-pool` label.

Two forms are read: JSON lines as `bq extract --destination_format NEWLINE_DELIMITED_JSON`
writes them (nested records and repeated `[{key, value}]` fields), and CSV, which BigQuery
writes only for flat results: nested fields as dotted column names (`resource.name`) and
the repeated ones as JSON text (`TO_JSON_STRING(labels)`) or one column per label
(`labels.spotrain-node`).

Every problem is one line of the report, never a silent zero: missing columns, rows in
another currency with no rate to convert them, rows that name no node, nodes in the bill
that no pool spotrain knows.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from fractions import Fraction
from typing import Any

from shared.policy.cost.attribution import ZERO, NodeLife, attribute

NODE_LABEL = "spotrain-node"
POOL_LABEL = "spotrain-pool"
GKE_NODE_POOL_LABEL = "goog-k8s-node-pool-name"
REQUIRED = ("usage_start_time", "usage_end_time", "cost", "currency")
MATCH_WITHIN_USD = Fraction(1, 100)
MATCH_WITHIN_SHARE = Fraction(1, 100)
"""A node-day matches when ledger and bill differ by at most a cent or 1%, whichever is
more: the bill rounds each SKU's hourly line, the ledger prices whole node-seconds."""


class ExportError(ValueError):
    """The file cannot be compared at all; the message says why, one line."""


class ExportForm(StrEnum):
    CSV = "csv"
    JSON_LINES = "jsonl"


@dataclass(frozen=True)
class BillLine:
    node: str
    pool: str | None
    day: date
    cost_usd: Fraction
    credits_usd: Fraction


@dataclass(frozen=True)
class BillingExport:
    lines: tuple[BillLine, ...]
    problems: tuple[str, ...]
    rows: int


def read_export(text: str, form: ExportForm) -> BillingExport:
    """The export's lines that name a node, in USD, and a line per problem found."""
    records = _csv_records(text) if form is ExportForm.CSV else _json_records(text)
    return _lines(records)


def guess_form(name: str, text: str) -> ExportForm:
    if name.endswith((".jsonl", ".ndjson", ".json")) or text.lstrip().startswith("{"):
        return ExportForm.JSON_LINES
    return ExportForm.CSV


def _csv_records(text: str) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    columns = set(reader.fieldnames or ())
    missing = [c for c in REQUIRED if c not in columns]
    if not reader.fieldnames:
        raise ExportError("the billing export is empty: no header row")
    _refuse_missing(missing)
    if not {"resource.name", "labels"} & columns and not any(
        c.startswith("labels.") for c in columns
    ):
        msg = "the billing export has no resource.name and no labels column: no row names a node"
        raise ExportError(msg)
    records = []
    for row in reader:
        record: dict[str, Any] = {key: value for key, value in row.items() if key is not None}
        for repeated in ("labels", "system_labels", "credits"):
            record[repeated] = _json_text(record.get(repeated))
        for key, value in row.items():
            if key is not None and key.startswith("labels.") and value:
                record["labels"] = [*record["labels"], {"key": key[7:], "value": value}]
        record["resource"] = {"name": row.get("resource.name") or None}
        records.append(record)
    return records


def _json_text(text: str | None) -> list[Any]:
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _json_records(text: str) -> list[dict[str, Any]]:
    records = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            msg = f"line {number} of the billing export is not JSON: {error}"
            raise ExportError(msg) from None
        if not isinstance(record, dict):
            raise ExportError(f"line {number} of the billing export is not a JSON object")
        seen |= record.keys()
        records.append(record)
    if not records:
        raise ExportError("the billing export is empty: no rows")
    _refuse_missing([c for c in REQUIRED if c not in seen])
    return records


def _refuse_missing(missing: list[str]) -> None:
    if missing:
        msg = (
            f"the billing export lacks the column(s) {', '.join(missing)} "
            "(the Cloud Billing BigQuery export's usage cost columns)"
        )
        raise ExportError(msg)


@dataclass
class _Tally:
    rows: int = 0
    usd: Fraction = ZERO


def _lines(records: list[dict[str, Any]]) -> BillingExport:
    lines = []
    nameless = _Tally()
    foreign: dict[str, _Tally] = defaultdict(_Tally)
    unreadable: list[str] = []
    for number, record in enumerate(records, start=1):
        try:
            start = _timestamp(record.get("usage_start_time"))
            cost = _amount(record.get("cost"))
        except ValueError as error:
            unreadable.append(f"row {number}: {error}")
            continue
        currency = str(record.get("currency") or "").upper()
        labels = _labels(record.get("labels")) | _labels(record.get("system_labels"))
        node = _node(record, labels)
        credits_total = sum((_credit(c) for c in record.get("credits") or ()), ZERO)
        if currency != "USD":
            rate = _rate(record.get("currency_conversion_rate"))
            if rate is None:
                foreign[currency or "no currency"].rows += 1
                foreign[currency or "no currency"].usd += cost
                continue
            cost, credits_total = cost / rate, credits_total / rate
        if node is None:
            nameless.rows += 1
            nameless.usd += cost
            continue
        pool = labels.get(POOL_LABEL) or labels.get(GKE_NODE_POOL_LABEL)
        lines.append(BillLine(node, pool, start.date(), cost, credits_total))
    problems = [f"{len(unreadable)} row(s) unreadable, left out: " + "; ".join(unreadable[:3])]
    problems = problems if unreadable else []
    for currency, tally in sorted(foreign.items()):
        problems.append(
            f"{tally.rows} row(s) in {currency}, not USD, with no currency_conversion_rate: "
            f"left out ({float(tally.usd):.2f} {currency} not compared)"
        )
    if nameless.rows:
        problems.append(
            f"{nameless.rows} row(s) name no node (no resource.name, no {NODE_LABEL} label: "
            f"other services, or a standard export): left out (${float(nameless.usd):.2f})"
        )
    return BillingExport(lines=tuple(lines), problems=tuple(problems), rows=len(records))


def _node(record: Mapping[str, Any], labels: Mapping[str, str]) -> str | None:
    resource = record.get("resource")
    name = resource.get("name") if isinstance(resource, Mapping) else None
    return str(name) if name else labels.get(NODE_LABEL)


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, list):
        return {}
    return {
        str(item["key"]): str(item.get("value") or "")
        for item in value
        if isinstance(item, Mapping) and "key" in item
    }


def _credit(value: Any) -> Fraction:
    if not isinstance(value, Mapping):
        return ZERO
    try:
        return _amount(value.get("amount"))
    except ValueError:
        return ZERO


def _rate(value: Any) -> Fraction | None:
    try:
        rate = _amount(value)
    except ValueError:
        return None
    return rate if rate > 0 else None


def _amount(value: Any) -> Fraction:
    if isinstance(value, bool) or value is None or value == "":
        msg = f"not an amount: {value!r}"
        raise ValueError(msg)
    try:
        return Fraction(Decimal(str(value)))
    except (InvalidOperation, ValueError):
        msg = f"not an amount: {value!r}"
        raise ValueError(msg) from None


def _timestamp(value: Any) -> datetime:
    """ISO 8601, or BigQuery's own `2026-12-01 10:00:00 UTC`."""
    text = str(value or "").strip()
    if text.endswith(" UTC"):
        text = text[:-4] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        msg = f"not a timestamp: {value!r}"
        raise ValueError(msg) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# --- the ledger, per node and day ---------------------------------------------------------


def ledger_by_node_day(
    nodes: Iterable[NodeLife], now: datetime
) -> dict[tuple[str, date], Fraction]:
    """What the ledger bills each node on each UTC day, up to `now`: the ledger's own
    attribution, one day at a time (so never past an open node's last sighting)."""
    lives = list(nodes)
    if not lives:
        return {}
    day = min(life.start for life in lives).astimezone(UTC).date()
    by_day: dict[tuple[str, date], Fraction] = {}
    while (start := datetime.combine(day, time.min, UTC)) < now:
        end = min(start + timedelta(days=1), now)
        for bill in attribute(lives, (), start, end).bills:
            by_day[(bill.node, day)] = bill.cost_usd
        day += timedelta(days=1)
    return by_day


class Match(StrEnum):
    MATCHED = "matched"
    DIFFERS = "differs"
    NOT_IN_LEDGER = "not in ledger"
    NOT_BILLED = "not billed"


@dataclass(frozen=True)
class NodeDay:
    node: str
    day: date
    ledger_usd: Fraction
    bill_usd: Fraction
    match: Match

    @property
    def difference_usd(self) -> Fraction:
        return self.ledger_usd - self.bill_usd


@dataclass(frozen=True)
class Reconciliation:
    days: tuple[NodeDay, ...]
    problems: tuple[str, ...]
    credits_usd: Fraction = ZERO
    counts: Mapping[Match, int] = field(default_factory=dict)

    @property
    def ledger_usd(self) -> Fraction:
        return sum((d.ledger_usd for d in self.days), ZERO)

    @property
    def bill_usd(self) -> Fraction:
        return sum((d.bill_usd for d in self.days), ZERO)


def reconcile(
    ledger: Mapping[tuple[str, date], Fraction],
    export: BillingExport,
    *,
    known_pools: Iterable[str],
) -> Reconciliation:
    """Node-day by node-day: matched, differing, in the bill only, in the ledger only.
    Only the days the export covers are compared: a ledger day outside them is not yet
    billed, not missing. A node of the bill the ledger lacks, whose pool no pool spotrain
    knows, is a problem of its own (another cluster's, or a pool left out of the config)."""
    billed: dict[tuple[str, date], Fraction] = defaultdict(Fraction)
    pools: dict[str, str | None] = {}
    credits_total = ZERO
    for line in export.lines:
        billed[(line.node, line.day)] += line.cost_usd
        pools.setdefault(line.node, line.pool)
        credits_total += line.credits_usd
    covered = {day for _, day in billed}
    known = set(known_pools)
    ledger_nodes = {node for node, _ in ledger}
    problems = list(export.problems)
    strangers = sorted(
        node for node in pools if node not in ledger_nodes and pools[node] not in known
    )
    for node in strangers:
        pool = pools[node]
        where = f"GKE node pool {pool}" if pool else "no node pool label"
        cost = sum((usd for (n, _), usd in billed.items() if n == node), ZERO)
        problems.append(
            f"node {node} ({where}) is billed ${float(cost):.2f} but belongs to no pool "
            "spotrain knows"
        )
    days = []
    for key in sorted(set(billed) | {k for k in ledger if k[1] in covered}):
        node, day = key
        ours, theirs = ledger.get(key, ZERO), billed.get(key, ZERO)
        if key not in ledger:
            match = Match.NOT_IN_LEDGER
        elif key not in billed:
            match = Match.NOT_BILLED
        elif abs(ours - theirs) <= max(MATCH_WITHIN_USD, MATCH_WITHIN_SHARE * theirs):
            match = Match.MATCHED
        else:
            match = Match.DIFFERS
        days.append(NodeDay(node, day, ours, theirs, match))
    counts = {m: sum(1 for d in days if d.match is m) for m in Match}
    return Reconciliation(
        days=tuple(days), problems=tuple(problems), credits_usd=credits_total, counts=counts
    )
