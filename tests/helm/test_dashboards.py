"""The chart's Grafana dashboards: well-formed for Grafana 10/11, laid out, and reading only
metrics docs/metrics.md lists, the way its types and labels allow."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helm.chart import REQUIRED_SETS, ROOT, Helm, Manifest, kinds
from tests.helm.dashboards import (
    DEFAULT_SUBSTITUTIONS,
    NEEDS_REAL_GPUS,
    VARIABLE,
    Dashboard,
    dashboard_files,
    load,
    panel_queries,
    panels,
    substitute,
)

pytestmark = pytest.mark.helm

CATALOGUE = ROOT / "docs" / "metrics.md"
EXPECTED = {
    "overview.json": "spotrain-overview",
    "jobs.json": "spotrain-jobs",
    "preemptions.json": "spotrain-preemptions",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge"}
UNITS = {"currencyUSD", "percentunit", "s", "short"}
GRID_COLUMNS = 24
# The Grafana variables an expression may use, per dashboard; $datasource only picks the source.
VARIABLES = {
    "overview.json": {"__rate_interval"},
    "jobs.json": {"__rate_interval", "job_id"},
    "preemptions.json": {"__rate_interval"},
}
JOB_FILTER = 'job_id=~"$job_id"'

METRIC = re.compile(r"(?<![\w:])((?:spotrain|ray)_[a-z_]+)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
PAIRS = {"(": ")", "[": "]", "{": "}"}


@dataclass(frozen=True)
class Metric:
    type: str | None  # None: named in the text, outside the tables (Ray's own)
    labels: frozenset[str] | None  # None: not listed


def _catalogue() -> dict[str, Metric]:
    """The backticked metric names of docs/metrics.md, with type and labels from its tables."""
    text = CATALOGUE.read_text()
    found: dict[str, Metric] = {}
    row = re.compile(r"^\|\s*`([a-z_]+)`\s*\|\s*(\w+)\s*\|([^|]*)\|", re.MULTILINE)
    for name, kind, labels in row.findall(text):
        found[name] = Metric(kind, frozenset(x.strip() for x in labels.split(",") if x.strip()))
    for name in re.findall(r"`((?:spotrain|ray)_[a-z_]+)`", text):
        found.setdefault(name, Metric(None, None))
    return found


CATALOGUED = _catalogue()


def _strip_strings(expr: str) -> str:
    return STRING.sub('""', expr)


def _metric_names(expr: str) -> list[str]:
    """Catalogue names an expression reads: a histogram's _bucket/_sum/_count as the histogram."""
    names = []
    for token in METRIC.findall(_strip_strings(expr)):
        base = next((token.removesuffix(s) for s in HISTOGRAM_SUFFIXES if token.endswith(s)), "")
        histogram = CATALOGUED.get(base, Metric(None, None)).type == "histogram"
        names.append(base if token not in CATALOGUED and histogram else token)
    return names


def _group(expr: str, start: int) -> str:
    """The text inside the parentheses opening at expr[start]."""
    depth = 0
    for i in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return expr[start + 1 : i]
    raise AssertionError(f"unbalanced from {start}: {expr}")


def promql_problems(expr: str, allowed: set[str]) -> list[str]:
    """What a PromQL parser would refuse that can be seen without one: unbalanced brackets,
    bad range durations, empty selectors, and Grafana variables left over (`allowed` are
    substituted first, as Grafana would)."""
    problems = []
    values = {k: v for k, v in DEFAULT_SUBSTITUTIONS.items() if k in allowed}
    filled = _strip_strings(substitute(expr, values))
    if not filled.strip():
        problems.append("empty")
    if "$" in filled:
        problems.append(f"variables left over: {VARIABLE.findall(filled)}")
    stack: list[str] = []
    for char in filled:
        if char in PAIRS:
            stack.append(PAIRS[char])
        elif char in PAIRS.values() and (not stack or stack.pop() != char):
            problems.append(f"unbalanced {char!r}")
            break
    if stack:
        problems.append(f"unclosed {''.join(reversed(stack))!r}")
    for duration in re.findall(r"\[([^\]]*)\]", filled):
        if not all(DURATION.match(part.strip()) for part in duration.split(":") if part.strip()):
            problems.append(f"bad range [{duration}]")
    if re.search(r"(?<!\w)\(\s*\)|\{\s*\}", filled):  # time() and the like are fine
        problems.append("empty group or selector")
    if re.search(r"[-+*/^]\s*$|^\s*[*/^]", filled):
        problems.append("dangling operator")
    return problems


