"""The ledger process: a fenced, transactional consume-process-produce loop over job-log.

It owns the job-log partitions the consumer group gives it and, for each, the same
partition of the compacted `jobs` and `runs` topics (its state). The pure state machine
is streams/core/ledger/; this module only moves bytes.

Each input's decision and outputs are streams/ledger_outputs.py's; the consumer group's
member, its assignments and its node id's twins streams/ledger_membership.py's; the
takeover of partitions streams/ledger_takeover.py's. This module runs the transactions.

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

An output that can never be written. A record librdkafka refuses at produce() (message
larger than message.max.bytes: MSG_SIZE_TOO_LARGE) or the broker refuses in a delivery
report (MSG_SIZE_TOO_LARGE past the topic's max.message.bytes, RECORD_LIST_TOO_LARGE,
INVALID_RECORD), which then fails the commit as an abortable error carrying that code,
would fail the same transaction again on every retry: the input that led to it holds its
partition for ever. The domain refuses what it can see (`params.written`); for the rest,
such an error (`refusal`) aborts and recovers as always, then the batch is decided again
one input per transaction (`_one_by_one`), so the input whose outputs are refused is
isolated (a produce request refused as a whole fails its batch-mates' delivery reports
too: only a transaction of one input says which it was). That input is refused: its own
transaction is redone with nothing but its dead letter (its bytes and the reason), or,
should that be refused as well, the reason without its bytes, and at last nothing but its
offset (logged). Every other error is retried as before. Deterministic: the same input
leads to the same outputs and the same refusal on every node.
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

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from schemas.records import JobState, RunState
from streams import metrics
from streams.core.clock import SYSTEM_CLOCK, Clock
from streams.core.ledger import LedgerConfig
from streams.core.timing import TIMING
from streams.identity import await_node_id, new_incarnation
from streams.inboxes import Inboxes
from streams.kafka import (
    KAFKA_CLIENTS,
    RETRY_SLEEP_S,
    TRANSACTION_TIMEOUT_MS,
    Clients,
    GroupWatch,
    Hung,
    admin_config,
    bounded,
    transactional_producer_config,
)
from streams.ledger_membership import Membership
from streams.ledger_outputs import Outputs
from streams.ledger_takeover import RESTORE_STALL_S, PartitionState, Takeover
from streams.ledger_takeover import range_share as range_share  # re-exported: it was here
from streams.lifecycle import run_steps
from streams.placement_key import placement_key
from streams.settings import Settings
from streams.state_store import DiskStore
from streams.topics import DLQ_MAX_BYTES

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


# Producer errors an input's outputs meet every time (module docstring: an output that can
# never be written): the input is refused, never retried. Any other code may pass.
REFUSED_CODES = frozenset(
    (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD)
)


def refusal(exc: KafkaException) -> str:
    """Why the ledger can never write what an input leads to ("" for an error that may
    pass): librdkafka's or the broker's refusal of a record, from produce(), a delivery
    report (the commit's abortable error carries its code) or the commit."""
    error = exc.args[0] if exc.args else None
    return refused(error) if isinstance(error, KafkaError) else ""


def refused(error: KafkaError) -> str:
    """`refusal`'s reason for one error ("" for one that may pass)."""
    if error.code() in REFUSED_CODES:
        return f"the ledger cannot write what this input leads to: {error.name()}: {error.str()}"
    return ""


class Deliveries:
    """The first refusal a delivery report of the open transaction carried. Once a record
    is refused the producer is in an abortable state, and the call that fails next (a
    produce, the offsets, the commit) often says only that (_STATE) or times out, not
    why: the report's code is what tells a refusal from an error that may pass."""

    def __init__(self) -> None:
        self.refused = ""

    def begin(self) -> None:
        self.refused = ""

    def report(self, err: KafkaError | None, _msg: Message | None) -> None:
        """The producer's `on_delivery`, for every record that failed."""
        if err is not None and not self.refused:
            self.refused = refused(err)

    def why(self, exc: KafkaException) -> str:
        """Why the failed transaction can never be written: its error's code, or a
        delivery report's in it ("" if neither is a refusal)."""
        return refusal(exc) or self.refused


def _fenced(exc: KafkaException) -> bool:
    """Whether a newer producer under this transactional.id fenced ours."""
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
    )


