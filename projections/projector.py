"""The projector (`cronlog projector`): run-events, jobs, heartbeats and run-logs into the
PostgreSQL tables of the contract, exactly once.

Exactly once: the next offset to read of every partition is stored in
`projector_offsets` in the same PostgreSQL transaction as the rows derived from the
records before it. On start (and after any database error) the consumer is positioned at
those stored offsets, never at Kafka's committed ones, so a crash at any point either
loses a whole batch (redone) or none of it, and nothing is applied twice. Rows are also
written idempotently (transitions keyed by the ledger's event ids), so even a replay of
the topics into the same tables changes nothing.

A run's row is the summary of its transition with the highest sequence number (event ids
are ``{run_id}#{seq}``, seq one more per transition of the run): an event with a lower
or equal sequence than the row's never changes it, whatever its time says. Event times
are stamped by different machines (a worker's clock may run ahead of ingress's), so they
cannot order a run's transitions.

An undecodable record goes to `projector_dead_letters` with its topic, partition and
offset instead of stopping the projector. While PostgreSQL is down the projector waits
and retries, then catches up from its stored offsets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from psycopg.types.json import Jsonb

from projections.backlog import backfill_pending
from projections.deployment import TOPICS
from projections.job_rows import WrittenRows
from projections.migrate import migrate_for
from projections.retention import Pruner, RetentionPolicy
from schemas.codec import HEARTBEAT, JOB_STATE, RUN_EVENTS, RUN_LOG, CodecError, KnownSpecs
from schemas.convert import capacity_to_avro
from schemas.json import to_plain
from schemas.records import FINAL_STATES, JobEvent, RunEvent
from streams import metrics
from streams.core.clock import SYSTEM_CLOCK, Clock
from streams.core.params import values_document
from streams.kafka import KAFKA_CLIENTS, Clients, consumer_config
from streams.metrics import reason_kind
from streams.settings import Settings

log = logging.getLogger("cronlog.projector")
LIVE_STATES = ("waiting", "due", "dispatched", "running", "retrying")  # runs_live_idx
LIVE_RUNS = (
    "SELECT state, count(*) FROM runs "
    "WHERE state IN ('waiting', 'due', 'dispatched', 'running', 'retrying') GROUP BY state"
)


def _ts(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def event_seq(event_id: str, run_id: str) -> int:
    """The sequence number of a run's transition from its event id ``{run_id}#{seq}``:
    0 for a run skipped at once, otherwise 1 for its first event and one more for each
    transition after it. Raises ValueError for any other shape."""
    head, sep, tail = event_id.rpartition("#")
    if not sep or head != run_id or not (tail.isascii() and tail.isdigit()):
        raise ValueError(f"malformed event id {event_id!r} (expected '{run_id}#<seq>')")
    return int(tail)


Row = tuple[Any, ...] | dict[str, Any]
Rows = list[tuple[str, Row]]


class Batch:
    """Rows of one transaction.

    Every record's rows are kept apart (``items``) so a batch that PostgreSQL refuses for
    its data can be replayed record by record and the culprit isolated; the fast path
    groups them by statement, and folds the run rows to one per run (the latest state,
    earlier non-null columns kept, exactly as the upsert would have folded them one by
    one) so they can be staged with COPY and merged in one statement.
    """

    def __init__(self) -> None:
        self.items: list[tuple[Message, Rows]] = []
        self.first: dict[tuple[str, int], int] = {}  # first offset of each partition
        self.offsets: dict[tuple[str, int], int] = {}  # next offset of each partition

    def record(self, msg: Message) -> Rows:
        rows: Rows = []
        self.items.append((msg, rows))
        key = (msg.topic() or "", msg.partition() or 0)
        self.first.setdefault(key, msg.offset() or 0)
        self.offsets[key] = (msg.offset() or 0) + 1
        return rows

    def grouped(self) -> tuple[dict[str, list[Row]], dict[str, dict[str, Any]]]:
        by_sql: dict[str, list[Row]] = {}
        runs: dict[str, dict[str, Any]] = {}
        for _msg, rows in self.items:
            for sql, row in rows:
                if sql is RUN:
                    assert isinstance(row, dict)
                    runs[row["run_id"]] = _fold(runs.get(row["run_id"]), row)
                else:
                    by_sql.setdefault(sql, []).append(row)
        return by_sql, runs


def _fold(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Two upserts of one run as one: what RUN leaves after applying old, then new."""
    if old is None:
        return new
    if new["seq"] <= old["seq"]:  # the upsert's WHERE would skip an earlier transition
        return old
    merged = dict(new)
    merged["created_at"] = old["created_at"]
    for column in ("worker_id", "started_at", "exit_code", "params"):
        if merged[column] is None:
            merged[column] = old[column]
    if old["first_started_at"] is not None:  # the first attempt's start stays
        merged["first_started_at"] = old["first_started_at"]
    return merged


