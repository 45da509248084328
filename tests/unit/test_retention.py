"""The retention rule in plain Python (projections/retention.py `pruned`) and its settings.

The property that makes a rebuild after pruning equal the pruned tables: pruning at t1,
then adding runs, then pruning at t2 >= t1 removes exactly what one prune at t2 of
everything removes.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.retention import RetentionError, RetentionPolicy, RunRow, pruned

NOW = datetime(2026, 6, 1, tzinfo=UTC)
STATES = ["succeeded", "failed", "cancelled", "skipped", "running", "due", "waiting"]


@st.composite
def run_sets(draw: st.DrawFn) -> list[RunRow]:
    """Runs of a few jobs, scheduled over 200 days (ties included), some not final."""
    count = draw(st.integers(0, 40))
    rows = []
    for i in range(count):
        job = draw(st.sampled_from(["a", "b", "c"]))
        scheduled = NOW - timedelta(days=draw(st.integers(0, 200)))
        state = draw(st.sampled_from(STATES))
        lag = timedelta(days=draw(st.integers(0, 120)))
        finished = scheduled + lag if state in STATES[:4] else None
        rows.append(RunRow(f"{job}@{i}", job, scheduled, state, finished))
    return rows


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5), run_sets(), run_sets(), st.integers(0, 60), st.integers(0, 60))
def test_pruning_twice_equals_pruning_once(
    keep: int,
    first: list[RunRow],
    later: list[RunRow],
    at1: int,
    gap: int,
) -> None:
    policy = RetentionPolicy(days=90, keep_runs=keep)
    later = [replace(r, run_id=f"later-{r.run_id}") for r in later]
    t1 = NOW - timedelta(days=at1)
    t2 = t1 + timedelta(days=gap)
    gone1 = pruned(first, policy, t1)
    remaining = [r for r in first if r.run_id not in gone1] + later
    gone2 = pruned(remaining, policy, t2)
    assert gone1 | gone2 == pruned(first + later, policy, t2)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5), run_sets())
def test_never_a_run_that_is_not_final_nor_one_of_the_newest_of_its_job(
    keep: int, runs: list[RunRow]
) -> None:
    policy = RetentionPolicy(days=90, keep_runs=keep)
    gone = pruned(runs, policy, NOW)
    cutoff = NOW - timedelta(days=90)
    for run in runs:
        if run.run_id not in gone:
            continue
        assert run.state in {"succeeded", "failed", "cancelled", "skipped"}
        assert run.finished_at is not None
        assert run.finished_at < cutoff
        assert run.scheduled_at < cutoff
        later = [r for r in runs if r.job_id == run.job_id and r.scheduled_at > run.scheduled_at]
        assert len(later) >= keep


def test_an_old_final_run_with_enough_newer_ones_goes() -> None:
    old = NOW - timedelta(days=100)
    runs = [
        RunRow("j@1", "j", old, "succeeded", old),
        RunRow("j@2", "j", NOW, "succeeded", NOW),
    ]
    assert pruned(runs, RetentionPolicy(keep_runs=1), NOW) == {"j@1"}
    assert pruned(runs, RetentionPolicy(keep_runs=2), NOW) == set()
    assert pruned(runs, RetentionPolicy(days=0, keep_runs=0), NOW) == set()


def test_policy_from_the_environment() -> None:
    assert RetentionPolicy.from_env({}) == RetentionPolicy()
    assert RetentionPolicy() == RetentionPolicy(days=90, keep_runs=100, log_days=7)
    policy = RetentionPolicy.from_env(
        {
            "CRONLOG_RETENTION_DAYS": "30",
            "CRONLOG_RETENTION_KEEP_RUNS": "5",
            "CRONLOG_RETENTION_LOG_DAYS": "0",
            "CRONLOG_RETENTION_INTERVAL_S": "60",
        }
    )
    assert (policy.days, policy.keep_runs, policy.log_days, policy.interval_s) == (30, 5, 0, 60)
    off = RetentionPolicy.from_env(
        {"CRONLOG_RETENTION_DAYS": "0", "CRONLOG_RETENTION_LOG_DAYS": "0"}
    )
    assert not off.enabled


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CRONLOG_RETENTION_DAYS", "ninety"),
        ("CRONLOG_RETENTION_DAYS", "-1"),
        ("CRONLOG_RETENTION_DAYS", "nan"),
        ("CRONLOG_RETENTION_KEEP_RUNS", "2.5"),
        ("CRONLOG_RETENTION_LOG_DAYS", "-3"),
    ],
)
def test_malformed_settings_are_refused(name: str, value: str) -> None:
    with pytest.raises(RetentionError, match=name):
        RetentionPolicy.from_env({name: value})
