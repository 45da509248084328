"""The ledger process: a fenced, transactional consume-process-produce loop over job-log.

It owns the job-log partitions the consumer group gives it and, for each, the same
partition of the compacted `jobs` and `runs` topics (its state). The pure state machine
is streams/core/ledger/; this module only moves bytes.

Time. The ledger's "now" for an input is the broker's append time of its job-log record
(job-log has message.timestamp.type=LogAppendTime), passed to `decide(now_ms=...)`: one
clock that no producer can skew. A record stamped with CreateTime (a job-log made by an
older cronlog and not migrated) falls back to that stamp, with a warning once.

Commit cycle (why a crash at any point is safe):
 1. `consume` up to `batch_size` job-log records (read_committed).
 2. `begin_transaction`.
 3. For each record in log order: decode (an undecodable one goes to commands.dlq),
    `decide` against the in-memory state, apply the decision in memory, and produce its
    outputs: run-events, dispatch (to the record's partition number). The new job and run
    states (tombstones for forgotten runs) are produced once per transaction, before its
    offsets: each changed job and run as it stands after the transaction's last input.
 4. The transaction's budget: when the records it produced reach `txn_max_records`
    (20,000) or it has run `txn_max_s` (2.5 s, well under transaction.timeout.ms = 7 s,
    leaving room for the last input and the commit's flush), the batch is cut after the
    current input. A late proposal after a long outage emits ~3,000 records; a batch of
    500 of them would otherwise run past the transaction timeout and be redone
    identically for ever.
 5. `send_offsets_to_transaction(offsets, consumer_group_metadata())` with explicit
    offsets: the last record processed in this transaction + 1, per partition (not the
    consumer's position, which is past the whole batch). The consumed offsets join the
    transaction (KIP-447).
 6. `commit_transaction`: outputs, state and offsets become visible together, or not at
    all. If the batch was cut, the consumer is sought back to the first unprocessed
    record of each partition and the loop consumes again: the rest of the batch is
    decided in the next transactions, and rebalance callbacks are served in between.
A crash before 6 aborts everything (the broker times the transaction out, or the node's
successor under the same transactional.id aborts it at once); the next owner restores
state from what was committed and resumes from the committed offsets, so it redoes
exactly the uncommitted inputs. Cutting a batch changes nothing to this: each
transaction carries exactly the offsets of the inputs whose outputs it carries.

Fencing. A zombie - a member that lost its partitions without noticing - cannot commit:
its TxnOffsetCommit carries its group generation (consumer_group_metadata()), which the
rebalance made stale, so `send_offsets_to_transaction` fails and the transaction can only
abort. The new owner fetches the committed offsets *before* it restores state (see
`Takeover.take_over`, streams/ledger_takeover.py): that fetch waits for pending
transactional offsets (require_stable, the read_committed consumer's default), so after
it no transaction can add offsets for the partition; the state then read to the log's
real end contains every batch whose offsets are committed. On any error in 2-6 the
in-memory changes are thrown away with the whole state: abort if possible, recreate the
producer, and take the partitions over again.

A broker outage, and client calls that hang. Every loop step retries while the broker is
down: the producer's `init_transactions`, the offset fetch and the restore of a takeover
(`Takeover.take_over`), and a failed transaction goes through `_recover` as always. One
call can block for ever whatever timeout it is given: `send_offsets_to_transaction` when
the group coordinator is lost, as after a broker restart (confluentinc/librdkafka#5456
and #5511). So every transactional call runs under a watchdog (`bounded`, streams/kafka.py:
`TXN_CALL_S` for the call, `TXN_WATCHDOG_S` before it is abandoned; `OFFSETS_CALL_S` and
`OFFSETS_WATCHDOG_S` for `send_offsets_to_transaction`). A call that
outlives its watchdog is abandoned with its producer, which is never touched again, and
the ledger recovers through the fenced path, exactly as if this process had crashed there
and been restarted:
 - A new producer with the same transactional.id calls `init_transactions`, which bumps
   the producer epoch: the broker aborts the abandoned producer's open transaction (or,
   if that producer's commit already reached the transaction coordinator, completes it
   first: InitProducerId waits for a pending commit to finish), and fences every later
   request of the old epoch. If the abandoned call returns one day, nothing it does can
   commit: its TxnOffsetCommit and EndTxn carry the old epoch.
 - Then the takeover (`Takeover.take_over`) fetches the committed offsets
   (require_stable: they wait for any transaction still pending on them) and restores
   the state to the log's real end, so the state holds exactly the batches whose offsets
   are committed, whichever way the abandoned transaction ended; the consumer is sought
   back to those offsets and the uncommitted inputs are decided again.
A watchdog that fires on a slow but healthy call (a saturated machine) costs a recovery,
never correctness: the abandoned transaction is committed or aborted as a whole, and the
takeover reads back whichever it was.

The producer's local queue. librdkafka holds every produced message until its delivery
report is served by `poll`; a transaction of 20,000 records polls as it goes, and a full
queue (`BufferError`, which is not a KafkaException) is drained by polling and the
produce retried, so a catch-up can never crash the process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from schemas.codec import (
    DISPATCH,
    JOB_LOG,
    JOB_STATE,
    RUN_EVENTS,
    RUN_STATE,
    WORKER_INBOX,
    CodecError,
)
from schemas.json import dlq_record
from schemas.records import JobState, RunState
from streams import metrics
from streams.core.clock import SYSTEM_CLOCK, Clock
from streams.core.ledger import Decision, LedgerConfig
from streams.core.timing import TIMING
from streams.headers import job_state_headers, run_state_headers
from streams.identity import (
    NodeIdTaken,
    await_node_id,
    ledger_client_id,
    new_incarnation,
    newer_twins,
)
from streams.inboxes import Inboxes
from streams.kafka import (
    KAFKA_CLIENTS,
    RETRY_SLEEP_S,
    TRANSACTION_TIMEOUT_MS,
    Clients,
    GroupWatch,
    Hung,
    abandon_consumer,
    admin_config,
    bounded,
    consumer_config,
    transactional_producer_config,
)
from streams.ledger_takeover import (
    RESTORE_STALL_S,
    PartitionState,
    TakenOver,
    Takeover,
)
from streams.ledger_takeover import range_share as range_share  # re-exported: it was here
from streams.lifecycle import run_steps, trim_malloc_once
from streams.placement_key import placement_key
from streams.settings import Settings
from streams.state_store import DiskStore
from streams.state_table import COLD_AFTER_MS

log = logging.getLogger("cronlog.ledger")
_APPLIED = metrics.DECISIONS.labels("applied")
_REJECTED = metrics.DECISIONS.labels("rejected")
_DLQ = metrics.LEDGER_DLQ.labels("ledger")

# The work of one transaction (module docstring, step 4).
TXN_MAX_RECORDS = 20_000
TXN_MAX_S = 2.5
# A transactional call's own timeout, and its watchdog's (module docstring: a call that
# can ignore its timeout). The transaction timeout: a transaction not committed by then is
# aborted by the broker anyway, so a call still waiting then only delays the recovery
# (a paused group coordinator held `send_offsets_to_transaction` until the watchdog).
TXN_CALL_S = TRANSACTION_TIMEOUT_MS / 1000
TXN_WATCHDOG_S = TXN_CALL_S + 0.5
# `send_offsets_to_transaction` is one round trip to the group coordinator (milliseconds
# when it answers). The call that ignores its timeout is this one, waiting for a lost
# coordinator (librdkafka #5456, #5511): it is given about a coordinator's failover (the
# broker session, then the new coordinator's load) before the ledger recovers, whose
# calls wait for the new coordinator without hanging.
OFFSETS_CALL_S = TIMING.broker_session_s + 1.0
OFFSETS_WATCHDOG_S = OFFSETS_CALL_S + 0.5
# How long a starting ledger waits for a predecessor under its node id to leave the
# group (a process killed a moment ago is a member until its session lapses).
TWIN_PATIENCE_S = TIMING.consumer_session_s + 3.0
# The produced messages between two polls of the producer's delivery reports.
POLL_EVERY = 1000
UNASSIGNED = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses


def record_time(msg: Message) -> tuple[int | None, bool]:
    """(the record's timestamp, whether the broker stamped it): LogAppendTime on a
    migrated job-log; a CreateTime stamp (a topic not migrated) stands in for it; with
    none at all, decide() takes the input's own at_ms."""
    kind, stamp = msg.timestamp()
    if kind == TIMESTAMP_LOG_APPEND_TIME:
        return stamp, True
    if kind == TIMESTAMP_CREATE_TIME:
        return stamp, False
    return None, False


def _cold(job: JobState) -> bool:
    """Whether the ledger will not need this job state soon: nothing of it live, and no
    firing within `COLD_AFTER_MS` of its last decision."""
    due = job.next_due_ms
    return not job.live_runs and (due is None or due - job.updated_ms > COLD_AFTER_MS)


@dataclass(frozen=True, slots=True)
class LedgerStats:
    batches: int  # consumed batches fully decided
    records: int  # inputs decided and committed
    rejected: int
    recoveries: int
    transactions: int = 0  # committed transactions
    cut: int = 0  # transactions ended by the budget before the end of their batch
    produced: int = 0  # records produced in committed transactions
    queue_full: int = 0  # produce calls that met a full local queue (then retried)
    longest_txn_s: float = 0.0


def _fenced(exc: KafkaException) -> bool:
    """Whether a newer producer under this transactional.id fenced ours."""
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
    )


