"""One live ledger per node id, on the real broker (streams/identity.py).

A fixed `--node-id` (as the systemd units set it) is shared by two processes in two ways:
an operator starts a second node under a live id, or a node frozen past its session
(SIGSTOP here; a stopped VM in production) is replaced by a restart under its id and then
wakes. Before, each recovery re-initialised the shared transactional id and fenced the
other: almost nothing committed again and firings were missed. Now the second process
refuses to start while the first is live, and the woken one stops as soon as it is
given partitions again (or is fenced); the other goes on, every firing runs once, and
the audit is clean.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from pathlib import Path

from schemas.records import RunEvent
from streams.core.timing import TIMING
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.firings import assert_audit_clean
from tests.support.nodes import EventReader, Node, WorkerProc, job, send_commands, stop_all
from tests.support.waiting import eventually

NODE_ID = "twin"


def _children(pid: int) -> list[int]:
    """A process's descendants (the node's ledger child), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_children(int(child))]
    return found


def _freeze(node: Node, sig: int) -> None:
    assert node.proc is not None
    for pid in [node.proc.pid, *_children(node.proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _created_since(reader: EventReader, since_ms: int) -> int:
    reader.poll_for(0.5)
    return sum(
        1
        for event, _ in reader.run_events()
        if event.state == "due" and event.attempt == 1 and event.at_ms > since_ms
    )


def test_one_live_ledger_per_node_id(topics: Settings, tmp_path: Path) -> None:
    twin = topics.with_(topic_prefix=f"{topics.topic_prefix}twin.")
    ensure_topics(twin)
    logs = [tmp_path / name for name in ("a", "b", "c")]
    for folder in logs:
        folder.mkdir()
    first = Node(twin, NODE_ID, logs[0]).start()
    worker = WorkerProc(twin, "twin-w1", tmp_path, cpu=4, memory_mb=1024).start()
    reader = EventReader(twin, "twin-check")
    second = third = None
    try:
        send_commands(twin, [job("tick", ["true"], schedule={"every": "1s"})])
        reader.wait_until(lambda: _created_since(reader, 0) >= 3, 90, "the first runs")

        # -- a second node under the live id refuses to start -----------------------------
        second = Node(twin, NODE_ID, logs[1]).start()
        assert second.proc is not None
        second.proc.wait(TIMING.consumer_session_s + 60)
        assert second.proc.returncode != 0
        log_b = (logs[1] / f"{NODE_ID}.log").read_text(errors="replace")
        assert "is held by a live ledger" in log_b
        after = int(time.time() * 1000)
        reader.wait_until(lambda: _created_since(reader, after) >= 5, 30, "runs go on")

        # -- frozen past its session, replaced, woken: the woken one stops ----------------
        _freeze(first, signal.SIGSTOP)
        time.sleep(TIMING.consumer_session_s + 4)  # its group sessions lapse
        third = Node(twin, NODE_ID, logs[2]).start()
        replaced = int(time.time() * 1000)
        reader.wait_until(lambda: _created_since(reader, replaced) >= 5, 90, "the restart")
        _freeze(first, signal.SIGCONT)
        assert first.proc is not None
        first.proc.wait(90)
        log_a = (logs[0] / f"{NODE_ID}.log").read_text(errors="replace")
        assert "was replaced by a live ledger under its node id" in log_a
        woken = int(time.time() * 1000)
        reader.wait_until(lambda: _created_since(reader, woken) >= 10, 60, "runs go on")
        assert third.alive

        send_commands(twin, [{"type": "job.pause", "job_id": "tick"}])
        reader.wait_until(
            lambda: any(e.kind == "paused" for e in reader.job_events()), 30, "the pause"
        )
        eventually(
            lambda: all(
                runs[-1].state in ("succeeded", "failed", "cancelled", "skipped")
                for runs in _by_run(reader).values()
            ),
            "every run final",
            timeout_s=90,
        )
        created = Counter(
            e.scheduled_ms
            for e, _ in reader.run_events()
            if e.attempt == 1 and e.state in ("due", "skipped")
        )
        assert max(created.values()) == 1, "a firing was created twice"
        assert_audit_clean(twin)
    finally:
        reader.close()
        stop_all(p for p in (third, second, worker, first) if p is not None)


def _by_run(reader: EventReader) -> dict[str, list[RunEvent]]:
    reader.poll_for(0.5)
    found: dict[str, list[RunEvent]] = {}
    for event, _ in reader.run_events():
        found.setdefault(event.run_id, []).append(event)
    return found