def _dashboards() -> Iterator[Any]:
    for path in dashboard_files():
        yield pytest.param(path.name, load(path), id=path.name.removesuffix(".json"))


DASHBOARDS = list(_dashboards())


def _targets(dashboard: Dashboard) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel, target


def _variable_queries(dashboard: Dashboard) -> list[str]:
    queries = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


# -- the files and their schema ------------------------------------------------------------


def test_the_chart_ships_the_three_dashboards_with_unique_uids() -> None:
    found = {name: dashboard["uid"] for name, dashboard in (p.values for p in DASHBOARDS)}
    assert found == EXPECTED
    titles = [dashboard["title"] for _, dashboard in (p.values for p in DASHBOARDS)]
    assert len(set(titles)) == len(titles)


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_dashboard_has_the_schema_fields_grafana_needs(name: str, dashboard: Dashboard) -> None:
    assert dashboard["schemaVersion"] == 39
    assert dashboard["uid"] == EXPECTED[name]
    assert dashboard["title"]
    assert dashboard["tags"] == ["spotrain"]
    assert dashboard.get("id") is None  # provisioned by the sidecar: Grafana assigns it
    assert {"from", "to"} <= dashboard["time"].keys()
    assert 8 <= len(list(panels(dashboard))) <= 14
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource"
    assert source["query"] == "prometheus"
    assert set(variables) == {"datasource", *VARIABLES[name]} - {"__rate_interval"}


def test_jobs_dashboard_filters_by_a_multi_value_job_variable() -> None:
    (dashboard,) = [d for n, d in (p.values for p in DASHBOARDS) if n == "jobs.json"]
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "job_id"]
    assert variable["type"] == "query"
    assert variable["datasource"] == DATASOURCE
    assert _variable_queries(dashboard) == ["label_values(spotrain_job_step, job_id)"]
    assert variable["includeAll"] is True
    assert variable["multi"] is True
    assert variable["allValue"] == ".*"
    uses = [t["expr"] for _, t in _targets(dashboard) if "$job_id" in t["expr"]]
    assert uses
    for expr in uses:
        assert expr.count("$job_id") == expr.count(JOB_FILTER), expr
    for _, target in _targets(dashboard):
        if any(n.startswith("spotrain_job_") for n in _metric_names(target["expr"])):
            assert JOB_FILTER in target["expr"], target["expr"]


# -- panels --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_every_panel_reads_the_chosen_prometheus(name: str, dashboard: Dashboard) -> None:
    for panel, target in _targets(dashboard):
        assert panel["datasource"] == DATASOURCE, (name, panel["title"])
        assert target.get("datasource", DATASOURCE) == DATASOURCE, (name, panel["title"])


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_every_panel_has_queries_a_unit_and_legends(name: str, dashboard: Dashboard) -> None:
    titles = [p["title"] for p in panels(dashboard)]
    assert len(set(titles)) == len(titles), titles
    ids = [p["id"] for p in panels(dashboard)]
    assert len(set(ids)) == len(ids), ids
    for panel in panels(dashboard):
        where = (name, panel["title"])
        assert panel["type"] in PANEL_TYPES, where
        assert panel["fieldConfig"]["defaults"].get("unit") in UNITS, where
        assert panel.get("description"), where
        targets = panel["targets"]
        assert targets, where
        assert [t["refId"] for t in targets] == [chr(ord("A") + i) for i in range(len(targets))]
        for target in targets:
            assert target["expr"].strip(), where
            assert target["legendFormat"], where


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_panels_fit_the_grid_without_overlapping(name: str, dashboard: Dashboard) -> None:
    boxes = []
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        x, y, w, h = grid["x"], grid["y"], grid["w"], grid["h"]
        assert min(x, y) >= 0, (name, panel["title"])
        assert min(w, h) > 0, (name, panel["title"])
        assert x + w <= GRID_COLUMNS, (name, panel["title"])
        boxes.append((panel["title"], x, y, w, h))
    for (a, ax, ay, aw, ah), (b, bx, by, bw, bh) in itertools.combinations(boxes, 2):
        overlap = ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah
        assert not overlap, (name, a, b)


