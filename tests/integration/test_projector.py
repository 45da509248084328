"""The projector on real Kafka and PostgreSQL: a live cluster's history projected, the
projector killed with SIGKILL mid-stream and restarted; the result must equal a fresh
replay of the same topics into another database, row for row. An undecodable event goes
to the dead-letter table with its topic, partition and offset."""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from psycopg.types.json import Jsonb

from connectors.stack import Stack, StackPaths
from projections.migrate import MIGRATIONS_DIR, load_migrations, migrate
from projections.projector import Projector, _ts
from projections.queries import logs
from schemas.codec import JOB_STATE, RUN_EVENTS, RUN_LOG
from schemas.records import JobState, RunEvent, RunLogChunk, RunStateName
from streams.core.ids import scheduled_run_id
from streams.kafka import producer_config
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
from tests.support.specs import upsert
from tests.support.waiting import eventually, until_passes

TABLES = {
    "jobs": "SELECT job_id, owner, spec, paused, deleted FROM jobs ORDER BY 1",
    "runs": "SELECT run_id, job_id, scheduled_at, trigger, state, attempt, worker_id,"
    " started_at, finished_at, exit_code, error FROM runs ORDER BY 1",
    "run_transitions": "SELECT * FROM run_transitions ORDER BY 1",
    "run_logs": "SELECT * FROM run_logs ORDER BY 1, 2, 3, 4",
    "workers": "SELECT worker_id, capacity, labels FROM workers ORDER BY 1",
}


def _succeeded(reader: EventReader, job_ids: set[str]) -> int:
    return sum(1 for e, _ in reader.run_events() if e.state == "succeeded" and e.job_id in job_ids)


def _more_succeed(reader: EventReader, job_ids: set[str], count: int, what: str) -> None:
    """Until `count` more runs of `job_ids` succeeded (what a fixed sleep only hoped)."""
    reader.poll_for(0.2)
    start = _succeeded(reader, job_ids)
    reader.wait_until(lambda: _succeeded(reader, job_ids) >= start + count, 90, what)


def transitions_in_topic(settings: Settings, group: str) -> int:
    events = EventReader(settings, group)
    try:
        events.read_to_end()  # the node is stopped: what the topic holds is all there is
        return len(events.run_events())
    finally:
        events.close()


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}


def wait_caught_up(url: str, transitions: int, timeout_s: float = 90) -> None:
    def caught_up() -> None:
        try:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
                count = row[0] if row else 0
        except psycopg.Error as exc:
            raise AssertionError(f"PostgreSQL: {exc}") from exc
        assert count == transitions, f"projection has {count} transitions, the topic {transitions}"

    until_passes(caught_up, timeout_s)


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
            topics, [job("hello", ["sh", "-c", "echo out; echo err >&2"], schedule={"every": "1s"})]
        )
        flow = EventReader(topics, "proj-flow")
        try:
            _more_succeed(flow, {"hello"}, 4, "runs before the kill")
            projector.kill()  # mid-stream: events keep flowing while it is dead
            _more_succeed(flow, {"hello"}, 3, "runs while the projector is dead")
            projector.start()
            _more_succeed(flow, {"hello"}, 2, "runs after the restart")
            # A new spec after many states of the old one (which the projector keeps
            # to read the next states without their spec): the row shows the new one.
            changed = job("hello", ["sh", "-c", "echo changed; echo err >&2"])
            send_commands(topics, [{**changed, "schedule": {"every": "1s"}}])
            _more_succeed(flow, {"hello"}, 2, "runs of the changed job")
            send_commands(topics, [{"type": "job.pause", "job_id": "hello"}])
            flow.wait_until(
                lambda: any(e.kind == "paused" for e in flow.job_events()), 30, "the pause"
            )
        finally:
            flow.close()
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
    (hello,) = [row for row in live["jobs"] if row[0] == "hello"]
    assert hello[2]["command"] == ["sh", "-c", "echo changed; echo err >&2"]
    assert hello[3] is True  # paused: the state after the spec's last change
    assert any(row[4] == "succeeded" for row in live["runs"])
    assert {row[3] for row in live["run_logs"]} == {"stdout", "stderr"}
    with psycopg.connect(topics.database_url) as conn:
        late = conn.execute("SELECT count(*) FROM run_lateness").fetchone()
        dead = conn.execute("SELECT reason FROM projector_dead_letters").fetchall()
    assert late is not None
    assert late[0] > 0
    assert dead == []  # every record of a clean history was projected


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

        def dead_letters() -> list[tuple[Any, ...]]:
            with psycopg.connect(topics.database_url) as conn:
                return conn.execute(
                    'SELECT topic, partition, "offset", reason FROM projector_dead_letters'
                ).fetchall()

        rows = eventually(dead_letters, "the poison record in the dead letters")
    finally:
        projector.stop()
    assert [(r[0], r[1], r[2]) for r in rows] == [(topics.topic("run-events"), *delivered[0])]
    assert rows[0][3]