class Ledger(Membership, Outputs):
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
        # Inputs refused for the outputs they lead to, while a batch is decided one by
        # one (`_one_by_one`): (topic, partition, offset) -> (reason, what is kept).
        self._refusing: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._deliveries = Deliveries()
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
        config = {
            **transactional_producer_config(self.settings, txn_id),
            # The dead letter of any job-log record (a third larger than the record) is
            # never refused by librdkafka: commands.dlq takes DLQ_MAX_BYTES.
            "message.max.bytes": DLQ_MAX_BYTES,
            # Reports of failed records only: the ledger needs no word of the others,
            # and a Python call per record is off its hot path.
            "delivery.report.only.error": True,
            "on_delivery": self._deliveries.report,
            **self.producer_overrides,
        }
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

    def close(self) -> None:
        self.takeover.end_read_ahead()
        self.consumer.close()
        if self.store is not None:
            self.store.close()

    # -- transactions -------------------------------------------------------------------
    def _process_batch(self, records: list[Message]) -> None:
        try:
            self._transact(records)
        except KafkaException as exc:
            if _fenced(exc):
                self._check_node_id()  # before recovering fences the other in turn
            log.error("transaction failed (%s): aborting and recovering", exc)
            reason = self._deliveries.why(exc)
            positions = self._recover()
            if reason:
                self._one_by_one(records, positions)
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
        self._deliveries.begin()
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

    def _one_by_one(self, records: list[Message], positions: list[TopicPartition]) -> None:
        """A batch whose transaction met a refused record (`refusal`), decided again one
        input per transaction from the committed `positions`: an input whose own
        transaction is refused is refused in turn (its dead letter with its bytes, then
        without them, then only its offset: `Outputs._refusing`), and the partition goes
        on. A transient error, or a fence, recovers as always and leaves the rest to the
        next batch, read again from the committed offsets."""
        committed = {(tp.topic, tp.partition): tp.offset for tp in positions}
        resume: dict[tuple[str, int], int] = {}
        try:
            for msg in records:
                if self._stop.is_set():
                    return  # the rest from the committed offsets, by the next owner
                where, offset = (msg.topic() or "", msg.partition() or 0), msg.offset() or 0
                if where not in committed or offset < committed[where]:
                    continue  # no longer this ledger's, or committed already
                # What its next transaction keeps of it, should this one be refused.
                for then in ("bytes", "reason", "offset", ""):
                    try:
                        self._transact([msg])
                        break
                    except KafkaException as exc:
                        if _fenced(exc):
                            self._check_node_id()  # as `_process_batch` does
                        reason = self._deliveries.why(exc)
                        log.error(
                            "input %s [%d] @%d alone: transaction failed (%s)",
                            *where,
                            offset,
                            exc,
                        )
                        self._recover()
                        if not reason or not then:
                            return  # the rest from the committed offsets, next batch
                        first = self._refusing.get((*where, offset), (reason, ""))[0]
                        self._refusing[(*where, offset)] = (first, then)
                    except Hung as exc:
                        self._abandoned += 1
                        log.error("ledger %s: %s; abandoning the producer", self.node_id, exc)
                        self._recover(abort=False)
                        return
                resume[where] = offset + 1
        finally:
            self._refusing.clear()
        for (topic, partition), offset in resume.items():
            self.consumer.seek(TopicPartition(topic, partition, offset))

    def _recover(self, abort: bool = True) -> list[TopicPartition]:
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
        positions = self._take_over(self.consumer.assignment()).positions
        for tp in positions:
            self.consumer.seek(tp)
        return positions