# -- the queries ---------------------------------------------------------------------------


def test_the_catalogue_is_read() -> None:
    """The parse above finds docs/metrics.md's tables, types and labels, and Ray's names."""
    assert CATALOGUED["spotrain_pool_nodes"] == Metric("gauge", frozenset({"pool", "capacity"}))
    assert CATALOGUED["spotrain_recovery_seconds"] == Metric("histogram", frozenset())
    assert CATALOGUED["spotrain_resumes_total"].type == "counter"
    assert CATALOGUED["ray_node_gpus_utilization"] == Metric(None, None)
    assert _metric_names("sum by (le) (rate(spotrain_recovery_seconds_bucket[1m]))") == [
        "spotrain_recovery_seconds"
    ]


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_every_metric_is_in_the_catalogue(name: str, dashboard: Dashboard) -> None:
    exprs = [t["expr"] for _, t in _targets(dashboard)] + _variable_queries(dashboard)
    for expr in exprs:
        unknown = [m for m in _metric_names(expr) if m not in CATALOGUED]
        assert not unknown, (name, expr, unknown)


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_counters_and_histograms_are_read_as_rates(name: str, dashboard: Dashboard) -> None:
    """A counter or histogram bucket only inside rate()/increase() over a range; a gauge never."""
    for _, target in _targets(dashboard):
        expr = _strip_strings(target["expr"])
        for match in METRIC.finditer(expr):
            token = match.group(1)
            (metric,) = _metric_names(token)
            kind = CATALOGUED[metric].type
            before = expr[: match.start()].rstrip()
            after = re.sub(r"^\{[^}]*\}", "", expr[match.end() :].lstrip())
            in_rate = re.search(r"\b(rate|increase)\($", before) is not None
            rate_wanted = kind == "counter" or token.endswith("_bucket")
            assert in_rate == rate_wanted, (name, expr, token)
            assert after.startswith("[") == rate_wanted, (name, expr, token)


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_queries_group_and_filter_by_labels_the_metrics_have(
    name: str, dashboard: Dashboard
) -> None:
    """`by (...)`, `{label=...}` and a legend's `{{label}}` name labels the series carry."""
    for panel, target in _targets(dashboard):
        expr = _strip_strings(target["expr"])
        kept: set[str] = set()
        for by in re.finditer(r"\bby\s*\(([^)]*)\)\s*\(", expr):
            labels = {x.strip() for x in by.group(1).split(",") if x.strip()}
            kept |= labels
            inner = _group(expr, by.end() - 1)
            for token in METRIC.findall(inner):
                (metric,) = _metric_names(token)
                carried = CATALOGUED[metric].labels
                if carried is not None:
                    extra = {"le"} if token.endswith("_bucket") else set()
                    assert labels <= carried | extra, (name, expr, metric, labels - carried)
        for selector in re.finditer(r"((?:spotrain|ray)_[a-z_]+)\{([^}]*)\}", expr):
            (metric,) = _metric_names(selector.group(1))
            matched = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector.group(2)))
            carried = CATALOGUED[metric].labels
            assert carried is None or matched <= carried, (name, expr, matched)
        if not re.search(r"\b(sum|avg|max|min|count)\b", expr):
            for metric in _metric_names(expr):
                kept |= CATALOGUED[metric].labels or set()
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]))
        assert legend <= kept, (name, panel["title"], legend - kept)


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_every_expression_is_sane_promql(name: str, dashboard: Dashboard) -> None:
    """No promtool checks a bare expression offline; this catches what a slip of the pen
    leaves (the queries were also parsed once by Prometheus's own PromQL grammar)."""
    for panel, target in _targets(dashboard):
        expr = target["expr"]
        used = {m.group(1) or m.group(2) for m in VARIABLE.finditer(expr)}
        assert used <= VARIABLES[name], (name, panel["title"], used)
        assert not promql_problems(expr, VARIABLES[name]), (
            name,
            expr,
            promql_problems(expr, VARIABLES[name]),
        )


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        pytest.param("sum by (pool (spotrain_pool_nodes)", "unclosed", id="paren"),
        pytest.param("rate(spotrain_resumes_total[1m)", "unbalanced", id="bracket"),
        pytest.param("increase(spotrain_resumes_total[$__range])", "variables left", id="var"),
        pytest.param("rate(spotrain_resumes_total[5 minutes])", "bad range", id="duration"),
        pytest.param("spotrain_queue_jobs{}", "empty group", id="empty-selector"),
        pytest.param("sum(spotrain_cost_usd) /", "dangling", id="operator"),
    ],
)
def test_the_promql_check_has_teeth(expr: str, problem: str) -> None:
    problems = promql_problems(expr, {"__rate_interval"})
    assert any(problem in p for p in problems), problems
    fine = 'sum by (le) (rate(x_bucket{a=~"$job_id"}[$__rate_interval]))'
    assert not promql_problems(fine, {"__rate_interval", "job_id"})


