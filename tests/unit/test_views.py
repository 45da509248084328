"""The dashboard's pure view models (connectors/api/views.py)."""

from __future__ import annotations

import bisect

from hypothesis import given
from hypothesis import strategies as st

from connectors.api.views import (
    LATENESS_BOUNDS_S,
    dependency_layout,
    lateness_bins,
    schedule_text,
)

lateness = st.floats(min_value=-5, max_value=1e5, allow_nan=False)
job_ids = st.sampled_from([f"j{i}" for i in range(8)])


@given(st.lists(lateness, max_size=200))
def test_every_lateness_is_counted_once_in_its_bin(values: list[float]) -> None:
    bins = lateness_bins(values)
    assert len(bins) == len(LATENESS_BOUNDS_S) + 1
    assert sum(b.count for b in bins) == len(values)
    for i, b in enumerate(bins):
        inside = [v for v in values if bisect.bisect_left(LATENESS_BOUNDS_S, v) == i]
        assert b.count == len(inside)
    assert max((b.height for b in bins), default=0) == (1.0 if values else 0.0)


def test_bin_edges_are_upper_inclusive() -> None:
    counts = [b.count for b in lateness_bins([0.1, 0.1000001, 60.0, 61.0, -1.0])]
    assert counts[0] == 2
    assert counts[1] == 1
    assert counts[-2] == 1
    assert counts[-1] == 1
    assert [b.label for b in lateness_bins([])][:2] == ["≤0.1s", "≤0.25s"]


@given(st.dictionaries(job_ids, st.lists(job_ids | st.just("elsewhere"), max_size=4), max_size=8))
def test_the_layout_places_every_job_once_and_acyclic_edges_forward(
    graph: dict[str, list[str]],
) -> None:
    layout = dependency_layout(graph)
    placed = {n.job_id: n for n in layout.nodes}
    assert len(placed) == len(layout.nodes)  # once each
    named = set(graph) | {u for ups in graph.values() for u in ups}
    assert set(placed) == named
    assert {n.job_id for n in layout.nodes if n.missing} == named - set(graph)
    assert set(layout.edges) == {(u, j) for j, ups in graph.items() for u in ups}
    cells = {(n.layer, n.row) for n in layout.nodes}
    assert len(cells) == len(layout.nodes)  # no two boxes on one spot
    assert all(0 <= n.layer < layout.layers and 0 <= n.row < layout.rows for n in layout.nodes)
    if not _cyclic(graph):
        for up, down in layout.edges:
            assert placed[up].layer < placed[down].layer


def _cyclic(graph: dict[str, list[str]]) -> bool:
    seen: dict[str, int] = {}

    def visit(job: str) -> bool:
        if seen.get(job) == 1:
            return True
        if seen.get(job) == 2:
            return False
        seen[job] = 1
        found = any(visit(u) for u in graph.get(job, ()))
        seen[job] = 2
        return found

    return any(visit(j) for j in graph)


def test_a_chain_is_drawn_left_to_right() -> None:
    layout = dependency_layout({"c": ["b"], "b": ["a"], "a": []})
    assert [(n.job_id, n.layer) for n in layout.nodes] == [("a", 0), ("b", 1), ("c", 2)]
    assert layout.layers == 3
    assert layout.rows == 1


def test_schedules_in_words() -> None:
    assert schedule_text({"cron": "0 * * * *", "timezone": "Europe/Paris"}) == (
        "cron 0 * * * * (Europe/Paris)"
    )
    assert schedule_text({"every_ms": 90_000}) == "every 90s"
    assert schedule_text({"every_ms": 7_200_000}) == "every 2h"
    assert schedule_text({"every_ms": 1500}) == "every 1500ms"
    assert schedule_text(None) == "after its upstreams"
    assert schedule_text({"at_ms": 4_102_444_800_000}) == "once at 2100-01-01T00:00:00Z"


def test_a_cycle_is_named_and_its_edges_marked() -> None:
    """The API refuses a cycle, but commands written to the topic are not checked against
    the graph: the page names the cycle and marks its edges (none is left out)."""
    layout = dependency_layout(
        {"extract": ["load"], "transform": ["extract"], "load": ["transform"], "report": ["load"]}
    )
    assert layout.cycles == (("extract", "load", "transform", "extract"),)
    assert ("load", "extract") in layout.edges  # the back edge is drawn
    assert layout.on_cycle("load", "extract")
    assert layout.on_cycle("transform", "load")
    assert not layout.on_cycle("load", "report")
    assert dependency_layout({"c": ["b"], "b": ["a"], "a": []}).cycles == ()


def test_a_transitions_detail_reads_as_words() -> None:
    from connectors.api.views import detail_text

    assert detail_text({"reason": "exit 1", "exit_code": 1, "trigger": "schedule"}) == (
        "exit 1 · exit 1"
    )
    assert detail_text({"reason": None, "exit_code": None, "trigger": "manual"}) == ""
    assert detail_text({"reason": "claimed by w1", "exit_code": None}) == "claimed by w1"
    assert detail_text(None) == ""


def test_durations_ahead_runs_and_logs_by_attempt() -> None:
    from datetime import UTC, datetime

    from connectors.api.views import ahead, duration_text, logs_by_attempt

    assert duration_text("2026-12-05T10:00:00+00:00", "2026-12-05T10:00:01.5+00:00") == "1.5 s"
    assert duration_text("2026-12-05T10:00:00+00:00", "2026-12-05T10:02:05+00:00") == "2 min 5 s"
    assert duration_text("2026-12-05T10:00:00+00:00", "2026-12-05T12:30:00+00:00") == "2 h 30 min"
    assert duration_text("2026-12-05T10:00:00+00:00", None) == ""
    now = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    later = {"scheduled_at": "2026-12-05T10:00:05+00:00", "state": "dispatched"}
    assert ahead(later, now)
    assert not ahead({**later, "state": "succeeded"}, now)
    assert not ahead({**later, "scheduled_at": "2026-12-05T09:59:00+00:00"}, now)
    chunks = [
        {"attempt": 2, "data": "b1"},
        {"attempt": 1, "data": "a1"},
        {"attempt": 2, "data": "b2"},
    ]
    assert logs_by_attempt(chunks) == [(1, "a1"), (2, "b1b2")]
