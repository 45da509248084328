"""Bounded history on the real broker and PostgreSQL: `cronlog db prune`, the projector's
background pruner while it projects, and a rebuild after pruning (projections/retention.py).

Every test writes its own history (jobs under its own name prefix) as run-events and
run-logs records, projects them with a real projector, and checks what the policy keeps
against the rule stated in plain Python (`pruned`) and against hand-written expectations.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Producer

from projections.projector import Projector
from projections.retention import RetentionPolicy, RunRow, pruned
from schemas.codec import RUN_EVENTS, RUN_LOG
from schemas.records import RunEvent, RunLogChunk, RunStateName
from streams.kafka import producer_config
from streams.settings import Settings
from tests.support.nodes import env_for
from tests.support.waiting import until_passes

DAY_MS = 86_400_000
KEEP = 3  # small, so a job of a dozen runs shows the keep-last-N rule
POLICY = RetentionPolicy(keep_runs=KEEP)  # 90 days, log chunks 7 days: the defaults


@dataclass(frozen=True)
class History:
    """What a test produced: run ids by role, and the log chunks."""

    prefix: str
    removed: set[str]  # what the policy must remove, by hand
    kept: set[str]
    old_log_runs: set[str]  # kept runs whose log chunk is older than the log retention
    transitions: int
    logs: int


def _events(
    job: str, scheduled_ms: int, final: RunStateName | None, final_at_ms: int | None = None
) -> list[RunEvent]:
    """A run's transitions: due, dispatched, running, then `final` (none: still running)."""
    run_id = f"{job}@{scheduled_ms}"
    states: list[RunStateName] = ["due", "dispatched", "running", *([final] if final else [])]
    events = []
    for seq, state in enumerate(states, start=1):
        at = scheduled_ms + seq * 1000
        if state == final and final_at_ms is not None:
            at = final_at_ms
        code = 0 if state == "succeeded" else None
        events.append(
            RunEvent(
                f"{run_id}#{seq}",
                job,
                run_id,
                scheduled_ms,
                "schedule",
                1,
                state,
                at,
                "w1",
                "",
                code,
            )
        )
    return events


def produce_history(settings: Settings, prefix: str, now_ms: int) -> History:
    """Runs around the policy's edges (90 days, newest 3 per job, logs 7 days)."""

    def ago(days: int) -> int:
        return now_ms - days * DAY_MS

    runs: list[list[RunEvent]] = []
    removed: set[str] = set()
    kept: set[str] = set()

    def add(events: list[RunEvent], goes: bool) -> None:
        runs.append(events)
        (removed if goes else kept).add(events[0].run_id)

    busy = f"{prefix}busy"  # 10 old runs and 2 recent: the newest 3 stay
    for days in (200, 190, 180, 170, 160, 150, 140, 130, 120):
        add(_events(busy, ago(days), "succeeded"), goes=True)
    for days in (110, 30, 1):
        add(_events(busy, ago(days), "failed" if days == 30 else "succeeded"), goes=False)
    rare = f"{prefix}rare"  # fewer runs than KEEP: all stay, however old
    for days in (300, 250):
        add(_events(rare, ago(days), "succeeded"), goes=False)
    stuck = f"{prefix}stuck"  # an old run that never finished stays
    add(_events(stuck, ago(200), None), goes=False)
    add(_events(stuck, ago(195), "cancelled"), goes=True)
    for days in (190, 180, 170):
        add(_events(stuck, ago(days), "succeeded"), goes=False)
    backfill = f"{prefix}backfill"  # scheduled long ago, finished yesterday: stays
    for days in (400, 390, 380, 370, 360):
        add(_events(backfill, ago(days), "succeeded", ago(1)), goes=False)
    for days in (100, 95, 91):  # ... and its newest 3 runs, old and final: they stay
        add(_events(backfill, ago(days), "skipped"), goes=False)

    producer = Producer(producer_config(settings))
    old_log_runs: set[str] = set()
    logs = 0
    for events in runs:
        for event in events:
            producer.produce(
                settings.topic("run-events"), key=event.job_id, value=RUN_EVENTS.encode(event)
            )
        run_id, running_at = events[0].run_id, events[2].at_ms
        chunk = RunLogChunk(run_id, 1, "stdout", 0, f"output of {run_id}", False, "w1", running_at)
        producer.produce(settings.topic("run-logs"), key=run_id, value=RUN_LOG.encode(chunk))
        logs += 1
        if run_id in kept and running_at < ago(7):
            old_log_runs.add(run_id)
    assert producer.flush(30) == 0
    transitions = sum(len(events) for events in runs)
    return History(prefix, removed, kept, old_log_runs, transitions, logs)


def _count(url: str, sql: str, args: tuple[Any, ...]) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql, args).fetchone()
    return int(row[0]) if row else 0


def wait_projected(url: str, history: History, timeout_s: float = 60) -> None:
    """Until every transition and log chunk of the history is in the tables."""
    like = (history.prefix + "%",)

    def projected() -> None:
        try:
            transitions = _count(
                url, "SELECT count(*) FROM run_transitions WHERE run_id LIKE %s", like
            )
            logs = _count(url, "SELECT count(*) FROM run_logs WHERE run_id LIKE %s", like)
        except psycopg.Error as exc:
            raise AssertionError(f"PostgreSQL: {exc}") from exc
        assert (transitions, logs) == (history.transitions, history.logs), (
            f"projected {transitions}/{history.transitions} transitions, {logs} logs"
        )

    until_passes(projected, timeout_s)


