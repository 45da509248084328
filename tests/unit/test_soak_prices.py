"""The soak's pure arithmetic (bench/soak_prices.py): prices per fault kind, the jobs'
own execution marks, long runs killed, the verdict and the last line."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from bench.soak_prices import (
    Fault,
    Mark,
    RunFacts,
    executed_twice,
    final_line,
    killed_long_runs,
    overlaps,
    parse_marks,
    price_table,
    run_facts,
    tally,
)


def run(run_id: str, scheduled_ms: int, late_ms: int | None = 100, **kw: object) -> RunFacts:
    fields: dict[str, object] = {
        "job_id": "j",
        "attempts": 1,
        "lost": False,
        "final": "succeeded",
        "worker_id": "w1",
        **kw,
    }
    start = None if late_ms is None else scheduled_ms + late_ms
    return RunFacts(run_id, scheduled_ms=scheduled_ms, first_start_ms=start, **fields)  # type: ignore[arg-type]


def test_runs_due_in_a_fault_and_its_tail_are_charged_to_its_kind() -> None:
    faults = [Fault("broker", "kill -9 broker 1", "1", 10_000, 20_000)]
    runs = [
        run("before", 9_999),
        run("in", 15_000, 2_000, attempts=2),
        run("tail", 49_999, 500, lost=True),
        run("after", 50_000, 10),
    ]
    table = price_table(faults, runs)
    broker = table["broker"]
    assert (broker.count, broker.runs_due, broker.lost, broker.retried) == (1, 2, 1, 1)
    assert broker.max_s == 2.0
    assert broker.p50_s == 0.5
    none = table["none"]
    assert (none.count, none.runs_due, none.max_s) == (0, 2, 0.1)


def test_a_run_in_two_windows_of_one_kind_counts_once_and_never_started_has_no_lateness() -> None:
    faults = [Fault("node", "a", "n1", 0, 10), Fault("node", "b", "n2", 5, 20)]
    table = price_table(faults, [run("r", 8, None)], tail_ms=0)
    assert table["node"].count == 2
    assert table["node"].runs_due == 1
    assert table["node"].p99_s is None
    assert table["none"].runs_due == 0


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 100)), max_size=5),
    st.lists(st.tuples(st.integers(0, 1200), st.integers(0, 5000)), max_size=40),
)
def test_every_run_is_either_in_some_fault_window_or_in_the_baseline(
    windows: list[tuple[int, int]], scheduled: list[tuple[int, int]]
) -> None:
    faults = [Fault(f"k{i % 2}", "", "", a, a + d) for i, (a, d) in enumerate(windows)]
    runs = [run(f"r{i}", t, late) for i, (t, late) in enumerate(scheduled)]
    table = price_table(faults, runs, tail_ms=0)
    inside = {
        r.run_id for r in runs if any(f.start_ms <= r.scheduled_ms < f.end_ms for f in faults)
    }
    assert table["none"].runs_due == len(runs) - len(inside)
    for p in table.values():
        if p.runs_due:
            figures = (p.p50_s, p.p99_s, p.max_s)
            assert None not in figures
            assert sorted(figures) == list(figures)  # type: ignore[type-var]


def test_run_facts_read_the_first_start_attempts_and_losses_and_skip_manual_runs() -> None:
    events = [
        ("j@1", "j", "schedule", 1000, "due", 1, 1000, "", ""),
        ("j@1", "j", "schedule", 1000, "running", 1, 1300, "w1", ""),
        ("j@1", "j", "schedule", 1000, "retrying", 1, 9000, "w1", "lost: worker w1"),
        ("j@1", "j", "schedule", 1000, "running", 2, 9500, "w2", ""),
        ("j@1", "j", "schedule", 1000, "succeeded", 2, 9900, "w2", ""),
        ("j@manual:x", "j", "manual", 5000, "due", 1, 5000, "", ""),
    ]
    (facts,) = run_facts(events)
    assert facts == RunFacts("j@1", "j", 1000, 1300, 2, True, "succeeded", "w2")


def test_marks_show_an_attempt_executed_twice_and_forbidden_overlaps() -> None:
    text = "r1 1 s 100\nr1 1 e 200\nr1 1 s 300\nr2 1 s 150\nr2 1 e 400\nr3 1 s 99"
    marks = parse_marks("j", text + "\nr4 1 s")  # a torn last line is skipped
    assert executed_twice(marks) == ["r1#1 started 2 times"]
    # r1's second start moved its span after r2's start: r2 still ran when it began.
    assert overlaps(marks, {"j"}) == ["j: r2#1 and r1#1 overlap"]
    covered = [Mark("k", x, 1, e, t) for x, e, t in (("a", "s", 1), ("a", "e", 100))]
    covered += [Mark("k", x, 1, e, t) for x in ("b", "c") for e, t in (("s", 10), ("e", 20))]
    assert len(overlaps(covered, {"k"})) == 2  # b and c each reported once
    assert overlaps(marks, set()) == []
    apart = [Mark("k", "a", 1, "s", 1), Mark("k", "a", 1, "e", 5), Mark("k", "b", 1, "s", 5)]
    assert overlaps(apart, {"k"}) == []


def test_a_long_run_killed_is_excused_only_by_a_fatal_fault_on_its_own_worker() -> None:
    long_run = run("L", 0, 1000, final="failed", worker_id="w2")
    ends = {"L": 40_000}
    on_w2 = Fault("worker", "kill -9 w2", "w2", 20_000, 25_000)
    on_w1 = Fault("worker", "kill -9 w1", "w1", 20_000, 25_000)
    node = Fault("node", "kill -9 n1", "n1", 20_000, 25_000)
    fatal = frozenset({"worker"})
    assert killed_long_runs([long_run], ends, [on_w2], fatal) == []
    assert killed_long_runs([long_run], ends, [on_w1, node], fatal) == ["L: failed on w2"]
    assert killed_long_runs([run("ok", 0)], {}, [], fatal) == []


def test_the_verdict_and_the_last_line() -> None:
    total, counts, examples = tally({"duplicates": [], "missed": ["a", "b", "c", "d"]})
    assert (total, counts) == (4, {"duplicates": 0, "missed": 4})
    assert examples == {"missed": ["a", "b", "c"]}
    table = price_table([Fault("api", "", "", 0, 10)], [run("r", 5, 1234)])
    line = final_line(100, total, table, "clean")
    assert json.loads(json.dumps(line)) == {
        "firings": 100,
        "violations": 4,
        "faults": {
            "api": {
                "count": 1,
                "runs_due": 1,
                "p50_s": 1.234,
                "p99_s": 1.234,
                "max_s": 1.234,
                "lost": 0,
                "retried": 0,
            },
            "none": {
                "count": 0,
                "runs_due": 0,
                "p50_s": None,
                "p99_s": None,
                "max_s": None,
                "lost": 0,
                "retried": 0,
            },
        },
        "audit": "clean",
    }
