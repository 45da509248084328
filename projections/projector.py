"""The projector (`cronlog projector`): run-events, jobs, heartbeats and run-logs into the
PostgreSQL tables of the contract, exactly once.

Exactly once: the next offset to read of every partition is stored in
`projector_offsets` in the same PostgreSQL transaction as the rows derived from the
records before it. On start (and after any database error) the consumer is positioned at
those stored offsets, never at Kafka's committed ones, so a crash at any point either
loses a whole batch (redone) or none of it, and nothing is applied twice. Rows are also
written idempotently (transitions keyed by the ledger's event ids), so even a replay of
the topics into the same tables changes nothing.

An undecodable record goes to `projector_dead_letters` with its topic, partition and
offset instead of stopping the projector. While PostgreSQL is down the projector waits
and retries, then catches up from its stored offsets.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Consumer, Message, TopicPartition
from psycopg.types.json import Jsonb

from projections.migrate import migrate
from schemas.codec import HEARTBEAT, JOB_STATE, RUN_EVENTS, RUN_LOG, CodecError
from schemas.json import to_plain
from streams.core.records import FINAL_STATES, JobEvent, JobState, RunEvent
from streams.kafka import consumer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.projector")
TOPICS = ("run-events", "jobs", "heartbeats", "run-logs")


def _ts(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


class Batch:
    """Rows of one transaction, grouped by statement for executemany (pipelined)."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...] | dict[str, Any]]] = {}
        self.offsets: dict[tuple[str, int], int] = {}

    def add(self, sql: str, row: tuple[Any, ...] | dict[str, Any]) -> None:
        self.rows.setdefault(sql, []).append(row)


UPSERT_JOB = """
INSERT INTO jobs (job_id, owner, spec, paused, deleted, created_at, updated_at)
VALUES (%s, %s, %s, false, false, %s, %s)
ON CONFLICT (job_id) DO UPDATE SET owner = excluded.owner, spec = excluded.spec,
    deleted = false, updated_at = excluded.updated_at"""
JOB_FLAG = "UPDATE jobs SET {column} = %s, updated_at = %s WHERE job_id = %s"
JOB_STATE_SQL = """
UPDATE jobs SET next_due_at = %s, paused = %s, deleted = %s WHERE job_id = %s"""
TRANSITION = """
INSERT INTO run_transitions (event_id, run_id, attempt, state, at, worker_id, detail)
VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING"""
RUN = """
INSERT INTO runs (run_id, job_id, scheduled_at, trigger, state, attempt, worker_id,
                  created_at, started_at, finished_at, exit_code, error, updated_at)
VALUES (%(run_id)s, %(job_id)s, %(scheduled_at)s, %(trigger)s, %(state)s, %(attempt)s,
        %(worker_id)s, %(at)s, %(started_at)s, %(finished_at)s, %(exit_code)s, %(error)s,
        %(at)s)
ON CONFLICT (run_id) DO UPDATE SET
    state = excluded.state, attempt = excluded.attempt,
    worker_id = COALESCE(excluded.worker_id, runs.worker_id),
    started_at = COALESCE(excluded.started_at, runs.started_at),
    finished_at = excluded.finished_at,
    exit_code = COALESCE(excluded.exit_code, runs.exit_code),
    error = excluded.error, updated_at = excluded.updated_at
WHERE runs.updated_at <= excluded.updated_at"""
WORKER = """
INSERT INTO workers (worker_id, capacity, free, labels, last_heartbeat_at, state)
VALUES (%s, %s, %s, %s, %s, 'alive')
ON CONFLICT (worker_id) DO UPDATE SET capacity = excluded.capacity, free = excluded.free,
    labels = excluded.labels, last_heartbeat_at = excluded.last_heartbeat_at, state = 'alive'
WHERE workers.last_heartbeat_at <= excluded.last_heartbeat_at"""
LOG = """
INSERT INTO run_logs (run_id, attempt, seq, stream, data, at) VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING"""
DEAD = """
INSERT INTO projector_dead_letters (topic, partition, "offset", reason, payload)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"""
OFFSET = """
INSERT INTO projector_offsets (topic, partition, next_offset) VALUES (%s, %s, %s)
ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset"""

# Statements run in this order inside a transaction: jobs before the flags that update
# them, runs after the transitions (a run row is the latest transition's summary).
ORDER = (
    UPSERT_JOB,
    JOB_FLAG.format(column="paused"),
    JOB_FLAG.format(column="deleted"),
    JOB_STATE_SQL,
    TRANSITION,
    RUN,
    WORKER,
    LOG,
    DEAD,
    OFFSET,
)


