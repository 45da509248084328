"""A real worker prunes its run directories and compacts its journal: runs whose reports
Kafka acknowledged, older than CRONLOG_WORKER_KEEP_S, are gone after a restart; the runs
themselves are all reported (nothing lost on the way)."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import orjson

from connectors.worker.journal import FINISHED
from schemas.records import FINAL_STATES
from streams.settings import Settings
from tests.support.nodes import EventReader, Node, WorkerProc, job, runs_by_id, send_commands
from tests.support.waiting import eventually, until_passes


def succeeded(events: EventReader) -> set[str]:
    events.poll_for(0.5)
    return {
        run_id
        for run_id, seen in runs_by_id(events).items()
        if any(e.state == "succeeded" for e in seen)
    }


def all_reported(events: EventReader, journal: Path) -> None:
    """Every run seen is final, and no attempt in the worker's journal is unfinished
    (claimed or started, not yet acknowledged as reported, released or dropped)."""
    events.poll_for(0.2)
    live = {
        r: seen[-1].state
        for r, seen in runs_by_id(events).items()
        if seen[-1].state not in FINAL_STATES
    }
    assert not live, f"runs not final: {live}"
    latest: dict[tuple[str, int], str] = {}
    for line in journal.read_bytes().splitlines():
        entry = orjson.loads(line)
        latest[(entry["run_id"], entry["attempt"])] = entry["phase"]
    unfinished = {key: phase for key, phase in latest.items() if phase not in FINISHED}
    assert not unfinished, f"attempts not acknowledged: {unfinished}"


def test_a_restarted_worker_removes_what_was_acknowledged(topics: Settings, tmp_path: Path) -> None:
    node = Node(topics, "hk-n1", tmp_path).start()
    worker = WorkerProc(topics, "hk-w1", tmp_path, extra_env={"CRONLOG_WORKER_KEEP_S": "1"}).start()
    state = tmp_path / "state" / "workers" / "hk-w1"
    events = EventReader(topics, "hk-check")
    try:
        send_commands(topics, [job("tick", ["sh", "-c", "echo hi"], schedule={"every": "1s"})])
        # `succeeded` reads run-events for half a second itself: no pause between.
        eventually(lambda: len(succeeded(events)) >= 5, "five runs succeeded", 90, interval_s=0)
        send_commands(topics, [{"type": "job.pause", "job_id": "tick"}])
        events.wait_until(
            lambda: any(e.kind == "paused" for e in events.job_events()), 60, "the pause"
        )
        # No run of the job is created after its pause; those before it end, and the worker
        # journals each report once Kafka acknowledged it.
        until_passes(partial(all_reported, events, state / "journal.jsonl"), 60)
        worker.stop()
        done = succeeded(events)
        assert len(done) >= 5
        dirs_before = list((state / "runs").glob("*/*"))
        lines_before = len((state / "journal.jsonl").read_bytes().splitlines())
        assert len(dirs_before) >= len(done)  # one directory per run it executed
        assert lines_before >= 3 * len(done)  # claiming, started, reported
        # Past the retention (1 s) since the newest line: every attempt may go.
        newest = max(
            orjson.loads(line)["at"] for line in (state / "journal.jsonl").read_bytes().splitlines()
        )
        eventually(
            lambda: time.time() > newest + 1,
            "the retention since the newest line",
            10,
            interval_s=0.1,
        )

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
