"""The chart's Grafana dashboards (helm/spotrain/dashboards/*.json), read as Grafana reads them.

`panel_queries` gives each panel's PromQL with Grafana's variables filled in, so a test can run
every query against a real Prometheus; `NEEDS_REAL_GPUS` names the panels whose series exist
only where Ray runs on real GPUs (the local stack's nodes declare GPUs without having them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.helm.chart import CHART

DASHBOARDS = CHART / "dashboards"

Dashboard = dict[str, Any]

# Panel titles that read Ray's device metrics (ray_node_gpus_utilization and the like): empty,
# and so exempt from "returns data", on a cluster without real GPUs.
NEEDS_REAL_GPUS: frozenset[str] = frozenset({"Device GPU utilisation"})
NEEDS_MULTI_NODE_JOB: frozenset[str] = frozenset({"Workers"})
"""Panels of a multi-node job's workers: tests/e2e/test_elastic.py's run draws them."""

# What Grafana puts in place of each variable the dashboards use, for a check or a real query:
# $__rate_interval is at least four scrape intervals; "All" of a multi-value variable is its
# allValue, `.*`.
DEFAULT_SUBSTITUTIONS: Mapping[str, str] = {"__rate_interval": "1m", "job_id": ".*"}

# $name or ${name}; Grafana's older [[name]] form is not used here.
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def load(path: Path) -> Dashboard:
    dashboard: Dashboard = json.loads(path.read_text())
    return dashboard


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too; a row itself is not a panel here."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def substitute(expr: str, substitutions: Mapping[str, str]) -> str:
    """The variables named in `substitutions` replaced; any other `$name` is left as it is."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return substitutions.get(name, match.group(0))

    return VARIABLE.sub(value, expr)


def panel_queries(
    dashboard: Mapping[str, Any], substitutions: Mapping[str, str] = DEFAULT_SUBSTITUTIONS
) -> list[tuple[str, str]]:
    """(panel title, expression with the variables substituted) for every query, in order."""
    return [
        (str(panel["title"]), substitute(str(target["expr"]), substitutions))
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
        if not target.get("hide", False)
    ]