class Projector:
    def __init__(self, settings: Settings, batch_size: int = 2000, retry_s: float = 2.0):
        self.settings = settings
        self.batch_size = batch_size
        self.retry_s = retry_s
        self.topic_names = {settings.topic(t): t for t in TOPICS}
        self._stop = threading.Event()
        self.projected = 0
        self.consumer = Consumer(consumer_config(settings, settings.group("projector")))
        self.conn: psycopg.Connection[Any] | None = None

    def stop(self) -> None:
        self._stop.set()

    # -- database -------------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        while not self._stop.is_set():
            try:
                migrate(self.settings.database_url)
                return psycopg.connect(self.settings.database_url)
            except psycopg.OperationalError as exc:
                log.warning("PostgreSQL unavailable (%s); retrying in %.0f s", exc, self.retry_s)
                self._stop.wait(self.retry_s)
        raise SystemExit(0)

    def _stored_offsets(self, conn: psycopg.Connection[Any]) -> dict[tuple[str, int], int]:
        rows = conn.execute("SELECT topic, partition, next_offset FROM projector_offsets")
        return {(t, p): o for t, p, o in rows.fetchall()}

    def _rewind(self, conn: psycopg.Connection[Any]) -> None:
        """Position every assigned partition at the offset PostgreSQL says comes next."""
        stored = self._stored_offsets(conn)
        conn.rollback()
        for tp in self.consumer.assignment():
            offset = stored.get((tp.topic, tp.partition), -2)  # -2: OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self.conn is not None
        stored = self._stored_offsets(self.conn)
        self.conn.rollback()
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), -2)
        consumer.assign(partitions)

    # -- loop -------------------------------------------------------------------------------
    def run(self) -> None:
        self.conn = self._connect()
        self.consumer.subscribe(list(self.topic_names), on_assign=self._on_assign)
        try:
            while not self._stop.is_set():
                messages = [
                    m
                    for m in self.consumer.consume(self.batch_size, timeout=0.5)
                    if m.error() is None
                ]
                if messages:
                    self._write(messages)
        finally:
            self.consumer.close()
            if self.conn is not None:
                self.conn.close()

    def _write(self, messages: list[Message]) -> None:
        batch = Batch()
        for msg in messages:
            self._project(msg, batch)
            batch.offsets[(msg.topic() or "", msg.partition() or 0)] = (msg.offset() or 0) + 1
        for (topic, partition), offset in batch.offsets.items():
            batch.add(OFFSET, (topic, partition, offset))
        while not self._stop.is_set():
            try:
                assert self.conn is not None
                with self.conn.transaction(), self.conn.cursor() as cur:
                    for sql in ORDER:
                        if sql in batch.rows:
                            cur.executemany(sql, batch.rows[sql])
                self.projected += len(messages)
                return
            except psycopg.Error as exc:
                log.warning("projection batch failed (%s); reconnecting and rewinding", exc)
                self._reset()
                return  # the rewind re-reads the batch from the stored offsets

    def _reset(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self._stop.wait(self.retry_s)
        self.conn = self._connect()
        self._rewind(self.conn)

    # -- one record ---------------------------------------------------------------------------
    def _project(self, msg: Message, batch: Batch) -> None:
        name = self.topic_names.get(msg.topic() or "", "")
        value = msg.value()
        handler: Callable[[bytes, Batch], None] | None = {
            "run-events": self._run_event,
            "jobs": self._job_state,
            "heartbeats": self._heartbeat,
            "run-logs": self._log,
        }.get(name)
        if value is None or handler is None:
            return  # tombstones (compaction) carry nothing to project
        try:
            handler(value, batch)
        except (CodecError, KeyError, ValueError, TypeError) as exc:
            batch.add(DEAD, (msg.topic(), msg.partition(), msg.offset(), str(exc)[:2000], value))

    def _run_event(self, value: bytes, batch: Batch) -> None:
        event = RUN_EVENTS.decode(value)
        if isinstance(event, JobEvent):
            at = _ts(event.at_ms)
            if event.kind == "upserted" and event.spec is not None:
                spec = Jsonb(to_plain(event.spec))
                batch.add(UPSERT_JOB, (event.job_id, event.spec.owner, spec, at, at))
            elif event.kind in ("paused", "resumed"):
                batch.add(
                    JOB_FLAG.format(column="paused"), (event.kind == "paused", at, event.job_id)
                )
            elif event.kind == "deleted":
                batch.add(JOB_FLAG.format(column="deleted"), (True, at, event.job_id))
            return
        self._transition(event, batch)

    def _transition(self, e: RunEvent, batch: Batch) -> None:
        at = _ts(e.at_ms)
        detail = Jsonb({"reason": e.reason, "exit_code": e.exit_code, "trigger": e.trigger})
        batch.add(
            TRANSITION, (e.event_id, e.run_id, e.attempt, e.state, at, e.worker_id or None, detail)
        )
        batch.add(
            RUN,
            {
                "run_id": e.run_id,
                "job_id": e.job_id,
                "scheduled_at": _ts(e.scheduled_ms),
                "trigger": e.trigger,
                "state": e.state,
                "attempt": e.attempt,
                "worker_id": e.worker_id or None,
                "at": at,
                "started_at": at if e.state == "running" else None,
                "finished_at": at if e.state in FINAL_STATES else None,
                "exit_code": e.exit_code,
                "error": e.reason or None,
            },
        )

    def _job_state(self, value: bytes, batch: Batch) -> None:
        state: JobState = JOB_STATE.decode(value)
        batch.add(
            JOB_STATE_SQL, (_ts(state.next_due_ms), state.paused, state.deleted, state.spec.job_id)
        )

    def _heartbeat(self, value: bytes, batch: Batch) -> None:
        beat = HEARTBEAT.decode(value)
        batch.add(
            WORKER,
            (
                beat["worker_id"],
                Jsonb(beat["capacity"]),
                Jsonb(beat["free"]),
                Jsonb(beat["labels"]),
                _ts(beat["at_ms"]),
            ),
        )

    def _log(self, value: bytes, batch: Batch) -> None:
        chunk = RUN_LOG.decode(value)
        data = chunk["data"] + ("\n[truncated]" if chunk["truncated"] else "")
        batch.add(
            LOG,
            (
                chunk["run_id"],
                chunk["attempt"],
                chunk["seq"],
                chunk["stream"],
                data,
                _ts(chunk["at_ms"]),
            ),
        )
