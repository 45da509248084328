"""The metric definitions and their helpers (streams/metrics.py), pure."""

from __future__ import annotations

import socket

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st

from connectors.cli.common import chosen_metrics_port
from streams import metrics
from streams.metrics import BoundedLabels, MetricsServer, metrics_port, reason_kind


def test_every_metric_is_named_by_the_conventions() -> None:
    names = set()
    for registry in metrics.ALL:
        for family in registry.collect():
            names.add(family.name)
            assert family.name.startswith("cronlog_"), family.name
            assert family.documentation, family.name
            if family.type == "counter":
                assert not family.name.endswith("_total")  # the client adds it
            if family.type == "histogram" and "time" in family.documentation.lower():
                assert family.name.endswith("_seconds"), family.name
    assert "cronlog_run_start_lateness_seconds" in names
    assert "cronlog_runs_finished" in names  # exposed as cronlog_runs_finished_total


@given(st.text(max_size=200))
def test_a_reason_becomes_a_short_label_without_digits(reason: str) -> None:
    kind = reason_kind(reason)
    assert 0 < len(kind) <= 40
    assert not any(c.isdigit() for c in kind)


def test_label_values_stay_bounded() -> None:
    labels = BoundedLabels(limit=3)
    assert [labels(v) for v in ("a", "b", "a", "c", "d", "b")] == ["a", "b", "a", "c", "other", "b"]


def test_reasons_of_one_kind_share_a_label() -> None:
    assert reason_kind("exit code 1") == reason_kind("exit code 127") == "exit_code"
    assert reason_kind("lost: worker w1 declared dead") == "lost"
    assert reason_kind("") == "none"


def test_the_port_comes_from_the_option_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """streams/metrics.py is given CRONLOG_METRICS_PORT's value; the CLI reads it
    (connectors/cli/common.py)."""
    assert metrics_port(None) is None
    assert metrics_port(9100) == 9100
    assert metrics_port(0) is None  # 0: none
    assert metrics_port(None, "9200") == 9200
    assert metrics_port(9100, "9200") == 9100
    assert metrics_port(None, " ") is None
    with pytest.raises(ValueError, match="CRONLOG_METRICS_PORT must be a port number"):
        metrics_port(None, "nine")
    with pytest.raises(ValueError, match=r"0\.\.65535"):
        metrics_port(70000)
    monkeypatch.delenv("CRONLOG_METRICS_PORT", raising=False)
    assert chosen_metrics_port(None) is None
    monkeypatch.setenv("CRONLOG_METRICS_PORT", "9200")
    assert chosen_metrics_port(None) == 9200
    assert chosen_metrics_port(9100) == 9100
    monkeypatch.setenv("CRONLOG_METRICS_PORT", "nine")
    with pytest.raises(typer.Exit):
        chosen_metrics_port(None)


def test_no_metric_is_defined_twice_in_one_module_name_or_one_metric_name() -> None:
    """A second `X = Counter(...)` would silently take the first one's place for every
    module that reads `metrics.X` (and its series would vanish from that process). One
    name may be defined once per registry (a process's), as `cronlog_dlq_records_total`
    is for ingress and the notifier."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(metrics.__file__).read_text())
    kinds = {"Counter", "Gauge", "Histogram", "Summary"}
    assigned: list[str] = []
    named: list[tuple[str, str]] = []
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in kinds
        ):
            assigned += [t.id for t in node.targets if isinstance(t, ast.Name)]
            first = node.value.args[0]
            assert isinstance(first, ast.Constant)
            registry = [ast.unparse(k.value) for k in node.value.keywords if k.arg == "registry"]
            named.append((str(first.value), registry[0] if registry else "default"))
    assert len(assigned) == len(set(assigned)), sorted(assigned)
    assert len(named) == len(set(named)), sorted(named)


def test_a_port_in_use_ends_the_process_saying_which_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stopped:
            MetricsServer(port, [], lambda: None, host="127.0.0.1")
    assert str(stopped.value) == (
        f"cronlog: cannot serve metrics and health on port {port}: Address already in use"
    )
