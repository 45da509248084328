"""The worker's reports held while its executor starts a burst (report_hold.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from connectors.worker.report_hold import REPORT_HOLD_S, ReportHold


def test_behind_only_once_a_handed_run_is_due_and_still_waits() -> None:
    hold: ReportHold[str] = ReportHold()
    waiting = {("a", 1), ("b", 1)}
    assert not hold.behind(1_000, waiting.__contains__)
    hold.handed(("a", 1), 2_000)
    hold.handed(("b", 1), 3_000)
    assert not hold.behind(1_999, waiting.__contains__)
    assert hold.behind(2_000, waiting.__contains__)
    waiting.discard(("a", 1))  # started
    assert not hold.behind(2_500, waiting.__contains__)
    assert hold.behind(3_000, waiting.__contains__)
    waiting.discard(("b", 1))
    assert not hold.behind(10_000, waiting.__contains__)


def test_held_reports_go_in_order_and_expire_after_the_hold() -> None:
    hold: ReportHold[str] = ReportHold()
    assert not hold.expired(100.0)
    hold.hold(("a", 1), "report a", 10.0)
    hold.hold(("b", 2), "report b", 12.0)
    assert len(hold) == 2
    assert hold.keys() == (("a", 1), ("b", 2))
    assert not hold.expired(10.0 + REPORT_HOLD_S - 0.01)
    assert hold.expired(10.0 + REPORT_HOLD_S)  # counted from the oldest
    assert hold.take() == ["report a", "report b"]
    assert not hold
    assert hold.keys() == ()
    assert not hold.expired(1_000.0)
    hold.hold(("c", 1), "report c", 50.0)  # a new hold counts from its own first report
    assert not hold.expired(50.0 + REPORT_HOLD_S - 0.01)


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("abcdef"), st.integers(1, 3)),
        st.tuples(st.integers(0, 100), st.booleans()),
    ),
    st.integers(0, 100),
)
def test_behind_is_whether_any_waiting_run_is_due(
    runs: dict[tuple[str, int], tuple[int, bool]], now_ms: int
) -> None:
    hold: ReportHold[str] = ReportHold()
    for key, (start_ms, _) in runs.items():
        hold.handed(key, start_ms)
    waiting = {key for key, (_, still) in runs.items() if still}
    expected = any(runs[key][0] <= now_ms for key in waiting)
    assert hold.behind(now_ms, waiting.__contains__) == expected
    assert hold.behind(now_ms, waiting.__contains__) == expected  # asking again changes nothing
