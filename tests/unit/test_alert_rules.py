"""The shipped alert rules and Grafana dashboard use only metrics cronlog defines
(streams/metrics.py). promtool is not packaged for this machine (neither Debian's
prometheus package nor PyPI is used by the suite), so the rules are parsed here: their
shape, balanced PromQL, and every metric name checked against the definitions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from streams import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "compose" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "compose" / "grafana" / "cronlog-dashboard.json"
NAME = re.compile(r"\bcronlog_[a-z_]+\b")


def defined() -> set[str]:
    """Every sample name the processes can expose."""
    names: set[str] = set()
    for registry in metrics.ALL:
        for family in registry.collect():
            base = family.name
            if family.type == "counter":
                names.add(f"{base}_total")
            elif family.type == "histogram":
                names.update(f"{base}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
            else:
                names.add(base)
    return names


def balanced(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0 and expr.count("{") == expr.count("}") and expr.count("[") == expr.count("]")


def test_every_alert_rule_is_complete_and_names_known_metrics() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    known = defined()
    alerts = [rule for group in groups for rule in group["rules"]]
    assert len(alerts) >= 8
    for rule in alerts:
        assert rule["alert"].startswith("Cronlog"), rule
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule
        assert rule["annotations"]["summary"], rule
        assert balanced(rule["expr"]), rule["expr"]
        used = set(NAME.findall(rule["expr"]))
        assert used <= known, used - known
    names = {rule["alert"] for rule in alerts}
    assert {"CronlogRunsFailing", "CronlogStartLatenessHigh", "CronlogProcessDown"} <= names


def test_every_dashboard_query_names_known_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = defined()
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 15
    used = {name for expr in exprs for name in NAME.findall(expr)}
    assert used <= known, used - known
    assert balanced(" ".join(exprs))
    # Every metric a process exposes appears on the dashboard or in an alert.
    rules = RULES.read_text()
    shown = used | set(NAME.findall(rules))
    bases = {re.sub(r"_(bucket|count|sum|total)$", "", name) for name in known}
    for base in bases:
        assert any(name.startswith(base) for name in shown), base
