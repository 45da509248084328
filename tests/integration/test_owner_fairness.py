"""Owner fairness on the real broker (issue 53 item 12): a quiet owner's run-now and
firings are decided while a noisy owner's big backfill is in progress, because the
ledger creates a job's backfill runs no faster than they finish (at most
`backfill_live_runs` live at once; the rest waits in the job's state). Asserted on
decisions and their order, never on timings: with no worker the backfill holds exactly
its first `backfill_live_runs` runs, and the quiet owner's requests are decided all the same; once a
worker runs them, the backfill goes on, each time once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from schemas.records import RunEvent
from streams.core.ledger import LedgerConfig
from streams.settings import Settings
from tests.support.nodes import EventReader, Node, WorkerProc, job, send_commands, stop_all

MIN_MS = 60_000
CAP = LedgerConfig().backfill_live_runs  # a job's live backfill runs at most


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _created(events: EventReader, job_id: str, trigger: str) -> list[RunEvent]:
    """The first event of each run of `job_id` made by `trigger`, in log order."""
    seen: dict[str, RunEvent] = {}
    for event, _ in events.run_events():
        if event.job_id == job_id and event.trigger == trigger:
            seen.setdefault(event.run_id, event)
    return list(seen.values())


def test_a_quiet_owner_is_decided_while_a_noisy_backfill_is_in_progress(
    topics: Settings, tmp_path: Path
) -> None:
    node = Node(topics, "fair-n1", tmp_path).start()
    worker = WorkerProc(topics, "fair-w1", tmp_path, cpu=100, memory_mb=10**5)
    worker.argv += ["--executor", "noop"]
    events = EventReader(topics, "fair")
    try:
        send_commands(
            topics,
            [
                job("fair-noisy", ["true"], owner="noisy", schedule={"every": "1m"}),
                job("fair-quiet", ["true"], owner="quiet", schedule={"every": "2s"}),
            ],
        )
        events.wait_registered(["fair-noisy", "fair-quiet"], timeout_s=90)
        now = int(time.time() * 1000)
        backfill: dict[str, object] = {
            "type": "job.backfill",
            "job_id": "fair-noisy",
            "from": _iso(now - 3000 * MIN_MS),
            "to": _iso(now),
            "request_id": "big",
        }
        send_commands(topics, [backfill])
        events.wait_until(
            lambda: len(_created(events, "fair-noisy", "backfill")) >= CAP,
            60,
            "the backfill's first runs",
        )
        # No worker runs them: the backfill stays at its first 100 runs, and the quiet
        # owner's run-now, sent after it, is decided all the same.
        send_commands(topics, [{"type": "job.run_now", "job_id": "fair-quiet", "request_id": "q1"}])
        events.wait_until(
            lambda: any(e.run_id == "fair-quiet@manual:q1" for e, _ in events.run_events()),
            60,
            "the quiet owner's run-now decided",
        )
        backfill_seen = len(_created(events, "fair-noisy", "backfill"))
        firings_before = len(_created(events, "fair-quiet", "schedule"))
        events.wait_until(
            lambda: len(_created(events, "fair-quiet", "schedule")) > firings_before + 2,
            60,
            "the quiet owner's firings decided while the backfill waits",
        )
        events.poll_for(2.0)
        assert backfill_seen == CAP
        assert len(_created(events, "fair-noisy", "backfill")) == CAP  # paced, not dropped
        # A worker runs the backfill's runs: it goes on as they finish, each time once.
        worker.start()
        events.wait_until(
            lambda: len(_created(events, "fair-noisy", "backfill")) >= 20 * CAP,
            180,
            "the backfill going on as its runs finish",
        )
        created = _created(events, "fair-noisy", "backfill")
        times = [e.scheduled_ms for e in created]
        assert len(times) == len(set(times))
        assert times == sorted(times)  # oldest first, slice after slice
        events.wait_until(
            lambda: any(
                e.run_id == "fair-quiet@manual:q1" and e.state == "succeeded"
                for e, _ in events.run_events()
            ),
            60,
            "the quiet owner's run-now run",
        )
    finally:
        events.close()
        stop_all([worker, node])