@pytest.mark.parametrize(("name", "dashboard"), DASHBOARDS)
def test_panel_queries_fill_in_the_variables(name: str, dashboard: Dashboard) -> None:
    queries = panel_queries(dashboard)
    assert len(queries) == len(list(_targets(dashboard)))
    for title, expr in queries:
        assert "$" not in expr, (name, title, expr)
    assert panel_queries({"panels": [{"title": "t", "targets": [{"expr": "x[$x]"}]}]}, {}) == [
        ("t", "x[$x]")
    ]


def test_panels_needing_real_gpus_are_the_ones_reading_ray_device_metrics() -> None:
    """Only those may come back empty on the local stack; each says so in its description."""
    reading_ray = set()
    all_titles = set()
    for _, dashboard in (p.values for p in DASHBOARDS):
        for panel, target in _targets(dashboard):
            all_titles.add(panel["title"])
            if any(m.startswith("ray_node_g") for m in _metric_names(target["expr"])):
                reading_ray.add(panel["title"])
                assert "real GPUs" in panel["description"], panel["title"]
    assert reading_ray == NEEDS_REAL_GPUS
    assert all_titles >= NEEDS_REAL_GPUS


# -- the chart -----------------------------------------------------------------------------


def _dashboard_maps(manifests: list[Manifest]) -> list[Manifest]:
    return [
        m
        for m in kinds(manifests, "ConfigMap")
        if m["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboards"
    ]


def test_chart_renders_one_configmap_per_dashboard(helm: Helm) -> None:
    manifests = helm.render(sets={**REQUIRED_SETS, "metrics.dashboards.enabled": "true"})
    maps = _dashboard_maps(manifests)
    assert len(maps) == len(EXPECTED)
    by_file = {}
    for configmap in maps:
        (key,) = configmap["data"]
        by_file[key] = configmap
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["name"] == f"spotrain-dashboard-{key.removesuffix('.json')}"
    assert set(by_file) == set(EXPECTED)
    for path in dashboard_files():
        assert json.loads(by_file[path.name]["data"][path.name]) == load(path)


def test_no_dashboards_unless_asked(minimal: list[Manifest]) -> None:
    assert _dashboard_maps(minimal) == []