@contextmanager
def projecting(settings: Settings, retention: RetentionPolicy | None = None) -> Iterator[Projector]:
    projector = Projector(settings, retention=retention)
    thread = threading.Thread(target=projector.run, daemon=True)
    thread.start()
    try:
        yield projector
    finally:
        projector.stop()
        thread.join(60)
        assert not thread.is_alive()


def run_ids(url: str, prefix: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT run_id FROM runs WHERE job_id LIKE %s", (prefix + "%",))
        return {row[0] for row in rows.fetchall()}


def run_rows(url: str) -> list[RunRow]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT run_id, job_id, scheduled_at, state, finished_at FROM runs"
        ).fetchall()
    return [RunRow(*row) for row in rows]


def assert_pruned(url: str, history: History) -> None:
    """Exactly the expected runs are gone, with their transitions and logs; the old log
    chunks of kept runs are gone; everything else is there."""
    assert run_ids(url, history.prefix) == history.kept
    with psycopg.connect(url) as conn:
        transitions = conn.execute(
            "SELECT DISTINCT run_id FROM run_transitions WHERE run_id LIKE %s",
            (history.prefix + "%",),
        ).fetchall()
        logs = conn.execute(
            "SELECT run_id FROM run_logs WHERE run_id LIKE %s", (history.prefix + "%",)
        ).fetchall()
    assert {row[0] for row in transitions} == history.kept
    assert {row[0] for row in logs} == history.kept - history.old_log_runs


def prune_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**env_for(settings), "CRONLOG_RETENTION_KEEP_RUNS": str(KEEP)}
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", "db", "prune", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def test_db_prune_removes_old_final_runs_and_keeps_the_rest(topics: Settings) -> None:
    history = produce_history(topics, "cli-", now_ms())
    with projecting(topics):
        wait_projected(topics.database_url, history)
    before = [r for r in run_rows(topics.database_url) if r.job_id.startswith("cli-")]
    # The rule in plain Python agrees with the hand-written expectation.
    assert pruned(before, POLICY, datetime.now(UTC)) == history.removed

    done = prune_cli(topics)
    assert done.returncode == 0, done.stderr
    assert "newest 3 of every job" in done.stdout
    removed = len(history.removed)
    old_logs = len(history.old_log_runs)
    assert (
        f"removed {removed} runs, {removed * 4} transitions, {removed + old_logs} log chunks"
        in (done.stdout)
    ), done.stdout
    assert_pruned(topics.database_url, history)

    again = prune_cli(topics, "--json")
    assert again.returncode == 0, again.stderr
    assert '"runs":0,"transitions":0,"log_chunks":0' in again.stdout


def test_the_projector_prunes_while_it_projects(topics: Settings) -> None:
    """The projector's pruner, in batches of 2 runs every half second, while old history
    and a stream of recent runs are projected: the old runs go (pruned rounds apart as
    they arrive, which ends where one prune of everything would), every recent run and
    transition lands, nothing is dead-lettered."""
    url = topics.database_url
    retention = RetentionPolicy(keep_runs=KEEP, batch=2, interval_s=0.5)
    with projecting(topics, retention) as projector:
        feeder_done: list[int] = []

        def feed() -> None:  # recent runs keep arriving while the pruner works
            producer = Producer(producer_config(topics))
            start = now_ms() - 60_000
            for i in range(40):
                for event in _events("fresh-job", start + i * 1000, "succeeded"):
                    value = RUN_EVENTS.encode(event)
                    producer.produce(topics.topic("run-events"), key=event.job_id, value=value)
                producer.poll(0)
                time.sleep(0.05)
            assert producer.flush(30) == 0
            feeder_done.append(40)

        feeder = threading.Thread(target=feed)
        feeder.start()
        history = produce_history(topics, "live-", now_ms())
        until_passes(lambda: assert_pruned(url, history))
        feeder.join()
        assert feeder_done == [40]
        fresh = "SELECT count(*) FROM run_transitions WHERE run_id LIKE 'fresh-job@%%'"

        def all_fresh() -> None:
            assert _count(url, fresh, ()) == 160

        until_passes(all_fresh)
        assert projector.pruner is not None
        assert projector.pruner.total.runs >= len(history.removed)
    assert len(run_ids(url, "fresh-")) == 40
    assert projector.dead_lettered == 0
    assert_pruned(url, history)


TABLES = {
    "runs": "SELECT * FROM runs ORDER BY run_id",
    "run_transitions": "SELECT * FROM run_transitions ORDER BY event_id",
    "run_logs": "SELECT * FROM run_logs ORDER BY run_id, attempt, stream, seq",
}


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(query).fetchall() for name, query in TABLES.items()}


def test_a_rebuild_after_pruning_gives_the_same_rows(topics: Settings) -> None:
    """The topics still hold everything pruned; `cronlog projector --rebuild` replays it
    and applies the same policy before the swap, so the rebuilt tables equal the pruned
    ones row for row (and the pruned runs do not come back)."""
    url = topics.database_url
    history = produce_history(topics, "rb-", now_ms())
    with projecting(topics):
        wait_projected(url, history)
    done = prune_cli(topics)
    assert done.returncode == 0, done.stderr
    assert_pruned(url, history)
    pruned_rows = snapshot(url)

    env = {**env_for(topics), "CRONLOG_RETENTION_KEEP_RUNS": str(KEEP)}
    rebuilt = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "projector", "--rebuild"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt schema" in rebuilt.stdout
    assert_pruned(url, history)
    after = snapshot(url)
    for table in TABLES:
        assert after[table] == pruned_rows[table], table
