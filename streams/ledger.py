"""The ledger process: a fenced, transactional consume-process-produce loop over job-log.

It owns the job-log partitions the consumer group gives it and, for each, the same
partition of the compacted `jobs` and `runs` topics (its state). The pure state machine
is streams/core/ledger.py; this module only moves bytes.

Commit order of one batch (why a crash at any point is safe):
 1. `consume` up to `batch_size` job-log records (read_committed).
 2. `begin_transaction`.
 3. For each record in log order: decode (an undecodable one goes to commands.dlq),
    `decide` against the in-memory state, apply the decision in memory, and produce its
    outputs: run-events, dispatch, and the new job and run states (tombstones for
    forgotten runs), all to the record's partition number.
 4. `send_offsets_to_transaction(position, consumer_group_metadata())`: the consumed
    offsets join the transaction (KIP-447). A zombie - a member that lost its partitions
    without noticing - fails here or at commit, because its group generation is stale.
 5. `commit_transaction`: outputs, state and offsets become visible together, or not at
    all. A crash before this point aborts everything (the broker times the transaction
    out); the next owner restores state from what was committed and resumes from the
    committed offset, so it redoes exactly the uncommitted batch.
On any error in 2-5 the batch's in-memory changes are thrown away with the whole state:
abort if possible, recreate the producer, reload state, rewind to the committed offsets.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
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
from streams.core.ledger import Decision, LedgerConfig, decide
from streams.core.records import JobState, RunState
from streams.kafka import consumer_config, transactional_producer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.ledger")


@dataclass
class PartitionState:
    jobs: dict[str, JobState] = field(default_factory=dict)
    runs: dict[str, RunState] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LedgerStats:
    batches: int
    records: int
    rejected: int
    recoveries: int


class Ledger:
    def __init__(
        self,
        settings: Settings,
        config: LedgerConfig = LedgerConfig(),
        node_id: str | None = None,
        batch_size: int = 500,
    ):
        self.settings = settings
        self.config = config
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
        self.batch_size = batch_size
        self.topics = {
            n: settings.topic(n)
            for n in (
                "job-log",
                "jobs",
                "runs",
                "run-events",
                "dispatch",
                "commands.dlq",
                "worker-inbox",
            )
        }
        self.state: dict[int, PartitionState] = {}
        self._stop = threading.Event()
        self._batches = self._records = self._rejected = self._recoveries = 0
        self.consumer = Consumer(
            consumer_config(settings, settings.group("ledger"), **{"enable.partition.eof": False})
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
        producer = Producer(transactional_producer_config(self.settings, txn_id))
        producer.init_transactions(30)
        return producer

    def stop(self) -> None:
        self._stop.set()

    def stats(self) -> LedgerStats:
        return LedgerStats(self._batches, self._records, self._rejected, self._recoveries)

    def run(self) -> None:
        self.consumer.subscribe(
            [self.topics["job-log"]],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        try:
            while not self._stop.is_set():
                messages = self.consumer.consume(self.batch_size, timeout=0.2)
                records = [m for m in messages if self._usable(m)]
                if records:
                    self._process_batch(records)
        finally:
            self.consumer.close()

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
        started = time.monotonic()
        restored = self._restore_all([tp.partition for tp in partitions])
        self.state.update(restored)
        log.info(
            "ledger %s owns job-log partitions %s: restored %d jobs and %d runs in %.2f s",
            self.node_id,
            sorted(restored),
            sum(len(s.jobs) for s in restored.values()),
            sum(len(s.runs) for s in restored.values()),
            time.monotonic() - started,
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.state.pop(tp.partition, None)

    def _restore(self, partition: int) -> PartitionState:
        return self._restore_all([partition])[partition]

    def _restore_all(
        self, partitions: list[int], timeout_s: float = 60.0
    ) -> dict[int, PartitionState]:
        """Read these partitions of `jobs` and `runs` to their end (read_committed), all
        at once with one consumer: a failover restores every partition it takes over.

        The end to read to is the log's real end (read_uncommitted), not the last stable
        offset a read_committed consumer reports: the previous owner's last transaction
        may be committed (its offsets about to become visible) while its markers are
        still being written, and stopping at the LSO would restore state without that
        batch and resume after it: duplicate runs. So wait for every transaction below
        the real end to be resolved (a dead ledger's is aborted within
        transaction.timeout.ms).
        """
        states = {p: PartitionState() for p in partitions}
        jobs_topic, runs_topic = self.topics["jobs"], self.topics["runs"]
        probe = Consumer(
            consumer_config(self.settings, None, **{"isolation.level": "read_uncommitted"})
        )
        try:
            targets = {
                (topic, p): probe.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[
                    1
                ]
                for topic in (jobs_topic, runs_topic)
                for p in partitions
            }
        finally:
            probe.close()
        pending = {key: high for key, high in targets.items() if high > 0}
        if not pending:
            return states
        reader = Consumer(
            consumer_config(
                self.settings,
                None,
                **{"enable.partition.eof": True, "fetch.wait.max.ms": 20},
            )
        )
        try:
            reader.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in pending])
            deadline = time.monotonic() + timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, f"could not restore {sorted(pending)}")
                    )
                for msg in reader.consume(10_000, timeout=0.1):
                    error = msg.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            raise KafkaException(error)
                        continue
                    state = states[msg.partition() or 0]
                    key = (msg.key() or b"").decode()
                    value = msg.value()
                    if msg.topic() == jobs_topic:
                        if value is None:
                            state.jobs.pop(key, None)
                        else:
                            state.jobs[key] = JOB_STATE.decode(value)
                    elif value is None:
                        state.runs.pop(key, None)
                    else:
                        state.runs[key] = RUN_STATE.decode(value)
                positions = reader.position([TopicPartition(t, p) for t, p in pending])
                for tp in positions:
                    if tp.offset >= pending[(tp.topic, tp.partition)]:
                        del pending[(tp.topic, tp.partition)]
        finally:
            reader.close()
        return states

    # -- processing ---------------------------------------------------------------------
    def _process_batch(self, records: list[Message]) -> None:
        try:
            self.producer.begin_transaction()
            for msg in records:
                self._process(msg)
            self.producer.send_offsets_to_transaction(
                self.consumer.position(self.consumer.assignment()),
                self.consumer.consumer_group_metadata(),
                30,
            )
            self.producer.commit_transaction(30)
            self._batches += 1
            self._records += len(records)
        except KafkaException as exc:
            log.error("transaction failed (%s): aborting and recovering", exc)
            self._recover()

    def _process(self, msg: Message) -> None:
        partition = msg.partition() or 0  # never None for a consumed record
        state = self.state.get(partition)
        if state is None:  # revoked mid-batch: the new owner redoes it
            raise KafkaException(KafkaError(KafkaError._STATE, "partition revoked mid-batch"))
        try:
            inp = JOB_LOG.decode(msg.value() or b"")
        except CodecError as exc:
            self.producer.produce(
                self.topics["commands.dlq"],
                key=msg.key(),
                value=dlq_record(
                    msg.value() or b"",
                    f"undecodable job-log record: {exc}",
                    msg.topic() or "",
                    partition,
                    msg.offset() or 0,
                ),
            )
            return
        key = msg.key()
        decision = decide(
            state.jobs.get(key.decode() if key else ""),
            state.runs.get,
            inp,
            self.config,
        )
        if decision.rejected:
            self._rejected += 1
        self._apply(partition, state, decision)

    def _apply(self, partition: int, state: PartitionState, decision: Decision) -> None:
        produce: Callable[..., None] = self.producer.produce
        if decision.job is not None:
            job = decision.job
            state.jobs[job.spec.job_id] = job
            produce(
                self.topics["jobs"],
                key=job.spec.job_id.encode(),
                value=JOB_STATE.encode(job),
                partition=partition,
            )
        for run in decision.runs:
            state.runs[run.run_id] = run
            produce(
                self.topics["runs"],
                key=run.run_id.encode(),
                value=RUN_STATE.encode(run),
                partition=partition,
            )
        for run_id in decision.forget:
            state.runs.pop(run_id, None)
            produce(self.topics["runs"], key=run_id.encode(), value=None, partition=partition)
        for event in decision.events:
            produce(
                self.topics["run-events"],
                key=event.job_id.encode(),
                value=RUN_EVENTS.encode(event),
                partition=partition,
            )
        for reply in decision.replies:
            produce(
                self.topics["worker-inbox"],
                key=reply.worker_id.encode(),
                value=WORKER_INBOX.encode(reply),
            )
        for notice in decision.notices:
            # Another job's log: keyed by its job_id, the partitioner picks the partition.
            produce(
                self.topics["job-log"], key=notice.job_id.encode(), value=JOB_LOG.encode(notice)
            )
        for request in decision.dispatch:
            produce(
                self.topics["dispatch"], key=request.run_id.encode(), value=DISPATCH.encode(request)
            )

    def _recover(self) -> None:
        """Abort, recreate the producer, reload state, rewind to the committed offsets."""
        self._recoveries += 1
        try:
            self.producer.abort_transaction(10)
        except KafkaException as exc:
            log.warning("abort failed (%s); the producer is replaced anyway", exc)
        self.producer = self._new_producer()
        assignment = self.consumer.assignment()
        committed = self.consumer.committed(assignment, timeout=30)
        self.state.update(self._restore_all([tp.partition for tp in committed]))
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