def test_catches_up_after_postgres_is_down_for_12_s(
    topics: Settings, services: Services, tmp_path: Path
) -> None:
    if services.source != "native":
        pytest.skip("stops the native stack's PostgreSQL")
    postgres = Stack(StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))).postgres
    node = Node(topics, "pgdown-n1", tmp_path).start()
    worker = WorkerProc(topics, "pgdown-w1", tmp_path, cpu=2, memory_mb=512).start()
    projector = ProjectorProc(topics, tmp_path / "pgdown.log").start()
    try:
        # Two jobs every second: over 100 transitions in the 22 s, 12 of them while
        # PostgreSQL is down.
        send_commands(
            topics,
            [job(name, ["true"], schedule={"every": "1s"}) for name in ("tick", "tock")],
        )
        both = {"tick", "tock"}
        flow = EventReader(topics, "pgdown-flow")
        try:
            _more_succeed(flow, both, 8, "runs before PostgreSQL stops")
            assert postgres.down()
            try:
                # Runs keep flowing into Kafka meanwhile (about 10 s of them).
                _more_succeed(flow, both, 20, "runs while PostgreSQL is down")
            finally:
                postgres.up(log=lambda _: None)
            _more_succeed(flow, both, 6, "runs after PostgreSQL is back")
            send_commands(topics, [{"type": "job.pause", "job_id": n} for n in sorted(both)])
            flow.wait_until(
                lambda: sum(e.kind == "paused" for e in flow.job_events()) >= 2, 30, "the pauses"
            )
        finally:
            flow.close()
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
    # The module's topics may hold earlier tests' history: count on top of it (the
    # tables exist first, so that the test also passes when run alone).
    migrate(topics.database_url)
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


def test_a_rebuild_never_drops_a_users_view_it_names_it_instead(
    topics: Settings, tmp_path: Path
) -> None:
    """Issue 55: `--rebuild` dropped a view a user had built on the projection's tables
    (it followed the old tables out). Now it refuses, naming the view, and changes
    nothing; without the view it rebuilds."""
    migrate(topics.database_url)
    produce_runs(topics, range(900, 905))
    with psycopg.connect(topics.database_url, autocommit=True) as conn:
        conn.execute("CREATE VIEW my_failures AS SELECT run_id FROM runs WHERE state = 'failed'")

    def rebuilt() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "connectors.cli", "projector", "--rebuild"],
            env=env_for(topics),
            capture_output=True,
            text=True,
            timeout=300,
        )

    refused = rebuilt()
    assert refused.returncode != 0
    assert "my_failures" in refused.stderr + refused.stdout
    with psycopg.connect(topics.database_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM my_failures").fetchone() is not None
        conn.execute("DROP VIEW my_failures")
    done = rebuilt()
    assert done.returncode == 0, done.stderr


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
    chunk = RunLogChunk("job-7@1", 1, "stdout", 0, "before\x00after", False, "w1", SYNTHETIC_T0)
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

        def log_and_letters() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]] | None:
            with psycopg.connect(topics.database_url) as conn:
                logs = conn.execute("SELECT data FROM run_logs WHERE run_id = 'job-7@1'").fetchall()
                dead = conn.execute(
                    'SELECT topic, "offset", reason FROM projector_dead_letters'
                    " WHERE reason LIKE 'refused%'"
                ).fetchall()
            return (logs, dead) if logs else None

        logs, dead = eventually(log_and_letters, "the repaired log chunk", timeout_s=30)
    finally:
        projector.stop()
    assert logs == [("before\ufffdafter",)]
    assert [(row[0], row[1]) for row in dead] == [(topics.topic("run-events"), delivered[0])]
    assert "refused by PostgreSQL" in dead[0][2]


# -- a run's row follows its event sequence, not the clocks of the machines (issue 12) ----
T_SKEW = SYNTHETIC_T0 + 10_000_000


