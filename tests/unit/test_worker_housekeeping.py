"""The worker's housekeeping on real files: a finished attempt's run directory goes once
its report was acknowledged and the retention passed; an attempt not yet reported keeps
its directory and its executor's log whatever their age; start-up also removes what an
earlier incarnation left and compacts the journal."""

from __future__ import annotations

import os
import time
from pathlib import Path

from connectors.worker.housekeeping import Housekeeping
from connectors.worker.journal import Journal

KEEP_S = 600.0
OLD = time.time() - 10 * KEEP_S


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run_dir(root: Path, run: str, *, old: bool) -> Path:
    path = root / "runs" / run / "1"
    path.mkdir(parents=True)
    (path / "stdout").write_text("out")
    if old:
        for p in (path / "stdout", path):
            os.utime(p, (OLD, OLD))
    return path


def old_file(path: Path, *, old: bool = True) -> Path:
    path.write_text("x")
    if old:
        os.utime(path, (OLD, OLD))
    return path


def test_what_goes_and_what_stays(tmp_path: Path) -> None:
    clock = Clock(OLD)
    journal = Journal(tmp_path / "journal.jsonl", clock)
    pending = run_dir(tmp_path, "pending", old=True)  # started long ago, not reported
    done_long_ago = run_dir(tmp_path, "done-long-ago", old=True)
    done_now = run_dir(tmp_path, "done-now", old=True)  # old files, report acked just now
    orphan_old = run_dir(tmp_path, "orphan-old", old=True)  # no journal line (anymore)
    orphan_young = run_dir(tmp_path, "orphan-young", old=False)
    in_memory = run_dir(tmp_path, "in-memory", old=True)  # an attempt the worker holds
    reading = old_file(tmp_path / "executor.1.log")  # the pending attempt's executor
    unused = old_file(tmp_path / "executor.2.log")
    current = old_file(tmp_path / "executor.3.log")
    recent = old_file(tmp_path / "executor.0.log", old=False)

    for run, path in (
        ("pending", pending),
        ("done-long-ago", done_long_ago),
        ("done-now", done_now),
    ):
        journal.record(run, 1, "job", "claiming", dispatch={})
        journal.record(run, 1, "job", "started", run_dir=str(path), executor_log=str(reading))
    journal.record("done-long-ago", 1, "job", "reported")
    for n in range(2000):  # a busy past, long acknowledged
        journal.record(f"old-{n}", 1, "job", "claiming", dispatch={})
        journal.record(f"old-{n}", 1, "job", "reported")
    clock.now = time.time()
    journal.record("done-now", 1, "job", "reported")

    housekeeping = Housekeeping(
        tmp_path,
        journal,
        KEEP_S,
        in_use=lambda: [in_memory],
        current_log=lambda: str(current),
    )
    housekeeping.run(at_start=True)

    assert pending.is_dir()
    assert journal.phase("pending", 1) == "started"
    assert not done_long_ago.exists()
    assert not done_long_ago.parent.exists()
    assert journal.phase("done-long-ago", 1) is None
    assert done_now.is_dir()
    assert journal.phase("done-now", 1) == "reported"
    assert not orphan_old.exists()
    assert orphan_young.is_dir()
    assert in_memory.is_dir()
    assert reading.exists()
    assert current.exists()
    assert recent.exists()
    assert not unused.exists()
    # Compacted at start: one line per attempt remembered.
    lines = (tmp_path / "journal.jsonl").read_bytes().splitlines()
    assert len(lines) == len(journal.entries) == 2
    journal.close()
    restarted = Journal(tmp_path / "journal.jsonl")
    assert restarted.unfinished()[0].info["run_dir"] == str(pending)


def test_the_periodic_pass_forgets_what_expired_since(tmp_path: Path) -> None:
    clock = Clock(time.time())
    journal = Journal(tmp_path / "journal.jsonl", clock)
    finished = run_dir(tmp_path, "finished", old=False)
    journal.record("finished", 1, "job", "started", run_dir=str(finished))
    journal.record("finished", 1, "job", "reported")
    housekeeping = Housekeeping(
        tmp_path, journal, KEEP_S, in_use=list, current_log=str, clock=clock
    )
    housekeeping.run()
    assert finished.is_dir()  # not yet past the retention
    clock.now += KEEP_S + 1
    housekeeping.run()
    assert not finished.exists()
    assert journal.entries == {}