class Ledger:
    def __init__(
        self,
        settings: Settings,
        config: LedgerConfig = LedgerConfig(),
        node_id: str | None = None,
        batch_size: int = 500,
        txn_max_records: int = TXN_MAX_RECORDS,
        txn_max_s: float = TXN_MAX_S,
        restore_stall_s: float = RESTORE_STALL_S,
        producer_overrides: dict[str, Any] | None = None,
        store_dir: Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
        clients: Clients = KAFKA_CLIENTS,
        share: tuple[int, int] = (0, 1),
    ):
        if txn_max_s >= TRANSACTION_TIMEOUT_MS / 1000 / 2:
            raise ValueError(
                f"txn_max_s ({txn_max_s}) must stay well under the transaction timeout "
                f"({TRANSACTION_TIMEOUT_MS} ms)"
            )
        self.settings = settings
        self.clients = clients
        self.clock = clock
        self.config = config
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self.batch_size = batch_size
        self.txn_max_records = txn_max_records
        self.txn_max_s = txn_max_s
        self.producer_overrides = producer_overrides or {}
        # (index, count) of the node's ledger processes: what this one reads ahead.
        self.share = share
        # Where the states held encoded live: on disk under store_dir, or on the heap.
        self.store = None if store_dir is None else DiskStore(store_dir)
        self.topics = {
            n: settings.topic(n)
            for n in (
                "job-log",
                "jobs",
                "runs",
                "run-events",
                "dispatch",
                "commands.dlq",
            )
        }
        # One admin client: the inbox topics, and the group description (streams/identity.py).
        self.admin = clients.admin(admin_config(settings))
        # Each worker's inbox topic: its own, or the shared one of HTTP workers.
        self.inboxes = Inboxes(settings, self.admin)
        self.state: dict[int, PartitionState] = {}
        self._stop = threading.Event()
        self._batches = self._records = self._rejected = self._recoveries = 0
        self._transactions = self._cut = self._produced = self._queue_full = 0
        self._longest_txn_s = 0.0
        self._in_txn = 0  # records produced in the open transaction
        # States changed in the open transaction, written at its end (`_write_states`).
        self._dirty_jobs: dict[tuple[int, str], JobState] = {}
        self._dirty_runs: dict[tuple[int, str], RunState | None] = {}
        self._abandoned = 0  # producers left inside a hung call (module docstring)
        self._brokers_were_down = False  # librdkafka said so since the last transaction
        # The takeovers: the read-ahead, then the committed offsets and the state of the
        # partitions it gets (streams/ledger_takeover.py).
        self.takeover = Takeover(
            settings,
            clients,
            clock,
            self._stop,
            self.node_id,
            share,
            self.store,
            restore_stall_s,
        )
        self._txn_rejected = self._txn_dlq = 0
        self.assigned = False  # a first assignment came and was restored (readiness)
        self._warned_create_time = False
        self.watch = GroupWatch(settings, f"ledger {self.node_id}")
        self.incarnation = new_incarnation()  # this process, among those of its node id
        self._identity_due = False  # an assignment came: look for a newer twin
        self.consumer = self._new_consumer()
        # A live ledger under this node id would be fenced by our producer, and fence it
        # back: wait for it to leave, or refuse to start (streams/identity.py).
        await_node_id(
            self.admin,
            settings.group("ledger"),
            self.node_id,
            self.incarnation,
            TWIN_PATIENCE_S,
            self._stop,
        )
        self.producer = self._new_producer()

    # -- lifecycle ----------------------------------------------------------------------
    def _new_producer(self) -> Producer:
        # Fencing of zombies comes from the consumer group generation sent with the
        # offsets (KIP-447). The transactional.id is stable per node id so that a node
        # restarted after a crash aborts its predecessor's open transaction at once
        # (init_transactions) instead of leaving readers blocked until it times out.
        # Node ids must therefore be unique: two live nodes with one id fence each other.
        txn_id = f"{self.settings.group('ledger')}-{self.node_id}"
        config = {**transactional_producer_config(self.settings, txn_id), **self.producer_overrides}
        failures = 0
        while True:
            producer = self.clients.producer(config)
            while True:
                try:
                    bounded(
                        partial(producer.init_transactions, TXN_CALL_S),
                        TXN_WATCHDOG_S,
                        "init_transactions",
                    )
                    return producer
                except KafkaException as exc:
                    failures += 1
                    if failures == 1 or failures % 10 == 0:
                        log.warning(
                            "ledger %s: init_transactions failed (%s); retrying (the broker "
                            "may be down)",
                            self.node_id,
                            exc,
                        )
                    if self._stop.wait(RETRY_SLEEP_S):
                        return producer  # stopping: never used for a transaction
                    error = exc.args[0] if exc.args else None
                    if not (isinstance(error, KafkaError) and error.retriable()):
                        break  # a new producer
                except Hung as exc:
                    self._abandoned += 1
                    log.error("ledger %s: %s; replacing the producer", self.node_id, exc)
                    break

    def stop(self) -> None:
        self._stop.set()

    def stats(self) -> LedgerStats:
        return LedgerStats(
            self._batches,
            self._records,
            self._rejected,
            self._recoveries,
            self._transactions,
            self._cut,
            self._produced,
            self._queue_full,
            self._longest_txn_s,
        )

    def _new_consumer(self) -> Consumer:
        return self.clients.consumer(
            consumer_config(
                self.settings,
                self.settings.group("ledger"),
                **{
                    "enable.partition.eof": False,
                    # Names the process in the broker's view of the group. Which
                    # partitions a node's ledger processes get is the broker's choice
                    # (its range assignor orders members by their random ids): the share
                    # `range_share` reads ahead is a guess, and a partition it did not
                    # read ahead is restored from the start.
                    "client.id": ledger_client_id(self.share[0], self.incarnation, self.node_id),
                    "error_cb": self._client_error,
                    **self.watch.config(),
                },
            )
        )

    def _subscribe(self) -> None:
        self.consumer.subscribe(
            [self.topics["job-log"]],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )

    def _replace_consumer(self) -> None:
        """A consumer stuck out of its group (GroupWatch): a new member in its place,
        between transactions (none is open). The state goes with the old member and is
        restored on the new assignment; the old member's group generation is stale, so
        nothing it could still send commits (module docstring, Fencing)."""
        abandon_consumer(self.consumer, "ledger")
        for partition in list(self.state):
            self._drop(partition)
        self.consumer = self._new_consumer()
        self._subscribe()

    def run(self) -> None:
        run_steps(self.open, self.step, self.close, self._stop)

    def open(self) -> bool:
        """Join the group and start reading ahead (False: stopped before it could).
        `run` is `open`, `step` until stopped, `close`; a test drives the steps itself."""
        self._lag = metrics.ConsumerLag("ledger", self.settings.topic_prefix)
        if self.config.placement_key is None:
            # The seals of claims are checked with the nodes' key (streams/placement_key.py).
            try:
                key = placement_key(self.settings, self._stop, self.clients)
            except KeyError:
                return False  # stopped while waiting for the broker
            self.config = replace(self.config, placement_key=key)
        self._subscribe()
        self.takeover.start_read_ahead()
        return True

    def step(self) -> None:
        """One turn of the loop: consume a batch (serving rebalances), decide and commit
        it in transactions."""
        if self.watch.stuck():
            self._replace_consumer()
        ahead = self.takeover.reading_ahead
        messages = self.consumer.consume(self.batch_size, timeout=0 if ahead else 0.2)
        if self.takeover.reading_ahead:  # not yet assigned
            self.takeover.read_ahead()
        if self._identity_due:  # assigned: a frozen ledger woken beside its replacement?
            self._check_node_id()
        records = [m for m in messages if self._usable(m)]
        if records and self._brokers_were_down:
            # The first batch after every broker was down: its transaction would reach
            # the group coordinator through the producer's cached one, a broker
            # librdkafka may have dropped meanwhile, and send_offsets_to_transaction
            # then waits for it until the watchdog (librdkafka #5511; seen after most
            # outages). A fresh producer finds the coordinator anew; the batch is read
            # again from the committed offsets the recovery seeks to.
            self._brokers_were_down = False
            log.info("ledger %s: the brokers were down; a fresh producer", self.node_id)
            self._recover(abort=False)
            records = []
        if records:
            self._process_batch(records)
        self._lag.report(self.consumer)

    def _client_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_were_down = True

    def close(self) -> None:
        self.takeover.end_read_ahead()
        self.consumer.close()
        if self.store is not None:
            self.store.close()

    def _usable(self, msg: Message) -> bool:
        error = msg.error()
        if error is None:
            return True
        if error.fatal():
            raise KafkaException(error)
        log.warning("consumer error: %s", error)
        return False

    # -- assignment ---------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:  # a replaced consumer, closing late
            return
        started = self.clock.monotonic()
        taken = self._take_over(partitions)
        positions = taken.positions
        # Assigned here, with the offsets the state was restored for: librdkafka must
        # not look the committed offsets up again after the restore (see
        # `Takeover.take_over`).
        consumer.incremental_assign(positions)
        self.watch.reset()  # in the group (the statistics said otherwise while it restored)
        self.assigned = True
        self._identity_due = True
        metrics.LEDGER_PARTITIONS.set(len(self.state))
        if self._stop.is_set():
            return  # stopping: nothing is decided any more
        log.info(
            "ledger %s owns job-log partitions %s: restored from %d state records in %.2f s",
            self.node_id,
            sorted(tp.partition for tp in positions),
            taken.records,
            self.clock.monotonic() - started,
        )
        trim_malloc_once(f"ledger {self.node_id} restored", log.info)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:  # a replaced consumer, closing late
            return
        for tp in partitions:
            self._drop(tp.partition)

    def ready(self) -> str | None:
        """None once its partitions are assigned and restored, else why not."""
        return None if self.assigned else "ledger: no partitions assigned and restored yet"

    def _drop(self, partition: int) -> None:
        self.state.pop(partition, None)
        metrics.LEDGER_PARTITIONS.set(len(self.state))
        if self.store is not None:
            self.store.drop(partition)

    def _take_over(self, partitions: list[TopicPartition]) -> TakenOver:
        """Committed offsets first, then the state (held from here on), then the
        positions to resume from (returned; the caller assigns or seeks them). Used on
        assignment and recovery. `Takeover.take_over` (streams/ledger_takeover.py) says
        why in that order."""
        taken = self.takeover.take_over(self.consumer, partitions)
        self.state.update(taken.states)  # none when stop() cut the restore short
        return taken

    # -- processing ---------------------------------------------------------------------
    def _process_batch(self, records: list[Message]) -> None:
        try:
            self._transact(records)
        except KafkaException as exc:
            if _fenced(exc):
                self._check_node_id()  # before recovering fences the other in turn
            log.error("transaction failed (%s): aborting and recovering", exc)
            self._recover()
        except Hung as exc:
            # Never touch that producer again: it is inside a call that may still return.
            self._abandoned += 1
            log.error(
                "ledger %s: %s; abandoning the producer (%d so far) and recovering through "
                "the fenced path",
                self.node_id,
                exc,
                self._abandoned,
            )
            self._recover(abort=False)

    def _transact(self, records: list[Message]) -> None:
        """One transaction over a prefix of `records` (all of them unless the budget cuts
        it); the consumer is sought back to the first record left out."""
        self.producer.begin_transaction()
        self._in_txn = 0
        self._txn_rejected = self._txn_dlq = 0  # counted in the metrics once committed
        self._dirty_jobs.clear()  # a failed transaction's, thrown away with its state
        self._dirty_runs.clear()
        started = self.clock.monotonic()
        offsets: dict[tuple[str, int], int] = {}
        done = 0
        for msg in records:
            self._process(msg)
            offsets[(msg.topic() or "", msg.partition() or 0)] = (msg.offset() or 0) + 1
            done += 1
            pending = self._in_txn + len(self._dirty_jobs) + len(self._dirty_runs)
            if (
                pending >= self.txn_max_records
                or self.clock.monotonic() - started >= self.txn_max_s
            ):
                break
        self._write_states()
        producer, metadata = self.producer, self.consumer.consumer_group_metadata()
        positions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        bounded(
            lambda: producer.send_offsets_to_transaction(positions, metadata, OFFSETS_CALL_S),
            OFFSETS_WATCHDOG_S,
            "send_offsets_to_transaction",
        )
        bounded(
            lambda: producer.commit_transaction(TXN_CALL_S), TXN_WATCHDOG_S, "commit_transaction"
        )
        took = self.clock.monotonic() - started
        metrics.TXN_SECONDS.observe(took)
        metrics.TXN_RECORDS.observe(done)
        _APPLIED.inc(done - self._txn_rejected - self._txn_dlq)
        _REJECTED.inc(self._txn_rejected)
        _DLQ.inc(self._txn_dlq)
        self._transactions += 1
        self._produced += self._in_txn
        self._records += done
        self._longest_txn_s = max(self._longest_txn_s, took)
        if done == len(records):
            self._batches += 1
            return
        self._cut += 1
        rest: dict[tuple[str, int], int] = {}
        for msg in records[done:]:
            rest.setdefault((msg.topic() or "", msg.partition() or 0), msg.offset() or 0)
        log.info(
            "transaction cut by its budget after %d of %d inputs (%d records, %.2f s); "
            "the rest follows in the next one",
            done,
            len(records),
            self._in_txn,
            took,
        )
        for (topic, partition), offset in rest.items():
            self.consumer.seek(TopicPartition(topic, partition, offset))

    def _process(self, msg: Message) -> None:
        partition = msg.partition() or 0  # never None for a consumed record
        state = self.state.get(partition)
        if state is None:  # revoked mid-batch: the new owner redoes it
            raise KafkaException(KafkaError(KafkaError._STATE, "partition revoked mid-batch"))
        try:
            inp = JOB_LOG.decode_keeping_spec(msg.value() or b"")
        except CodecError as exc:
            self._produce(
                self.topics["commands.dlq"],
                msg.key(),
                dlq_record(
                    msg.value() or b"",
                    f"undecodable job-log record: {exc}",
                    msg.topic() or "",
                    partition,
                    msg.offset() or 0,
                ),
            )
            self._txn_dlq += 1
            return
        key = msg.key()
        decision = state.decide(key.decode() if key else "", inp, self.config, self._now_ms(msg))
        if decision.rejected and not decision.dead_letter:
            self._rejected += 1
            self._txn_rejected += 1
        if decision.dead_letter:
            record = dlq_record(
                msg.value() or b"",
                decision.rejected,
                msg.topic() or "",
                partition,
                msg.offset() or 0,
            )
            self._produce(self.topics["commands.dlq"], msg.key(), record)
            self._txn_dlq += 1
        self._apply(partition, state, decision)

    def _now_ms(self, msg: Message) -> int | None:
        """The broker's append time of the record: the ledger's one clock."""
        stamp, broker_time = record_time(msg)
        if stamp is not None and not broker_time and not self._warned_create_time:
            self._warned_create_time = True
            log.warning(
                "%s carries CreateTime stamps (partition %s, offset %s): the producers' "
                "clocks decide time; `cronlog topics create` sets LogAppendTime",
                msg.topic(),
                msg.partition(),
                msg.offset(),
            )
        return stamp

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int = UNASSIGNED,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """produce(), never failing on a full local queue: send what is queued and serve
        the delivery reports (which frees the delivered messages), then retry. If nothing
        drains within the transaction timeout the broker is gone: fail like any
        transaction error."""
        waited_until = 0.0
        while True:
            try:
                self.producer.produce(
                    topic, key=key, value=value, partition=partition, headers=headers
                )
                break
            except BufferError:
                self._queue_full += 1
                now = self.clock.monotonic()
                if not waited_until:
                    waited_until = now + TRANSACTION_TIMEOUT_MS / 1000
                elif now > waited_until:
                    raise KafkaException(
                        KafkaError(KafkaError._QUEUE_FULL, "local producer queue stays full")
                    ) from None
                # flush, not poll: the queued records linger until the commit otherwise
                # (TRANSACTION_LINGER_MS), and only their delivery frees the queue.
                self.producer.flush(0.05)
        self._in_txn += 1
        if self._in_txn % POLL_EVERY == 0:
            self.producer.poll(0)

    def _apply(self, partition: int, state: PartitionState, decision: Decision) -> None:
        produce = self._produce
        # State changes apply in memory now (the next input is decided against them) and
        # are written once per transaction (`_write_states`).
        state.apply(decision)
        if decision.job is not None:
            self._dirty_jobs[(partition, decision.job.spec.job_id)] = decision.job
        for run in decision.runs:
            self._dirty_runs[(partition, run.run_id)] = run
        for run_id in decision.forget:
            self._dirty_runs[(partition, run_id)] = None
        for event in decision.events:
            produce(
                self.topics["run-events"],
                event.job_id.encode(),
                RUN_EVENTS.encode(event),
                partition,
            )
        for reply in decision.replies:
            inbox = self.inboxes.topic(reply.worker_id)  # KafkaException: abort, recover
            produce(inbox, reply.worker_id.encode(), WORKER_INBOX.encode(reply))
        for notice in decision.notices:
            # Another job's log: keyed by its job_id, the partitioner picks the partition.
            produce(self.topics["job-log"], notice.job_id.encode(), JOB_LOG.encode(notice))
        for request in decision.dispatch:
            produce(self.topics["dispatch"], request.run_id.encode(), DISPATCH.encode(request))

    def _write_states(self) -> None:
        """The transaction's state records: each job and run changed by its inputs, once,
        as it stands after the last of them (a tombstone for a forgotten run). `jobs`
        and `runs` are compacted and read only for their latest value per key (the
        takeover's restore, the scheduler, the projector), and the transaction makes all
        of it visible at once, so the intermediate values a batch went through carry
        nothing anyone reads: writing them cost an encoding, a record and a decode each."""
        jobs, runs = self.topics["jobs"], self.topics["runs"]
        for (partition, job_id), job in self._dirty_jobs.items():
            data = JOB_STATE.encode(job)
            # The headers: what the scheduler needs of the state (streams/headers.py).
            self._produce(jobs, job_id.encode(), data, partition, job_state_headers(job))
            state = self.state.get(partition)
            if state is not None and _cold(job):
                state.jobs.keep_encoded(job_id, job, data)  # decoded again when next needed
        for (partition, run_id), run in self._dirty_runs.items():
            value = None if run is None else RUN_STATE.encode(run)
            headers = None if run is None else run_state_headers(run)
            self._produce(runs, run_id.encode(), value, partition, headers)
            state = self.state.get(partition)
            if state is not None and value is not None and run is not None and run.final:
                state.runs.keep_encoded(run_id, run, value)
        self._dirty_jobs.clear()
        self._dirty_runs.clear()

    def _check_node_id(self) -> None:
        """A newer live process under this node id (streams/identity.py): this one goes.
        Else a fence came from this process's own replaced producer or a transaction
        timeout, and it recovers."""
        self._identity_due = False
        newer = newer_twins(
            self.admin, self.settings.group("ledger"), self.node_id, self.incarnation
        )
        if newer:
            raise NodeIdTaken(
                f"ledger {self.node_id} (incarnation {self.incarnation}) was replaced by a "
                f"live ledger under its node id ({', '.join(newer)}); this one stops"
            )

    def _recover(self, abort: bool = True) -> None:
        """Abort (unless the producer is abandoned), recreate the producer, and take the
        assigned partitions over again: committed offsets, then state, then seek
        (`Takeover.take_over` says why that order). The new producer's init_transactions
        fences the old one and aborts its open transaction either way."""
        self._recoveries += 1
        if abort:
            producer = self.producer
            try:
                bounded(lambda: producer.abort_transaction(TXN_CALL_S), TXN_WATCHDOG_S, "abort")
            except (KafkaException, Hung) as exc:
                log.warning("abort failed (%s); the producer is replaced anyway", exc)
        self.producer = self._new_producer()
        for tp in self._take_over(self.consumer.assignment()).positions:
            self.consumer.seek(tp)