def skewed_run(job_id: str, scheduled: int) -> list[RunEvent]:
    """A run cancelled a second after it started, the worker's clock two seconds ahead:
    in event-time order the cancel comes before the start."""
    run_id = scheduled_run_id(job_id, scheduled)
    steps: list[tuple[RunStateName, int, str, str]] = [
        ("due", scheduled, "", ""),
        ("dispatched", scheduled + 5, "w1", ""),
        ("running", scheduled + 3_000, "w1", ""),  # stamped by the worker, 2 s ahead
        ("cancelled", scheduled + 1_000, "w1", "cancelled by request"),  # ingress's clock
    ]
    return [
        RunEvent(
            f"{run_id}#{seq}", job_id, run_id, scheduled, "schedule", 1, state, at, worker, reason
        )
        for seq, (state, at, worker, reason) in enumerate(steps, start=1)
    ]


class FakeMessage:
    """What the projector reads of a Kafka message."""

    def __init__(self, topic: str, offset: int, value: bytes):
        self._topic, self._offset, self._value = topic, offset, value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return b"skew"  # run-events are keyed by job id

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (0, -1)  # TIMESTAMP_NOT_AVAILABLE


RUN_ROW = (
    "SELECT state, seq, attempt, worker_id, started_at, finished_at, exit_code, error,"
    " updated_at FROM runs WHERE run_id = %s"
)


def test_run_rows_end_in_the_state_of_the_highest_seq_in_any_order(
    topics: Settings, second_database: str
) -> None:
    """Every order of a skewed run's four events, written as one batch (the COPY path and
    its fold), one event per batch (the upsert's guard) and record by record (the path
    of a refused batch): the row is always the cancel's, and the three paths agree."""
    projector = Projector(topics.with_(database_url=second_database))
    conn = projector.conn = projector.connect()
    topic = topics.topic("run-events")
    offset = 0

    def messages(events: Iterable[RunEvent]) -> list[Any]:
        nonlocal offset
        found = []
        for event in events:
            found.append(FakeMessage(topic, offset, RUN_EVENTS.encode(event)))
            offset += 1
        return found

    rows: dict[str, tuple[Any, ...]] = {}
    try:
        for n, order in enumerate(itertools.permutations(range(4))):
            for mode in ("batch", "each", "record"):
                scheduled = T_SKEW + n * 60_000
                events = skewed_run(f"skew-{mode}", scheduled)
                ordered = messages(events[i] for i in order)
                if mode == "batch":
                    projector.write(ordered)
                elif mode == "each":
                    for msg in ordered:
                        projector.write([msg])
                else:
                    projector.write_record_by_record(ordered)
                row = conn.execute(RUN_ROW, (events[0].run_id,)).fetchone()
                conn.rollback()
                assert row is not None
                state, seq, _, worker, _, finished, _, error, updated = row
                assert (state, seq, worker, error) == ("cancelled", 4, "w1", "cancelled by request")
                assert finished == updated == _ts(scheduled + 1_000)
                rows[f"{n}-{mode}"] = row
            assert rows[f"{n}-batch"] == rows[f"{n}-each"] == rows[f"{n}-record"], order
        dead = conn.execute("SELECT count(*) FROM projector_dead_letters").fetchone()
        seqs = conn.execute(
            "SELECT array_agg(seq ORDER BY seq) FROM run_transitions GROUP BY run_id"
        ).fetchall()
    finally:
        conn.close()
        projector.consumer.close()
    assert dead == (0,)
    assert seqs == [([1, 2, 3, 4],)] * 72


