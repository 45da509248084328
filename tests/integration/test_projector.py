"""The projector on real Kafka and PostgreSQL: a live cluster's history projected, the
projector killed with SIGKILL mid-stream and restarted; the result must equal a fresh
replay of the same topics into another database, row for row. An undecodable event goes
to the dead-letter table with its topic, partition and offset."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from connectors.stack import Stack, StackPaths
from projections.migrate import migrate
from schemas.codec import RUN_EVENTS, RUN_LOG
from streams.settings import Settings
from tests.support.isolation import create_database, drop_database, unique_name
from tests.support.kafka import SYNTHETIC_T0, produce_runs, synthetic_run
from tests.support.nodes import (
    EventReader,
    Node,
    ProjectorProc,
    WorkerProc,
    env_for,
    job,
    send_commands,
)
from tests.support.services import Services

pytestmark = pytest.mark.integration
TABLES = {
    "jobs": "SELECT job_id, owner, spec, paused, deleted FROM jobs ORDER BY 1",
    "runs": "SELECT run_id, job_id, scheduled_at, trigger, state, attempt, worker_id,"
    " started_at, finished_at, exit_code, error FROM runs ORDER BY 1",
    "run_transitions": "SELECT * FROM run_transitions ORDER BY 1",
    "run_logs": "SELECT * FROM run_logs ORDER BY 1, 2, 3, 4",
    "workers": "SELECT worker_id, capacity, labels FROM workers ORDER BY 1",
}


def transitions_in_topic(settings: Settings, group: str) -> int:
    events = EventReader(settings, group)
    try:
        events.poll_for(3)
        return len(events.run_events())
    finally:
        events.close()


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}


def wait_caught_up(url: str, transitions: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    count = -1
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
                count = row[0] if row else 0
        except psycopg.Error:
            count = -1
        if count == transitions:
            return
        time.sleep(0.5)
    raise AssertionError(f"projection has {count} transitions, the topic {transitions}")


def equals_a_fresh_replay(
    topics: Settings, tmp_path: Path, other_url: str, transitions: int
) -> dict[str, list[tuple[Any, ...]]]:
    """Replay the topics into another database; assert it equals the projection, table
    by table; return the projection's snapshot."""
    replay = ProjectorProc(topics.with_(database_url=other_url), tmp_path / "replay.log").start()
    try:
        wait_caught_up(other_url, transitions)
    finally:
        replay.stop()
    live, fresh = snapshot(topics.database_url), snapshot(other_url)
    for table in TABLES:
        assert live[table] == fresh[table], table
    return live


@pytest.fixture
def second_database(services: Services) -> Iterator[str]:
    name = unique_name("replay")
    url, kind = create_database(services.database_url, name)
    yield url
    drop_database(services.database_url, name, kind)


def test_killed_projector_equals_a_fresh_replay(
    topics: Settings, tmp_path: Path, second_database: str
) -> None:
    node = Node(topics, "proj-n1", tmp_path).start()
    worker = WorkerProc(topics, "proj-w1", tmp_path, cpu=2, memory_mb=512).start()
    projector = ProjectorProc(topics, tmp_path / "projector.log").start()
    try:
        send_commands(
            topics, [job("hello", ["sh", "-c", "echo out; echo err >&2"], schedule={"every": "2s"})]
        )
        time.sleep(10)
        projector.kill()  # mid-stream: events keep flowing while it is dead
        time.sleep(4)
        projector.start()
        time.sleep(6)
        send_commands(topics, [{"type": "job.pause", "job_id": "hello"}])
        time.sleep(5)
    finally:
        worker.stop()
        node.stop()
    try:
        transitions = transitions_in_topic(topics, "projector-check")
        assert transitions > 20
        wait_caught_up(topics.database_url, transitions)
    finally:
        projector.stop()

    live = equals_a_fresh_replay(topics, tmp_path, second_database, transitions)
    assert any(row[4] == "succeeded" for row in live["runs"])
    assert {row[3] for row in live["run_logs"]} == {"stdout", "stderr"}
    with psycopg.connect(topics.database_url) as conn:
        late = conn.execute("SELECT count(*) FROM run_lateness").fetchone()
    assert late is not None
    assert late[0] > 0


def test_an_undecodable_event_goes_to_dead_letters(topics: Settings, tmp_path: Path) -> None:
    migrate(topics.database_url)  # the tables exist before the test queries them
    producer = Producer({"bootstrap.servers": topics.kafka})
    delivered: list[tuple[int | None, int | None]] = []
    producer.produce(
        topics.topic("run-events"),
        key=b"x",
        value=b"\xc3\x01garbage",
        on_delivery=lambda err, msg: delivered.append((msg.partition(), msg.offset())),
    )
    producer.flush(10)
    projector = ProjectorProc(topics, tmp_path / "poison.log").start()
    try:
        deadline = time.monotonic() + 60
        rows: list[tuple[Any, ...]] = []
        while time.monotonic() < deadline and not rows:
            with psycopg.connect(topics.database_url) as conn:
                rows = conn.execute(
                    'SELECT topic, partition, "offset", reason FROM projector_dead_letters'
                ).fetchall()
            time.sleep(0.5)
    finally:
        projector.stop()
    assert [(r[0], r[1], r[2]) for r in rows] == [(topics.topic("run-events"), *delivered[0])]
    assert rows[0][3]