class StalePosition(Exception):
    """PostgreSQL's stored offsets are already past where this batch starts: another
    projector (or a rebuild's swap) wrote them. Rewind to them instead of writing."""


# A job's row is its latest state on `jobs`, whole: one topic, in order per job, so no
# column can go backwards (the job events on run-events are the audit's, not this table's).
JOB_ROW = """
INSERT INTO jobs (job_id, owner, spec, paused, deleted, next_due_at, created_at, updated_at,
    cycle, backfill_pending)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (job_id) DO UPDATE SET owner = excluded.owner, spec = excluded.spec,
    paused = excluded.paused, deleted = excluded.deleted,
    next_due_at = excluded.next_due_at, created_at = excluded.created_at,
    updated_at = excluded.updated_at, cycle = excluded.cycle,
    backfill_pending = excluded.backfill_pending"""
TRANSITION_COLUMNS = "event_id, run_id, attempt, state, at, worker_id, detail, seq"
TRANSITION = f"""
INSERT INTO run_transitions ({TRANSITION_COLUMNS})
VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING"""
RUN_COLUMNS = (
    "run_id, job_id, scheduled_at, trigger, state, attempt, worker_id, created_at,"
    " started_at, finished_at, exit_code, error, updated_at, seq, params, first_started_at"
)
RUN_MERGE = """
ON CONFLICT (run_id) DO UPDATE SET
    state = excluded.state, attempt = excluded.attempt,
    worker_id = COALESCE(excluded.worker_id, runs.worker_id),
    started_at = COALESCE(excluded.started_at, runs.started_at),
    finished_at = excluded.finished_at,
    exit_code = COALESCE(excluded.exit_code, runs.exit_code),
    error = excluded.error, updated_at = excluded.updated_at, seq = excluded.seq,
    params = COALESCE(excluded.params, runs.params),
    first_started_at = COALESCE(runs.first_started_at, excluded.first_started_at)
WHERE runs.seq < excluded.seq"""
RUN = f"""
INSERT INTO runs ({RUN_COLUMNS})
VALUES (%(run_id)s, %(job_id)s, %(scheduled_at)s, %(trigger)s, %(state)s, %(attempt)s,
        %(worker_id)s, %(created_at)s, %(started_at)s, %(finished_at)s, %(exit_code)s,
        %(error)s, %(at)s, %(seq)s, %(params)s, %(first_started_at)s)
{RUN_MERGE}"""
# The dict keys of a run row, in RUN_COLUMNS order (updated_at is the event time).
RUN_KEYS = [c.strip() for c in RUN_COLUMNS.replace("updated_at", "at").split(",")]
WORKER = """
INSERT INTO workers (worker_id, capacity, free, labels, last_heartbeat_at, state)
VALUES (%s, %s, %s, %s, %s, 'alive')
ON CONFLICT (worker_id) DO UPDATE SET capacity = excluded.capacity, free = excluded.free,
    labels = excluded.labels, last_heartbeat_at = excluded.last_heartbeat_at, state = 'alive'
WHERE workers.last_heartbeat_at <= excluded.last_heartbeat_at"""
LOG = """
INSERT INTO run_logs (run_id, attempt, seq, stream, data, at, worker_id)
VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"""
# The spec bytes of the jobs whose spec the projector keeps, the most recently written,
# so that their next state is read without its spec: 8 MB holds ~55,000 specs of 150
# bytes, ~30 MB with their objects (~560 bytes each in all, measured). Beyond it, states
# are read whole, as before the cache.
SPEC_BYTES_KEPT = 8 * 1024 * 1024
# What one attempt's stream may hold: a worker sends 16 KiB chunks up to 1 MiB (65 of
# them at most, connectors/worker/runlogs.py); anything past these bounds is not its.
MAX_CHUNK_CHARS = 16 * 1024
MAX_CHUNKS = 256
DEAD = """
INSERT INTO projector_dead_letters (topic, partition, "offset", reason, payload)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"""
OFFSET = """
INSERT INTO projector_offsets (topic, partition, next_offset) VALUES (%s, %s, %s)
ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset"""
# Taken first in every transaction (and first by a rebuild's swap, so the two never
# deadlock): the fence that keeps two writers from interleaving.
FENCE = "SELECT topic, partition, next_offset FROM projector_offsets FOR UPDATE"