def test_a_cancel_stamped_before_the_start_ends_the_run(
    topics: Settings, tmp_path: Path, second_database: str
) -> None:
    """On the real topics: the start and, in a later batch, a cancel stamped before it;
    the run ends `cancelled`, and a fresh replay (what a rebuild does) agrees."""
    events = skewed_run("skew-live", T_SKEW - 3_600_000)
    producer = Producer(producer_config(topics))

    def produce(batch: list[RunEvent]) -> None:
        for event in batch:
            producer.produce(topic, key=event.job_id.encode(), value=RUN_EVENTS.encode(event))
        assert producer.flush(10) == 0

    topic = topics.topic("run-events")
    migrate(topics.database_url)
    with psycopg.connect(topics.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
    before = row[0] if row else 0
    projector = ProjectorProc(topics, tmp_path / "skew.log").start()
    try:
        produce(events[:3])
        wait_caught_up(topics.database_url, before + 3)
        produce(events[3:])
        wait_caught_up(topics.database_url, before + 4)
    finally:
        projector.stop()
    with psycopg.connect(topics.database_url) as conn:
        run = conn.execute(RUN_ROW, (events[0].run_id,)).fetchone()
    assert run is not None
    assert run[:3] == ("cancelled", 4, 1)
    # A fresh replay of the topics (what a rebuild does) ends in the same row.
    replay = ProjectorProc(topics.with_(database_url=second_database), tmp_path / "replay.log")
    replay.start()
    count = "SELECT count(*) FROM run_transitions WHERE run_id = %s"
    try:
        eventually(lambda: _one(second_database, count, events[0].run_id) == (4,), "the replay")
    finally:
        replay.stop()
    assert _one(second_database, RUN_ROW, events[0].run_id) == run


def _one(url: str, query: str, *params: Any) -> tuple[Any, ...] | None:
    try:
        with psycopg.connect(url) as conn:
            return conn.execute(query, params).fetchone()
    except psycopg.errors.UndefinedTable:
        return None  # not migrated yet


def test_an_old_database_is_upgraded_and_its_stuck_runs_repaired(
    services: Services, tmp_path: Path
) -> None:
    """A database of the first schema, with a run the time guard left `running` and a
    consistent one: migration 0002 numbers every transition and repairs the stuck row."""
    name = unique_name("upgrade")
    url, kind = create_database(services.database_url, name)
    try:
        first = tmp_path / "first"
        first.mkdir()
        shutil.copy(MIGRATIONS_DIR / "0001_contract_tables.sql", first)
        assert migrate(url, first) == [1]
        stuck = skewed_run("old-stuck", T_SKEW)
        fine = [
            dataclasses.replace(e, at_ms=T_SKEW + i)
            for i, e in enumerate(skewed_run("old-fine", T_SKEW))
        ]
        with psycopg.connect(url) as conn:
            for event in (*stuck, *fine):
                conn.execute(
                    "INSERT INTO run_transitions (event_id, run_id, attempt, state, at,"
                    " worker_id, detail) VALUES (%s, %s, 1, %s, %s, %s, %s)",
                    (
                        event.event_id,
                        event.run_id,
                        event.state,
                        _ts(event.at_ms),
                        event.worker_id or None,
                        Jsonb({"reason": event.reason, "exit_code": None, "trigger": "schedule"}),
                    ),
                )
            insert = (
                "INSERT INTO runs (run_id, job_id, scheduled_at, trigger, state, attempt,"
                " worker_id, created_at, started_at, finished_at, exit_code, error, updated_at)"
                " VALUES (%s, %s, %s, 'schedule', %s, 1, 'w1', %s, %s, %s, NULL, %s, %s)"
            )
            at = [_ts(e.at_ms) for e in stuck]
            # What the old guard left: the start (3 s) kept, the cancel (1 s) refused.
            stuck_row = ("running", at[0], at[2], None, None, at[2])
            conn.execute(insert, (stuck[0].run_id, "old-stuck", at[0], *stuck_row))
            fat = [_ts(e.at_ms) for e in fine]
            fine_row = ("cancelled", fat[0], fat[2], fat[3], "cancelled by request", fat[3])
            conn.execute(insert, (fine[0].run_id, "old-fine", fat[0], *fine_row))
        # 0002 and every later migration (each test must not assume it is the last).
        assert migrate(url) == [m.version for m in load_migrations() if m.version >= 2]
        with psycopg.connect(url) as conn:
            repaired = conn.execute(RUN_ROW, (stuck[0].run_id,)).fetchone()
            kept = conn.execute(RUN_ROW, (fine[0].run_id,)).fetchone()
            seqs = conn.execute("SELECT event_id, seq FROM run_transitions").fetchall()
    finally:
        drop_database(services.database_url, name, kind)
    assert repaired == ("cancelled", 4, 1, "w1", at[2], at[3], None, "cancelled by request", at[3])
    assert kept == ("cancelled", 4, 1, "w1", fat[2], fat[3], None, "cancelled by request", fat[3])
    assert all(event_id.endswith(f"#{seq}") for event_id, seq in seqs)
    assert len(seqs) == 8


def test_log_chunks_shown_are_the_holders_and_bounded(topics: Settings, tmp_path: Path) -> None:
    """Any worker principal may write to run-logs. A chunk forged by another worker, even
    written before the real one under the same (run, attempt, stream, seq), is not shown
    and does not take the real one's place; an oversized chunk is cut, and a sequence
    number beyond what a worker ever sends is not stored (a log read stays bounded)."""
    producer = Producer({"bootstrap.servers": topics.kafka})
    run = synthetic_run(2400)
    run_id = run[0].run_id  # held by w1 (the synthetic history's worker)

    def chunk(seq: int, data: str, worker: str) -> None:
        record = RunLogChunk(run_id, 1, "stdout", seq, data, False, worker, SYNTHETIC_T0)
        producer.produce(
            topics.topic("run-logs"), key=run_id.encode(), value=RUN_LOG.encode(record)
        )

    chunk(0, "FORGED by evil", "evil")  # first, under the real chunk's key
    chunk(0, "real output\n", "w1")
    chunk(1, "x" * 100_000, "w1")
    chunk(10_000, "far beyond", "w1")
    assert producer.flush(10) == 0
    migrate(topics.database_url)
    with psycopg.connect(topics.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
    before = row[0] if row else 0
    good = produce_runs(topics, range(2400, 2401))
    projector = ProjectorProc(topics, tmp_path / "logs.log").start()
    try:
        wait_caught_up(topics.database_url, before + good)

        def shown_and_stored() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]] | None:
            sql, params = logs(run_id, None, None, 1000)
            with psycopg.connect(topics.database_url) as conn:
                shown = conn.execute(sql, params).fetchall()
                stored = conn.execute(
                    "SELECT seq, worker_id FROM run_logs WHERE run_id = %s ORDER BY 1, 2",
                    (run_id,),
                ).fetchall()
            return (shown, stored) if len(shown) >= 2 else None

        shown, stored = eventually(shown_and_stored, "both chunks shown", timeout_s=30)
    finally:
        projector.stop()
    texts = [r[3] for r in shown]
    assert texts[0] == "real output\n"
    assert len(texts) == 2
    assert texts[1].startswith("x" * 1000)
    assert texts[1].endswith("[chunk cut]")
    assert len(texts[1]) < 17_000
    assert not any("FORGED" in t for t in texts)
    assert stored == [(0, "evil"), (0, "w1"), (1, "w1")]  # kept apart, the far one not at all


