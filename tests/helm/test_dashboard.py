"""The Grafana dashboards (every dashboards/*.json of the chart, and the alert
examples in docs/operations.md) query only what the gateway exports.

Tools: jsonschema for each dashboard's structure (a schema of the fields
Grafana needs) plus layout rules; prometheus_client's exposition parser for
the metric names, read from a running gateway's /metrics (`gateway_metrics_text`,
tests/helm/conftest.py: a real gateway over fake workers after traffic, a
phase switch and a planner decision).
"""

from __future__ import annotations

import json
import pathlib
import re

import jsonschema
import pytest
import yaml

pytestmark = pytest.mark.helm

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "helm" / "evolving-infra" / "dashboards").glob("*.json"))


# -- Grafana dashboard -----------------------------------------------------------

_DATASOURCE = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
}
_GRID = {
    "type": "object",
    "required": ["x", "y", "w", "h"],
    "properties": {k: {"type": "integer", "minimum": 0} for k in "xywh"},
}
DASHBOARD_SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 30},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": {"type": "object", "required": ["name", "type"]}}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {
                    "id": {"type": "integer"},
                    "gridPos": _GRID,
                    "title": {"type": "string", "minLength": 1},
                },
                "if": {"properties": {"type": {"const": "row"}}},
                "then": {"properties": {"panels": {"type": "array"}}},
                "else": {
                    "required": ["datasource", "targets", "fieldConfig"],
                    "properties": {
                        "type": {"enum": ["timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text"]},
                        "datasource": _DATASOURCE,
                        "targets": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["refId", "expr"],
                                "properties": {
                                    "refId": {"type": "string"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "datasource": _DATASOURCE,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture(params=DASHBOARDS, ids=[d.name for d in DASHBOARDS])
def dashboard(request: pytest.FixtureRequest) -> dict:
    return json.loads(request.param.read_text())


def queries(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash.get("annotations", {}).get("list", []) if "expr" in a]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_dashboard_json_structure(dashboard: dict) -> None:
    dash = dashboard
    jsonschema.validate(dash, DASHBOARD_SCHEMA)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, f"panel {p['title']!r} wider than the grid"
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        cells |= area
        ref_ids = [t["refId"] for t in p.get("targets", [])]
        assert len(ref_ids) == len(set(ref_ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    builtin = {"__rate_interval", "__interval", "__range"}
    for expr in queries(dash):
        for var in re.findall(r"\$\{?(\w+)", expr):
            assert var in variables | builtin, f"undefined variable ${var} in {expr}"
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


# -- the dashboard queries only what the gateway exports -------------------------

_SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}


def exported_series(exposition: str) -> set[str]:
    """Series names a Prometheus scrape of `exposition` can produce, from the
    TYPE lines, so labelled metrics that have no sample yet still count."""
    from prometheus_client.parser import text_string_to_metric_families

    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in _SERIES_SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def gateway_label_names() -> dict[str, set[str]]:
    """Label names per series of gateway.metrics.GatewayMetrics (its metrics and its collectors' families)."""
    from prometheus_client.metrics import MetricWrapperBase

    from gateway.metrics import GatewayMetrics

    labels: dict[str, set[str]] = {}
    metrics = GatewayMetrics()
    families = [(m._name, m._type, m._labelnames) for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    # The collector yields Counter/GaugeMetricFamily objects; `Metric`, their declared type, has no label names.
    families += [(f.name, f.type, f._labelnames) for f in metrics._kv_peers.collect()]  # type: ignore[attr-defined]
    for name, kind, label_names in families:
        for suffix in _SERIES_SUFFIXES.get(kind or "", ("",)):
            extra = {"le"} if suffix == "_bucket" else set()
            labels[name + suffix] = set(label_names) | extra
    return labels


@pytest.fixture
def gateway_exposition(gateway_metrics_text: str) -> str:
    """A running gateway's /metrics text (tests/helm/conftest.py)."""
    return gateway_metrics_text


def test_every_dashboard_metric_is_exported_by_the_gateway(dashboard: dict, gateway_exposition: str) -> None:
    exported = exported_series(gateway_exposition)
    assert exported, "the gateway exports no metrics"
    used = {m for expr in queries(dashboard) for m in re.findall(r"\b(evolving_[A-Za-z0-9_:]+)", expr)}
    assert used, "the dashboard queries no evolving_ metric"
    missing = sorted(used - exported)
    assert not missing, f"dashboard queries metrics the gateway does not export: {missing}"
    # No foreign metric names either: every selector in the dashboard is an evolving_ one.
    for expr in queries(dashboard):
        for name in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{|\[)", expr):
            assert name.startswith("evolving_"), f"{name} in {expr}"


def test_alert_rules_in_the_operations_guide_use_exported_metrics(gateway_exposition: str) -> None:
    exported = exported_series(gateway_exposition)
    guide = (ROOT / "docs" / "operations.md").read_text()
    rules = [
        doc
        for block in re.findall(r"```yaml\n(.*?)```", guide, re.S)
        for doc in yaml.safe_load_all(block)
        if doc and doc.get("kind") == "PrometheusRule"
    ]
    assert rules, "docs/operations.md has no PrometheusRule example"
    exprs = [r["expr"] for rule in rules for g in rule["spec"]["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\b(evolving_[A-Za-z0-9_:]+)", e)}
    assert used and not used - exported, sorted(used - exported)


def test_dashboard_labels_exist_on_the_metrics_they_filter(dashboard: dict) -> None:
    labels = gateway_label_names()
    for expr in queries(dashboard):
        metrics = re.findall(r"\b(evolving_[A-Za-z0-9_:]+)", expr)
        known = set().union(*(labels.get(m, set()) for m in metrics))
        for selector_metric, selector in re.findall(r"\b(evolving_[A-Za-z0-9_:]+)\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector):
                assert label in labels[selector_metric], f"{selector_metric} has no label {label!r}"
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",") if g.strip()):
                assert label in known, f"grouping by {label!r} that none of {metrics} carries: {expr}"
        for var_metric in re.findall(r"label_values\((evolving_\w+),\s*(\w+)\)", expr):
            assert var_metric[1] in labels[var_metric[0]]
