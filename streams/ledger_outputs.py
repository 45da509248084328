"""The ledger's work on each input of a transaction (streams/ledger.py runs the
transaction around it): the job-log record decided against its partition's state, at the
broker's time; the decision applied in memory and its outputs produced (run-events,
dispatch, worker inboxes, notices on other jobs' logs, dead letters); the changed states
written once, at the transaction's end.

Time. The ledger's "now" for an input is the broker's append time of its job-log record
(job-log has message.timestamp.type=LogAppendTime), passed to `decide(now_ms=...)`: one
clock that no producer can skew. A record stamped with CreateTime (a job-log made by an
older cronlog and not migrated) falls back to that stamp, with a warning once.

The producer's local queue. librdkafka holds every produced message until its delivery
report is served by `poll`; a transaction of 20,000 records polls as it goes, and a full
queue (`BufferError`, which is not a KafkaException) is drained by polling and the
produce retried, so a catch-up can never crash the process.
"""

from __future__ import annotations

import logging

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
    Message,
    Producer,
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
from streams.core.clock import Clock
from streams.core.ledger import Decision, LedgerConfig
from streams.headers import job_state_headers, run_state_headers
from streams.inboxes import Inboxes
from streams.kafka import TRANSACTION_TIMEOUT_MS
from streams.ledger_takeover import PartitionState
from streams.state_table import COLD_AFTER_MS

log = logging.getLogger("cronlog.ledger")
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


class Outputs:
    """Decides each input and produces what it leads to, into the open transaction."""

    # What this concern uses of the ledger (set by Ledger.__init__, streams/ledger.py).
    clock: Clock
    config: LedgerConfig
    inboxes: Inboxes
    producer: Producer
    state: dict[int, PartitionState]
    topics: dict[str, str]
    _dirty_jobs: dict[tuple[int, str], JobState]
    _dirty_runs: dict[tuple[int, str], RunState | None]
    _in_txn: int
    _queue_full: int
    _refusing: dict[tuple[str, int, int], tuple[str, str]]
    _rejected: int
    _txn_dlq: int
    _txn_rejected: int
    _warned_create_time: bool

    def _process(self, msg: Message) -> None:
        partition = msg.partition() or 0  # never None for a consumed record
        state = self.state.get(partition)
        if state is None:  # revoked mid-batch: the new owner redoes it
            raise KafkaException(KafkaError(KafkaError._STATE, "partition revoked mid-batch"))
        if self._refusing:
            refused = self._refusing.get((msg.topic() or "", partition, msg.offset() or 0))
            if refused is not None:
                self._refuse(msg, partition, *refused)
                return
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

    def _refuse(self, msg: Message, partition: int, reason: str, keep: str) -> None:
        """An input whose outputs can never be written (streams/ledger.py, `_one_by_one`):
        decided no further, its dead letter instead, with its bytes (`keep` "bytes") or
        without them ("reason", when that dead letter was refused too); "offset": nothing,
        the input is only passed (logged)."""
        topic, offset = msg.topic() or "", msg.offset() or 0
        if keep == "offset":
            log.error(
                "input %s [%d] @%d dropped: %s, and its dead letter was refused too",
                topic,
                partition,
                offset,
                reason,
            )
            return
        original = msg.value() or b""
        if keep != "bytes":
            reason = f"{reason} (its {len(original)} bytes are not kept: refused as well)"
            original = b""
        log.error("input %s [%d] @%d refused: %s", topic, partition, offset, reason)
        self._produce(
            self.topics["commands.dlq"],
            msg.key(),
            dlq_record(original, reason, topic, partition, offset),
        )
        self._txn_dlq += 1

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