# -- a job state that changes none of the row's columns is not written again -------------
class KeyedMessage(FakeMessage):
    def __init__(self, topic: str, offset: int, value: bytes, key: bytes):
        super().__init__(topic, offset, value)
        self._key = key

    def key(self) -> bytes:
        return self._key


def test_a_job_state_that_changes_no_column_is_not_written_again(
    topics: Settings, second_database: str
) -> None:
    """A run's end rewrites the job's state with only its run lists changed: the jobs
    row is left as it is (its xmin, the transaction that last wrote it, stays). A state
    that moves a column is written, also after a batch that was never committed
    (another writer's offsets ahead of it: rolled back and rewound)."""
    projector = Projector(topics.with_(database_url=second_database))
    conn = projector.conn = projector.connect()
    topic = topics.topic("jobs")
    spec = upsert("rows-a").spec
    fired = JobState(spec, False, False, 1_000, 1_000, 60_000, 120_000, ("rows-a@1",), (), (), 3)
    ended = dataclasses.replace(fired, live_runs=(), final_runs=("rows-a@1",), version=4)
    moved = dataclasses.replace(ended, fired_ms=120_000, next_due_ms=180_000, version=5)
    offset = 0

    def write(state: JobState) -> None:
        nonlocal offset
        message: Any = KeyedMessage(topic, offset, JOB_STATE.encode(state), b"rows-a")
        projector.write([message])
        offset += 1

    def row() -> tuple[Any, ...]:
        found = conn.execute(
            "SELECT xmin::text, next_due_at FROM jobs WHERE job_id = 'rows-a'"
        ).fetchone()
        conn.rollback()
        assert found is not None
        return tuple(found)

    try:
        write(fired)
        first = row()
        assert first[1] == _ts(120_000)
        write(ended)
        assert row() == first  # not written again
        # Another writer's offsets ahead of this batch: it is refused, nothing written.
        conn.execute(
            "INSERT INTO projector_offsets VALUES (%s, 0, 1000)"
            " ON CONFLICT (topic, partition) DO UPDATE SET next_offset = 1000",
            (topic,),
        )
        conn.commit()
        write(moved)
        assert row() == first
        conn.execute("UPDATE projector_offsets SET next_offset = 0 WHERE topic = %s", (topic,))
        conn.commit()
        write(moved)  # read again after the rewind: written
        again = row()
        assert again[0] != first[0]
        assert again[1] == _ts(180_000)
        write(dataclasses.replace(moved, final_runs=("rows-a@1", "rows-a@2"), version=6))
        assert row() == again
    finally:
        conn.close()
        projector.consumer.close()
