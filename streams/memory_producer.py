"""The in-memory Kafka's producer (streams/memory.py): confluent_kafka.Producer's calls the
loops make, over a `MemoryLog` (streams/memory_log.py), transactions and their fencing
included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    Message,
    TopicPartition,
)

from streams.kafka import partition_for
from streams.memory_log import GroupMetadata, MemoryLog, _error, _message, _Record, _Txn


class MemoryProducer:
    """confluent_kafka.Producer's calls the loops make, transactions included."""

    def __init__(self, log: MemoryLog, config: dict[str, Any]):
        self.log = log
        self.txn_id: str | None = config.get("transactional.id")
        self.timeout_s = int(config.get("transaction.timeout.ms", 60_000)) / 1000
        self.epoch: int | None = None
        self.txn: _Txn | None = None
        self.pending: list[tuple[Callable[..., None], Message]] = []

    def _check(self, call: str) -> None:
        self.log.fault(call, self)

    def _fenced(self) -> bool:
        return self.txn_id is not None and self.log.epochs.get(self.txn_id) != self.epoch

    def _require_open(self, call: str) -> _Txn:
        if self._fenced():
            raise _error(
                KafkaError._FENCED,
                f"{call}: producer fenced by a newer epoch",
                fatal=True,
            )
        txn = self.txn
        if txn is None:
            raise _error(KafkaError._STATE, f"{call}: no transaction in progress")
        if txn.state != "open":
            raise _error(
                KafkaError.INVALID_PRODUCER_EPOCH,
                f"{call}: the transaction was aborted (timed out)",
                txn_requires_abort=True,
            )
        return txn

    def init_transactions(self, timeout: float | None = None) -> None:
        self._check("init_transactions")
        if self.txn_id is None:
            raise _error(KafkaError._NOT_CONFIGURED, "no transactional.id")
        with self.log.lock:
            previous = self.log.open.get(self.txn_id)
            if previous is not None:
                self.log.end_transaction(previous, "aborted")
            self.epoch = self.log.epochs.get(self.txn_id, -1) + 1
            self.log.epochs[self.txn_id] = self.epoch

    def begin_transaction(self) -> None:
        self._check("begin_transaction")
        with self.log.lock:
            if self._fenced() or self.epoch is None:
                raise _error(KafkaError._FENCED, "begin_transaction: fenced", fatal=True)
            if self.txn is not None and self.txn.state == "open":
                raise _error(KafkaError._STATE, "a transaction is already in progress")
            assert self.txn_id is not None
            self.txn = _Txn(self.txn_id, self.epoch, self.log.clock.monotonic(), self.timeout_s)
            self.log.open[self.txn_id] = self.txn

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Callable[..., None] | None = None,
        timestamp: int = 0,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        callback: Callable[..., None] | None = None,
    ) -> None:
        self._check("produce")
        with self.log.lock:
            self.log.expire()
            txn = self._require_open("produce") if self.txn_id is not None else None
            parts = self.log.topics.get(topic)
            if parts is None:
                raise _error(KafkaError._UNKNOWN_TOPIC, f"no topic {topic}")
            if partition < 0:
                partition = partition_for((key or b"").decode(), len(parts))
            now_ms = int(self.log.clock.time() * 1000)
            kind = (
                TIMESTAMP_LOG_APPEND_TIME
                if topic in self.log.log_append_time
                else TIMESTAMP_CREATE_TIME
            )
            stamp = now_ms if kind == TIMESTAMP_LOG_APPEND_TIME or not timestamp else timestamp
            encoded = None
            if headers is not None:
                encoded = [(k, v.encode() if isinstance(v, str) else v) for k, v in headers]
            record = _Record(key, value, encoded, (kind, stamp), txn)
            parts[partition].append(record)
            self.log.changed.notify_all()
            report = on_delivery or callback
            if report is not None:
                self.pending.append(
                    (report, _message(topic, partition, len(parts[partition]) - 1, record))
                )

    def poll(self, timeout: float | None = None) -> int:
        self._check("poll")
        served, self.pending = self.pending, []
        for report, message in served:
            report(None, message)
        return len(served)

    def flush(self, timeout: float | None = None) -> int:
        self.poll(0)
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Drop what is not delivered yet: each delivery report says it was purged."""
        self._check("purge")
        purged, self.pending = self.pending, []
        for report, message in purged:
            report(KafkaError(KafkaError._PURGE_QUEUE), message)

    def __len__(self) -> int:
        return len(self.pending)

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], metadata: GroupMetadata, timeout: float | None = None
    ) -> None:
        self._check("send_offsets_to_transaction")
        with self.log.lock:
            self.log.expire()
            txn = self._require_open("send_offsets_to_transaction")
            group = self.log.groups.get(metadata.group)
            member = None if group is None else group.members.get(metadata.member)
            if group is None or member is None or metadata.generation != group.generation:
                raise _error(
                    KafkaError.ILLEGAL_GENERATION,
                    f"generation {metadata.generation} of {metadata.member} is not current",
                    txn_requires_abort=True,
                )
            offsets = txn.offsets.setdefault(metadata.group, {})
            offsets.update({(tp.topic, tp.partition): tp.offset for tp in positions})

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._check("commit_transaction")
        with self.log.lock:
            self.log.expire()
            txn = self._require_open("commit_transaction")
            self.log.end_transaction(txn, "committed")
        self.poll(0)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._check("abort_transaction")
        with self.log.lock:
            if self._fenced():
                raise _error(KafkaError._FENCED, "abort_transaction: fenced", fatal=True)
            if self.txn is not None:
                self.log.end_transaction(self.txn, "aborted")
        self.pending.clear()
