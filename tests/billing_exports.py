"""Cloud Billing exports made in the documented BigQuery schema (the detailed usage cost
table, `gcp_billing_export_resource_v1_<ACCOUNT>`), from node lifetimes: one row per node,
SKU and usage hour, as the export itemises a VM (its cores, its memory, its GPUs)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

SKUS = (
    ("CB8E-AB2F-FA47", "Spot Preemptible N1 Predefined Instance Core running in Americas", 0.3),
    ("7F0A-9C1D-3B66", "Spot Preemptible N1 Predefined Instance Ram running in Americas", 0.1),
    ("0B5E-D3A4-1C9F", "Nvidia L4 GPU attached to Spot Preemptible VMs running in Americas", 0.6),
)
"""Each SKU's share of a node's price."""


@dataclass(frozen=True)
class BilledNode:
    node: str
    gke_pool: str
    price_per_hour_usd: float
    start: datetime
    end: datetime


def rows(
    nodes: Iterable[BilledNode],
    *,
    currency: str = "USD",
    rate: float = 1.0,
    project: str = "ml-platform",
) -> list[dict[str, Any]]:
    """The export's rows: hourly usage per SKU, `cost` rounded to the micro-unit."""
    out = []
    for node in nodes:
        hour = node.start.replace(minute=0, second=0, microsecond=0)
        while hour < node.end:
            lo, hi = max(hour, node.start), min(hour + timedelta(hours=1), node.end)
            used_s = (hi - lo).total_seconds()
            for sku_id, description, share in SKUS:
                cost = Decimal(repr(node.price_per_hour_usd * share * used_s / 3600 * rate))
                out.append(
                    _row(node, hour, sku_id, description, cost, used_s, currency, rate, project)
                )
            hour += timedelta(hours=1)
    return out


def _row(  # noqa: PLR0917  # the columns of one export row
    node: BilledNode,
    hour: datetime,
    sku_id: str,
    description: str,
    cost: Decimal,
    used_s: float,
    currency: str,
    rate: float,
    project: str,
) -> dict[str, Any]:
    return {
        "billing_account_id": "01A2B3-C4D5E6-F7A8B9",
        "service": {"id": "6F81-5844-456A", "description": "Compute Engine"},
        "sku": {"id": sku_id, "description": description},
        "usage_start_time": _bq_time(hour),
        "usage_end_time": _bq_time(hour + timedelta(hours=1)),
        "project": {"id": project, "number": "123456789012", "name": project},
        "labels": [
            {"key": "goog-k8s-cluster-name", "value": "spotrain"},
            {"key": "goog-k8s-node-pool-name", "value": node.gke_pool},
        ],
        "system_labels": [{"key": "compute.googleapis.com/machine_spec", "value": "g2-standard-4"}],
        "location": {
            "location": "us-central1",
            "country": "US",
            "region": "us-central1",
            "zone": "us-central1-a",
        },
        "resource": {
            "name": node.node,
            "global_name": "//compute.googleapis.com/projects/"
            f"{project}/zones/us-central1-a/instances/{sum(map(ord, node.node)) * 7919}",
        },
        "export_time": _bq_time(hour + timedelta(hours=5)),
        "cost": float(cost.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)),
        "currency": currency,
        "currency_conversion_rate": rate,
        "usage": {
            "amount": used_s,
            "unit": "seconds",
            "amount_in_pricing_units": used_s / 3600,
            "pricing_unit": "hour",
        },
        "credits": [],
        "invoice": {"month": hour.strftime("%Y%m")},
        "cost_type": "regular",
    }


def _bq_time(moment: datetime) -> str:
    """As `bq extract` writes a TIMESTAMP."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def as_json_lines(export: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in export)


def as_csv(export: Sequence[dict[str, Any]], *, drop: Sequence[str] = ()) -> str:
    """Flattened as a query would (`SELECT resource.name AS `resource.name`, ...,
    TO_JSON_STRING(labels) AS labels`): nested fields dotted, repeated ones as JSON."""
    flat = []
    for row in export:
        record: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(value, dict):
                record.update({f"{key}.{k}": v for k, v in value.items()})
            elif isinstance(value, list):
                record[key] = json.dumps(value)
            else:
                record[key] = value
        for column in drop:
            record.pop(column, None)
        flat.append(record)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(flat[0]))
    writer.writeheader()
    writer.writerows(flat)
    return buffer.getvalue()
