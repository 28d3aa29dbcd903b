"""docs/deploy-gke.md against the chart and the code: the values it names exist, the
operator it pins is the one the chart is checked against, and the scaler's IAM role holds
what the GKE provider's calls take."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from services.preemption_watcher.adapters.gke_node_pools import (
    REQUIRED_PERMISSIONS as WATCHER_PERMISSIONS,
)
from services.scaler.adapters.gke import REQUIRED_PERMISSIONS
from tests.fakes.kuberay_validation import SUPPORTED_OPERATOR
from tests.helm.chart import CHART

GUIDE = Path(__file__).parents[2] / "docs" / "deploy-gke.md"
TEXT = GUIDE.read_text()
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())


def _has(values: Any, path: list[str]) -> bool:
    for part in path:
        if not isinstance(values, dict) or part not in values:
            return False
        values = values[part]
    return True


def test_every_value_the_guide_names_is_in_the_chart() -> None:
    named = set(re.findall(r"`([a-zA-Z]+(?:\.[a-zA-Z_]+)+)(?::[^`]*)?`", TEXT))
    values = sorted(n for n in named if n.split(".")[0] in VALUES)
    assert values, "the guide names values"
    # What is not a value is a log event the code writes (`gke.resize`), or it is a typo.
    code = "\n".join(p.read_text() for p in (CHART.parents[1] / "services").rglob("*.py"))
    missing = [n for n in values if not _has(VALUES, n.split(".")) and f'"{n}"' not in code]
    assert missing == []


def test_the_guide_pins_the_operator_the_chart_is_checked_against() -> None:
    (pinned,) = re.findall(r"kuberay/kuberay-operator --version (\S+)", TEXT)
    assert f"v{pinned}".startswith(SUPPORTED_OPERATOR + ".")


def test_the_scalers_role_holds_what_the_gke_provider_calls_take() -> None:
    (created,) = re.findall(
        r"roles create spotrainNodePoolResizer .*?--permissions (\S+)", TEXT, re.S
    )
    assert sorted(created.split(",")) == sorted(REQUIRED_PERMISSIONS)
    (row,) = [line for line in TEXT.splitlines() if line.startswith("| `spotrain-scaler`")]
    assert sorted(re.findall(r"`([a-z]+\.[a-zA-Z]+\.[a-zA-Z]+)`", row)) == sorted(
        REQUIRED_PERMISSIONS
    )


def test_the_watchers_role_holds_what_reading_node_pools_takes() -> None:
    (created,) = re.findall(
        r"roles create spotrainNodePoolReader .*?--permissions (\S+)", TEXT, re.S
    )
    assert sorted(created.split(",")) == sorted(WATCHER_PERMISSIONS)
    rows = [line for line in TEXT.splitlines() if line.startswith("| `spotrain-watcher`")]
    held = {p for row in rows for p in re.findall(r"`([a-z]+\.[a-zA-Z]+\.[a-zA-Z]+)`", row)}
    assert held == set(WATCHER_PERMISSIONS)