# Bulk paths: COPY into session-local staging tables, then one set-based statement.
STAGING = """
CREATE TEMP TABLE IF NOT EXISTS stage_transitions
    (LIKE run_transitions INCLUDING DEFAULTS) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS stage_runs (LIKE runs) ON COMMIT DELETE ROWS;
"""
TRANSITION_COPY = f"COPY stage_transitions ({TRANSITION_COLUMNS}) FROM STDIN"
TRANSITION_MERGE = (
    f"INSERT INTO run_transitions ({TRANSITION_COLUMNS})"
    f" SELECT {TRANSITION_COLUMNS} FROM stage_transitions ON CONFLICT DO NOTHING"
)
RUN_COPY = f"COPY stage_runs ({RUN_COLUMNS}) FROM STDIN"
RUN_STAGED = f"INSERT INTO runs ({RUN_COLUMNS}) SELECT {RUN_COLUMNS} FROM stage_runs{RUN_MERGE}"

# Statements run in this order inside a transaction: runs after the transitions (a run
# row is the latest transition's summary).
ORDER = (
    JOB_ROW,
    TRANSITION,
    RUN,
    WORKER,
    LOG,
    DEAD,
)
# Errors that say nothing about the data: wait, reconnect and redo the batch.
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError)


def _json(value: Any) -> bytes:
    """jsonb's text, by orjson (several times faster than the json module, which psycopg
    uses by default; the projector writes a document per transition and per job row),
    or by the json module for what orjson does not take (an integer beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()


def _jsonb(value: Any) -> Jsonb:
    return Jsonb(value, dumps=_json)


def _text(value: str) -> str:
    """PostgreSQL text and jsonb cannot hold NUL; a job may well print one."""
    return value.replace("\x00", "\ufffd")


class Projector:
    def __init__(
        self,
        settings: Settings,
        batch_size: int = 2000,
        retry_s: float = 2.0,
        group: str | None = None,
        retention: RetentionPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        clients: Clients = KAFKA_CLIENTS,
    ):
        self.settings = settings
        self.clients = clients
        self.clock = clock
        self.batch_size = batch_size
        self.retry_s = retry_s
        self.topic_names = {settings.topic(t): t for t in TOPICS}
        self._stop = threading.Event()
        self.projected = 0
        self.dead_lettered = 0
        # Positions after the last empty poll, everything before them written: how a
        # rebuild knows it has caught up (offsets of transaction markers included).
        self.idle_positions: dict[tuple[str, int], int] = {}
        # A broker that is down is retried every second (librdkafka backs off up to 10 s
        # by default), for ever: the projector waits for it, then goes on from the offsets
        # stored in PostgreSQL (the rebalance after the broker's return seeks to them).
        self.consumer = self.clients.consumer(
            consumer_config(
                settings,
                group or settings.group("projector"),
                **{"reconnect.backoff.max.ms": 1000, "error_cb": self._kafka_error},
            )
        )
        self.conn: psycopg.Connection[Any] | None = None
        # Bounded history: prunes on its own connection and thread, in short batches that
        # skip rows this projector holds (projections/retention.py).
        self.pruner = (
            Pruner(settings.database_url, retention) if retention and retention.enabled else None
        )
        # Counted in the metrics once their batch is committed (a rewound batch is
        # projected again, and counted then): the states its run events entered.
        self._entered: list[tuple[str, str]] = []
        self._reasons = metrics.BoundedLabels()
        self.assigned = False
        self.caught_up = False  # an empty poll since the assignment (readiness)
        self._lag_at = 0.0
        self._live_at = 0.0
        self._specs = KnownSpecs(SPEC_BYTES_KEPT)
        self._job_rows = WrittenRows()
        self.handlers: dict[str, Callable[[bytes | None, bytes, Rows], None]] = {
            "run-events": self._run_event,
            "jobs": self._job_state,
            "heartbeats": self._heartbeat,
            "run-logs": self._log,
        }

    def stop(self) -> None:
        self._stop.set()

    kafka_error_logged = 0.0

    def _kafka_error(self, error: Any) -> None:
        """The broker down or unreachable (librdkafka's error callback, or an error
        record): say, at most every 10 s, that the projector waits for it."""
        if self.clock.monotonic() - self.kafka_error_logged >= 10:
            self.kafka_error_logged = self.clock.monotonic()
            log.warning("Kafka unreachable (%s); waiting for it, nothing is lost", error)

    # -- database -------------------------------------------------------------------------
    def connect(self) -> psycopg.Connection[Any]:
        """A connection to the projection's database (migrated, its staging table made),
        retried until PostgreSQL answers or the projector stops; `run` and the reconnect
        after a failed batch use it, and tests/integration/test_projector.py to set
        `conn` when it drives the writes itself."""
        while not self._stop.is_set():
            try:
                migrate_for(self.settings)  # and refuse another deployment's database
                conn = psycopg.connect(self.settings.database_url)
                conn.execute(STAGING)
                conn.commit()
                return conn
            except TRANSIENT as exc:
                log.warning("PostgreSQL unavailable (%s); retrying in %.0f s", exc, self.retry_s)
                self._stop.wait(self.retry_s)
        raise SystemExit(0)

    def _stored_offsets(self, conn: psycopg.Connection[Any]) -> dict[tuple[str, int], int]:
        rows = conn.execute("SELECT topic, partition, next_offset FROM projector_offsets")
        return {(t, p): o for t, p, o in rows.fetchall()}

    def _rewind(self, conn: psycopg.Connection[Any]) -> None:
        """Position every assigned partition at the offset PostgreSQL says comes next."""
        self._job_rows.forget()  # what it wrote may have been replaced since
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
        consumer.incremental_assign(partitions)
        self.assigned = True

    def ready(self) -> str | None:
        """None once assigned and caught up once (an empty poll), else why not."""
        if not self.assigned:
            return "projector: no partitions assigned yet"
        return None if self.caught_up else "projector: catching up"

    def _lag(self, newest_ms: dict[str, int]) -> None:
        """The lag gauges: records behind each topic's end (the ends the last fetches
        saw), and the age of the newest record projected; at most every 5 s."""
        for name, stamp in newest_ms.items():
            metrics.PROJECTOR_LAG_SECONDS.labels(name).set(
                max(0.0, self.clock.time() - stamp / 1000)
            )
        now = self.clock.monotonic()
        if now - self._lag_at < 5:
            return
        self._lag_at = now
        behind: dict[str, int] = dict.fromkeys(TOPICS, 0)
        try:
            for tp in self.consumer.position(self.consumer.assignment()):
                high = self.consumer.get_watermark_offsets(tp, cached=True)
                if high is not None and high[1] >= 0 and tp.offset >= 0:
                    name = self.topic_names.get(tp.topic, tp.topic)
                    behind[name] = behind.get(name, 0) + max(0, high[1] - tp.offset)
        except KafkaException:
            return  # the broker away: the gauges keep their last value
        for name, count in behind.items():
            metrics.PROJECTOR_LAG_RECORDS.labels(name).set(count)
        self._live()

    def _live(self) -> None:
        """The runs live now by state, from the projection (an index covers them), at
        most every 10 s, between batches."""
        now = self.clock.monotonic()
        if self.conn is None or now - self._live_at < 10:
            return
        self._live_at = now
        try:
            rows = self.conn.execute(LIVE_RUNS).fetchall()
            self.conn.rollback()
        except psycopg.Error as exc:  # the next batch reconnects if it must
            log.warning("could not count the live runs: %s", exc)
            with contextlib.suppress(psycopg.Error):
                self.conn.rollback()
            return
        counts = dict.fromkeys(LIVE_STATES, 0) | {state: n for state, n in rows}
        for state, count in counts.items():
            metrics.RUNS_LIVE.labels(state).set(count)

    # -- loop -------------------------------------------------------------------------------
    def run(self) -> None:
        self.conn = self.connect()
        if self.pruner is not None:
            self.pruner.start()  # after the migrations: its index exists
        self.consumer.subscribe(list(self.topic_names), on_assign=self._on_assign)
        try:
            while not self._stop.is_set():
                messages = []
                for m in self.consumer.consume(self.batch_size, timeout=0.5):
                    if m.error() is None:
                        messages.append(m)
                    else:
                        self._kafka_error(m.error())
                if messages:
                    self.write(messages)
                else:
                    self.caught_up = self.assigned
                    self._lag({})
                    self.idle_positions = {
                        (tp.topic, tp.partition): tp.offset
                        for tp in self.consumer.position(self.consumer.assignment())
                    }
        finally:
            if self.pruner is not None:
                self.pruner.stop()
            self.consumer.close()
            if self.conn is not None:
                self.conn.close()

    def write(self, messages: list[Message]) -> None:
        """Project `messages` and write them in one transaction with their offsets: in bulk,
        or record by record (refused records dead-lettered) when PostgreSQL refuses the
        batch. The consume loop (`run`) calls it for each batch it reads, and
        tests/integration/test_projector.py to compare the write paths."""
        batch = Batch()
        self._entered.clear()
        for msg in messages:
            self._project(msg, batch.record(msg))
        assert self.conn is not None
        try:
            try:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    self._fence(cur, batch)
                    self._write_bulk(cur, batch)
                self._job_rows.commit()
            except TRANSIENT:
                raise
            except psycopg.Error as exc:
                # The data, not the connection: find the records PostgreSQL refuses.
                log.warning("projection batch refused (%s); isolating the records", exc)
                self._write_isolated(batch)
            self.projected += len(messages)
            self._count(messages)
        except StalePosition:
            log.info("stored offsets moved under this projector; rewinding to them")
            self._rewind(self.conn)
        except psycopg.Error as exc:
            log.warning("projection batch failed (%s); reconnecting and rewinding", exc)
            self._reset()  # the rewind re-reads the batch from the stored offsets

    def _count(self, messages: list[Message]) -> None:
        """The metrics of a committed batch."""
        newest: dict[str, int] = {}
        counts: dict[str, int] = {}
        for msg in messages:
            name = self.topic_names.get(msg.topic() or "", "")
            counts[name] = counts.get(name, 0) + 1
            stamp = msg.timestamp()[1]
            if stamp > newest.get(name, 0):
                newest[name] = stamp
        for name, count in counts.items():
            metrics.PROJECTED.labels(name).inc(count)
        for state, reason in self._entered:
            metrics.RUN_TRANSITIONS.labels(state).inc()
            if state in FINAL_STATES:
                metrics.RUNS_FINISHED.labels(state, self._reasons(reason_kind(reason))).inc()
        self._entered.clear()
        self._lag(newest)

    def _fence(self, cur: psycopg.Cursor[Any], batch: Batch) -> None:
        stored = {(t, p): o for t, p, o in cur.execute(FENCE).fetchall()}
        for key, first in batch.first.items():
            # Ahead of this batch: another writer got there first. (Behind it is normal:
            # transaction markers and compaction leave gaps in the offsets.)
            if stored.get(key, -1) > first:
                raise StalePosition(key)

    def _write_bulk(self, cur: psycopg.Cursor[Any], batch: Batch) -> None:
        by_sql, runs = batch.grouped()
        for sql in ORDER:
            if sql is TRANSITION and sql in by_sql:
                with cur.copy(TRANSITION_COPY) as copy:
                    for row in by_sql[sql]:
                        assert isinstance(row, tuple)
                        copy.write_row(row)
                cur.execute(TRANSITION_MERGE)
            elif sql is RUN and runs:
                with cur.copy(RUN_COPY) as copy:
                    for run in runs.values():
                        copy.write_row([run[k] for k in RUN_KEYS])
                cur.execute(RUN_STAGED)
            elif sql in by_sql:
                cur.executemany(sql, by_sql[sql])
        self._write_offsets(cur, batch)

    def write_record_by_record(self, messages: list[Message]) -> None:
        """Project `messages` and write them record by record (a savepoint each, a refused
        record dead-lettered) in one transaction with their offsets: the path `write`
        takes for a batch PostgreSQL refused, on its own for
        tests/integration/test_projector.py (the three write paths must agree)."""
        batch = Batch()
        for msg in messages:
            self._project(msg, batch.record(msg))
        self._write_isolated(batch)

    def _write_isolated(self, batch: Batch) -> None:
        assert self.conn is not None
        self._job_rows.forget()  # which of its rows get written is known record by record
        with self.conn.transaction(), self.conn.cursor() as cur:
            self._fence(cur, batch)
            self._write_one_by_one(cur, batch)

    def _write_one_by_one(self, cur: psycopg.Cursor[Any], batch: Batch) -> None:
        for msg, rows in batch.items:
            try:
                with cur.connection.transaction():  # a savepoint per record
                    for sql, row in rows:
                        cur.execute(sql, row)
            except TRANSIENT:
                raise
            except psycopg.Error as exc:
                self._dead(cur, msg, f"refused by PostgreSQL: {exc}")
        self._write_offsets(cur, batch)

    def _dead(self, cur: psycopg.Cursor[Any], msg: Message, reason: str) -> None:
        log.error("dead letter %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        cur.execute(DEAD, (msg.topic(), msg.partition(), msg.offset(), reason[:2000], msg.value()))
        self.dead_lettered += 1

    def _write_offsets(self, cur: psycopg.Cursor[Any], batch: Batch) -> None:
        cur.executemany(OFFSET, [(t, p, o) for (t, p), o in batch.offsets.items()])

    def _reset(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self._stop.wait(self.retry_s)
        self.conn = self.connect()
        self._rewind(self.conn)

    # -- one record ---------------------------------------------------------------------------
    def _project(self, msg: Message, rows: Rows) -> None:
        name = self.topic_names.get(msg.topic() or "", "")
        value = msg.value()
        handler = self.handlers.get(name)
        if value is None or handler is None:
            return  # tombstones (compaction) carry nothing to project
        try:
            handler(msg.key(), value, rows)
        except (CodecError, KeyError, ValueError, TypeError) as exc:
            rows.clear()
            dead = (msg.topic(), msg.partition(), msg.offset(), str(exc)[:2000], value)
            rows.append((DEAD, dead))
            self.dead_lettered += 1

    def _run_event(self, _key: bytes | None, value: bytes, rows: Rows) -> None:
        event = RUN_EVENTS.decode(value)
        if isinstance(event, JobEvent):
            return  # the jobs table comes from `jobs` (JOB_ROW)
        self._transition(event, rows)

    def _transition(self, e: RunEvent, rows: Rows) -> None:
        seq = event_seq(e.event_id, e.run_id)
        at = _ts(e.at_ms)
        reason = _text(e.reason)
        detail = _jsonb({"reason": reason, "exit_code": e.exit_code, "trigger": e.trigger})
        worker = e.worker_id or None
        transition = (e.event_id, e.run_id, e.attempt, e.state, at, worker, detail, seq)
        rows.append((TRANSITION, transition))
        self._entered.append((e.state, reason))
        run = {
            "run_id": e.run_id,
            "job_id": e.job_id,
            "scheduled_at": _ts(e.scheduled_ms),
            "trigger": e.trigger,
            "state": e.state,
            "attempt": e.attempt,
            "worker_id": worker,
            "created_at": at,
            "at": at,
            # When it happened (a worker's vouched stamp), which under load precedes
            # the record (`at`) by the time its report took to reach the ledger.
            "started_at": _ts(e.happened_ms) if e.state == "running" else None,
            "finished_at": _ts(e.happened_ms) if e.state in FINAL_STATES else None,
            "exit_code": e.exit_code,
            "error": reason or None,
            "seq": seq,
            # The run's values ride on its first event only; later upserts keep them.
            "params": _jsonb(values_document(e.params)) if e.params else None,
            # Start lateness is the first attempt's (a retry's start is not lateness).
            "first_started_at": _ts(e.happened_ms)
            if e.state == "running" and e.attempt == 1
            else None,
        }
        rows.append((RUN, run))

    def _job_state(self, key: bytes | None, value: bytes, rows: Rows) -> None:
        # A job's states repeat its spec until the next upsert: read it once per version.
        known = self._specs.get(key) if key else None
        state, known = JOB_STATE.decode_knowing(value, known)
        if key:
            self._specs.put(key, known)
        spec = state.spec
        if state.deleted and not spec.owner:
            return  # the ledger's placeholder for a job others depend on: not a job yet
        pending = backfill_pending(state)
        if key and known is not None:
            written = (
                len(known.data),
                hash(known.data),  # the spec's bytes: computed once per bytes object
                state.paused,
                state.deleted,
                state.next_due_ms,
                state.created_ms,
                state.updated_ms,  # moves with every change of the spec
                state.cycle,
                pending,
            )
            if self._job_rows.unchanged(key, written):
                return  # a run's end: only the run lists changed, which the row lacks
        row = (
            spec.job_id,
            spec.owner,
            _jsonb(to_plain(spec)),
            state.paused,
            state.deleted,
            _ts(state.next_due_ms),
            _ts(state.created_ms),
            _ts(state.updated_ms),
            list(state.cycle),
            pending,
        )
        rows.append((JOB_ROW, row))

    def _heartbeat(self, _key: bytes | None, value: bytes, rows: Rows) -> None:
        # The attempts a worker holds are not projected: skipping them, not building them,
        # makes a beat of a burst's 50,000 held attempts four times cheaper to read.
        beat = HEARTBEAT.decode_without(value, "running")
        row = (
            beat.worker_id,
            Jsonb(capacity_to_avro(beat.capacity)),
            Jsonb(capacity_to_avro(beat.free)),
            Jsonb(dict(beat.labels)),
            _ts(beat.at_ms),
        )
        rows.append((WORKER, row))

    def _log(self, _key: bytes | None, value: bytes, rows: Rows) -> None:
        chunk = RUN_LOG.decode(value)
        if not 0 <= chunk.seq < MAX_CHUNKS:
            return  # past what any worker sends: a log read must stay bounded
        data = _text(chunk.data)
        if len(data) > MAX_CHUNK_CHARS:
            data = data[:MAX_CHUNK_CHARS] + "\n[chunk cut]"
        data += "\n[truncated]" if chunk.truncated else ""
        row = (chunk.run_id, chunk.attempt, chunk.seq, chunk.stream, data)
        rows.append((LOG, (*row, _ts(chunk.at_ms), chunk.worker_id)))
