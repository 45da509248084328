"""The worker's journal, bounded: finished attempts pruned after the retention, the file
compacted crash-safely; an attempt whose report was not acknowledged is never lost.
Properties over random histories, on a real file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.worker.journal import FINISHED, UNFINISHED, Journal

PHASES = (*UNFINISHED, *FINISHED)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def state(j: Journal) -> dict[tuple[str, int], tuple[str, dict[str, Any], float]]:
    return {k: (e.phase, e.info, e.at) for k, e in j.entries.items()}


def info_for(phase: str, n: int) -> dict[str, Any]:
    if phase == "claiming":
        return {"dispatch": {"n": n}}
    if phase == "started":
        return {"run_dir": f"/runs/r{n}", "executor_log": f"/x/{n}.log", "executor_pid": n}
    return {}


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("record"),
            st.integers(0, 7),  # which attempt
            st.sampled_from(PHASES),
            st.floats(0, 50),  # seconds later
        ),
        st.tuples(st.just("prune"), st.floats(0, 200)),
        st.tuples(st.just("compact")),
        st.tuples(st.just("reopen")),
    ),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(ops)
def test_pruning_and_compaction_keep_what_is_needed(history: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl"
        clock = Clock()
        j = Journal(path, clock)
        # Forgotten since the last compaction: the file still has their lines, so a
        # restart remembers them again (and forgets them again at its housekeeping).
        forgotten: dict[tuple[str, int], tuple[str, dict[str, Any], float]] = {}
        refreshed: set[tuple[str, int]] = set()  # recorded again after being forgotten
        for op in history:
            if op[0] == "record":
                _, n, phase, later = op
                clock.now += later
                j.record(f"run-{n}", 1, "job", phase, **info_for(phase, n))
                if (f"run-{n}", 1) in forgotten:
                    refreshed.add((f"run-{n}", 1))
            elif op[0] == "prune":
                keep = op[1]
                before = state(j)
                gone = j.prune(clock.now - keep)
                after = state(j)
                for key, (phase, _info, at) in before.items():
                    expired = phase in FINISHED and at < clock.now - keep
                    # Exactly the finished attempts older than the retention go.
                    assert (key not in after) == expired, (key, phase)
                    if key in after:
                        assert after[key] == before[key]
                assert {(e.run_id, e.attempt) for e in gone} == set(before) - set(after)
                forgotten.update({k: v for k, v in before.items() if k not in after})
            elif op[0] == "compact":
                before = state(j)
                j.compact()
                forgotten.clear()
                refreshed.clear()
                assert state(j) == before
                assert j.lines == len(before)
                assert len(path.read_bytes().splitlines()) == len(before)
            else:
                before = state(j)
                j.close()
                j = Journal(path, clock)
                reloaded = state(j)
                for key, (phase, info, at) in before.items():
                    # What the file says is what was remembered (an attempt recorded
                    # again after it was forgotten may carry an old run_dir besides).
                    got = reloaded[key]
                    assert (got[0], got[2]) == (phase, at)
                    assert got[1] == info or key in refreshed
                for key in set(reloaded) - set(before):
                    assert reloaded[key] == forgotten[key]
                forgotten.clear()
                refreshed.clear()
        j.close()
        # An unfinished attempt survives everything, with what a restart needs of it.
        last = Journal(path, clock)
        for key, (phase, info, _at) in state(last).items():
            if phase == "started":
                assert info["run_dir"] == f"/runs/r{key[0].removeprefix('run-')}"
        last.close()


def test_lines_grow_until_compaction_then_shrink(tmp_path: Path) -> None:
    clock = Clock()
    j = Journal(tmp_path / "journal.jsonl", clock)
    for n in range(3000):
        j.record(f"run-{n}", 1, "job", "claiming", dispatch={"n": n})
        j.record(f"run-{n}", 1, "job", "started", run_dir=f"/r/{n}")
        j.record(f"run-{n}", 1, "job", "reported")
        clock.now += 1
    j.record("run-late", 1, "job", "started", run_dir="/r/late")  # not acknowledged
    gone = j.prune(clock.now - 100)  # keep the last 100 s
    assert len(gone) == 2900
    assert {e.info["run_dir"] for e in gone} == {f"/r/{n}" for n in range(2900)}
    assert j.needs_compaction()
    j.compact()
    j.close()
    reopened = Journal(tmp_path / "journal.jsonl", clock)
    assert len(reopened.entries) == 101
    assert reopened.phase("run-late", 1) == "started"
    assert reopened.unfinished()[0].info["run_dir"] == "/r/late"
    assert len((tmp_path / "journal.jsonl").read_bytes().splitlines()) == 101


def test_a_crash_before_the_rename_leaves_the_old_journal_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    path = tmp_path / "journal.jsonl"
    j = Journal(path, clock)
    j.record("a", 1, "job", "started", run_dir="/r/a")
    j.record("b", 1, "job", "started", run_dir="/r/b")
    j.record("b", 1, "job", "reported")
    j.sync()
    before = path.read_bytes()

    def crash(*_args: object) -> None:
        raise SystemExit("power cut")  # the process dies between fsync and rename

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(SystemExit):
        j.compact()
    monkeypatch.undo()
    assert path.read_bytes() == before
    restarted = Journal(path, clock)
    assert restarted.phase("a", 1) == "started"
    assert restarted.phase("b", 1) == "reported"
    # The next compaction overwrites the leftover temporary file.
    restarted.compact()
    assert not path.with_name("journal.jsonl.compact").exists()
    assert sorted(os.listdir(tmp_path)) == ["journal.jsonl"]


def test_a_torn_last_line_and_lines_without_times_are_read(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(
        b'{"run_id":"a","attempt":1,"job_id":"j","phase":"started","info":{"run_dir":"/r"}}\n'
        b'{"run_id":"b","attempt":1,"job_id":"j","phase":"reported","info":{}}\n'
        b'{"run_id":"a","attempt":1,"job_id":"j","pha'
    )
    clock = Clock()
    j = Journal(path, clock)
    assert j.phase("a", 1) == "started"
    assert j.entries[("b", 1)].at == clock.now  # no time: counted from this start
    assert j.prune(clock.now) == []  # not older than the retention yet
    assert [e.run_id for e in j.prune(clock.now + 1)] == ["b"]