def test_catches_up_after_postgres_is_down_for_30_s(
    topics: Settings, services: Services, tmp_path: Path
) -> None:
    if services.source != "native":
        pytest.skip("stops the native stack's PostgreSQL")
    postgres = Stack(StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))).postgres
    node = Node(topics, "pgdown-n1", tmp_path).start()
    worker = WorkerProc(topics, "pgdown-w1", tmp_path, cpu=2, memory_mb=512).start()
    projector = ProjectorProc(topics, tmp_path / "pgdown.log").start()
    try:
        send_commands(topics, [job("tick", ["true"], schedule={"every": "1s"})])
        time.sleep(8)
        assert postgres.down()
        try:
            time.sleep(30)  # runs keep flowing into Kafka meanwhile
        finally:
            postgres.up(log=lambda _: None)
        time.sleep(4)
        send_commands(topics, [{"type": "job.pause", "job_id": "tick"}])
        time.sleep(4)
    finally:
        worker.stop()
        node.stop()
    try:
        transitions = transitions_in_topic(topics, "pgdown-check")
        assert transitions > 100
        wait_caught_up(topics.database_url, transitions)
        assert projector.alive
    finally:
        projector.stop()
    with psycopg.connect(topics.database_url) as conn:
        runs = conn.execute("SELECT count(*), count(DISTINCT run_id) FROM runs").fetchone()
    assert runs is not None
    assert runs[0] == runs[1]
    assert "unavailable" in (tmp_path / "pgdown.log").read_text()


def test_rebuild_equals_the_live_projection(
    topics: Settings, tmp_path: Path, second_database: str
) -> None:
    """A rebuild while the live projector runs and events keep arriving: the swapped-in
    tables equal a fresh replay, the hand-damaged rows are repaired, nothing is lost."""
    # The module's topics already hold earlier tests' history: count on top of it.
    with psycopg.connect(topics.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
    produced = (row[0] if row else 0) + produce_runs(topics, range(0, 300))
    live = ProjectorProc(topics, tmp_path / "live.log").start()
    try:
        wait_caught_up(topics.database_url, produced)
        with psycopg.connect(topics.database_url) as conn:
            conn.execute("DELETE FROM run_transitions WHERE run_id LIKE 'job-1@%'")
            conn.execute("UPDATE runs SET state = 'failed' WHERE job_id = 'job-2'")
        more: list[int] = []

        def trickle() -> None:  # events keep arriving during the rebuild
            for start in range(300, 500, 20):
                more.append(produce_runs(topics, range(start, start + 20)))
                time.sleep(0.3)

        feeder = threading.Thread(target=trickle)
        feeder.start()
        done = subprocess.run(
            [sys.executable, "-m", "connectors.cli", "projector", "--rebuild"],
            env=env_for(topics),
            capture_output=True,
            text=True,
            timeout=300,
        )
        feeder.join()
        assert done.returncode == 0, done.stderr
        assert "rebuilt schema" in done.stdout
        produced += sum(more)
        wait_caught_up(topics.database_url, produced)
    finally:
        live.stop()
    rebuilt = equals_a_fresh_replay(topics, tmp_path, second_database, produced)
    synthetic = [row for row in rebuilt["runs"] if row[1].startswith("job-")]
    assert len(synthetic) == 500
    assert {row[4] for row in synthetic} == {"succeeded"}
    with psycopg.connect(topics.database_url) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
            ("%\\_rebuild",),
        ).fetchall()
        views = conn.execute(
            "SELECT count(*) FROM run_lateness WHERE job_id LIKE 'job-%'"
        ).fetchone()
    assert schemas == []
    assert views is not None
    assert views[0] == 500


def test_a_record_postgres_refuses_is_isolated(topics: Settings, tmp_path: Path) -> None:
    """A decodable event PostgreSQL refuses (attempt beyond integer) goes to the dead
    letters alone; its batch-mates are projected, and a NUL in a job's output is kept
    readable instead of wedging the projector."""
    producer = Producer({"bootstrap.servers": topics.kafka})
    delivered: list[int | None] = []
    bad = dataclasses.replace(synthetic_run(999)[0], attempt=3_000_000_000)
    producer.produce(
        topics.topic("run-events"),
        key=bad.job_id.encode(),
        value=RUN_EVENTS.encode(bad),
        on_delivery=lambda err, msg: delivered.append(msg.offset()),
    )
    chunk = {
        "run_id": "job-7@1",
        "attempt": 1,
        "stream": "stdout",
        "seq": 0,
        "data": "before\x00after",
        "truncated": False,
        "worker_id": "w1",
        "at_ms": SYNTHETIC_T0,
    }
    producer.produce(topics.topic("run-logs"), key=b"job-7@1", value=RUN_LOG.encode(chunk))
    assert producer.flush(10) == 0
    # The module's topics may hold earlier tests' history: count on top of it.
    migrate(topics.database_url)
    with psycopg.connect(topics.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
    before = row[0] if row else 0
    good = produce_runs(topics, range(1000, 1005))
    projector = ProjectorProc(topics, tmp_path / "refused.log").start()
    try:
        wait_caught_up(topics.database_url, before + good)
        deadline = time.monotonic() + 30
        logs: list[tuple[Any, ...]] = []
        while time.monotonic() < deadline and not logs:
            with psycopg.connect(topics.database_url) as conn:
                logs = conn.execute("SELECT data FROM run_logs WHERE run_id = 'job-7@1'").fetchall()
                dead = conn.execute(
                    'SELECT topic, "offset", reason FROM projector_dead_letters'
                    " WHERE reason LIKE 'refused%'"
                ).fetchall()
            time.sleep(0.3)
    finally:
        projector.stop()
    assert logs == [("before\ufffdafter",)]
    assert [(row[0], row[1]) for row in dead] == [(topics.topic("run-events"), delivered[0])]
    assert "refused by PostgreSQL" in dead[0][2]
