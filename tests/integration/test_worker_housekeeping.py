"""A real worker prunes its run directories and compacts its journal: runs whose reports
Kafka acknowledged, older than CRONLOG_WORKER_KEEP_S, are gone after a restart; the runs
themselves are all reported (nothing lost on the way)."""

from __future__ import annotations

import time
from pathlib import Path

from streams.settings import Settings
from tests.support.nodes import EventReader, Node, WorkerProc, job, runs_by_id, send_commands
from tests.support.waiting import eventually


def succeeded(events: EventReader) -> set[str]:
    events.poll_for(0.5)
    return {
        run_id
        for run_id, seen in runs_by_id(events).items()
        if any(e.state == "succeeded" for e in seen)
    }


def test_a_restarted_worker_removes_what_was_acknowledged(topics: Settings, tmp_path: Path) -> None:
    node = Node(topics, "hk-n1", tmp_path).start()
    worker = WorkerProc(topics, "hk-w1", tmp_path, extra_env={"CRONLOG_WORKER_KEEP_S": "1"}).start()
    state = tmp_path / "state" / "workers" / "hk-w1"
    events = EventReader(topics, "hk-check")
    try:
        send_commands(topics, [job("tick", ["sh", "-c", "echo hi"], schedule={"every": "1s"})])
        deadline = time.monotonic() + 90
        while len(succeeded(events)) < 5 and time.monotonic() < deadline:
            pass
        send_commands(topics, [{"type": "job.pause", "job_id": "tick"}])
        time.sleep(4)  # the runs already dispatched end, their reports acknowledged
        worker.stop()
        done = succeeded(events)
        assert len(done) >= 5
        dirs_before = list((state / "runs").glob("*/*"))
        lines_before = len((state / "journal.jsonl").read_bytes().splitlines())
        assert len(dirs_before) >= len(done)  # one directory per run it executed
        assert lines_before >= 3 * len(done)  # claiming, started, reported
        time.sleep(1.5)  # past the retention

        worker.start()

        def pruned() -> bool:
            # Every attempt finished and was acknowledged long enough ago: nothing stays.
            journal = (state / "journal.jsonl").read_bytes()
            return not list((state / "runs").glob("*/*")) and journal == b""

        eventually(pruned, "the run directories removed and the journal compacted", 60)
        print(f"pruned {len(dirs_before)} run directories, journal {lines_before} -> 0 lines")
    finally:
        events.close()
        worker.stop()
        node.stop()
