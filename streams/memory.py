"""An in-memory Kafka: the loops run against it unchanged (``clients=MemoryClients(log)``),
in unit tests and in the seeded simulation, with no broker and no sleeps.

What it keeps of Kafka, because the ledger's guarantees rest on it (streams/ledger.py):
 - Partitioned, append-only logs with offsets; a topic of the catalogue with
   LogAppendTime gets the log's clock as each record's stamp.
 - Transactions: a transactional producer's records are in the log at once but a
   read_committed reader stops at the first record of an open transaction (the last
   stable offset) and skips aborted ones; the consumed offsets a transaction carries
   (`send_offsets_to_transaction`) are committed with it or not at all. An open
   transaction is aborted when it outlives `transaction.timeout.ms` on the clock.
 - Fencing: `init_transactions` under a transactional.id bumps its epoch and aborts that
   id's open transaction; the older producer can then neither produce into nor commit
   any transaction. Offsets sent with a group generation that is no longer current
   (the member was rebalanced away: a zombie) are refused, as the broker refuses a
   TxnOffsetCommit of a stale generation (KIP-447).
 - Consumer groups with the range assignor: a join, a leave, or a member silent for
   `session.timeout.ms` starts a new generation; each member learns of it at its next
   `consume` (its revoke and assign callbacks run there), so until then it still
   believes it owns its old partitions, as a paused member does.
 - `committed()` with require_stable: while a transaction holds offsets for a
   partition the answer waits for it (and fails after its timeout).

What it leaves out: replication, compaction (readers take the newest value per key
anyway), quotas, retention, record batches and control records (offsets of a
partition are consecutive), and the network: a call either happens or raises.

Time. Every timeout is read on the log's clock. With a `ManualClock` a call that would
wait moves the clock forward instead (a `consume` that finds nothing "waits" its
timeout), so a test drives time by calling the loops, and a run is reproducible; with
the system clock it waits for real on a condition (threads may share one log).

Faults. `MemoryLog.faults` are called before every client call with (call, client): a
test may raise from one (a crash at that point: the client is left as it is, like a
process killed there) or act in between (let another node take partitions over while a
transaction is about to commit).

Where each part is: the cluster (`MemoryLog`: logs, transactions, groups) in
streams/memory_log.py, the consumer in streams/memory_consumer.py, the producer in
streams/memory_producer.py; the admin and the `Clients` that hands them out here.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from streams.kafka import Clients
from streams.memory_consumer import MemoryConsumer
from streams.memory_log import ClusterMetadata, MemoryLog, _Group
from streams.memory_producer import MemoryProducer


class MemoryAdmin:
    """The admin calls the loops make: the topics there are (and making one)."""

    def __init__(self, log: MemoryLog, config: dict[str, Any]):
        self.log = log

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        self.log.fault("list_topics", self)
        return self.log.metadata()

    def describe_consumer_groups(
        self, group_ids: list[str], request_timeout: float = -1
    ) -> dict[str, Future[GroupDescription]]:
        """Each group's live members (client.id and host), as futures like the real one."""
        self.log.fault("describe_consumer_groups", self)
        out: dict[str, Future[GroupDescription]] = {}
        with self.log.lock:
            self.log.expire()
            for group_id in group_ids:
                group = self.log.groups.get(group_id, _Group())
                members = [
                    MemberDescription(m.consumer.client_id, "memory")
                    for m in group.members.values()
                ]
                future: Future[GroupDescription] = Future()
                future.set_result(GroupDescription(group_id, members))
                out[group_id] = future
        return out


@dataclass(frozen=True, slots=True)
class MemberDescription:
    client_id: str
    host: str


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    members: list[MemberDescription]


class MemoryClients(Clients):
    """`Clients` over one `MemoryLog`: what a loop builds talks to it."""

    __slots__ = ("log",)

    def __init__(self, log: MemoryLog):
        self.log = log

    def consumer(self, config: dict[str, Any]) -> Any:
        return MemoryConsumer(self.log, config)

    def producer(self, config: dict[str, Any]) -> Any:
        return MemoryProducer(self.log, config)

    def admin(self, config: dict[str, Any]) -> Any:
        return MemoryAdmin(self.log, config)

    def offsets_reader(self, config: dict[str, Any]) -> Any:
        return MemoryOffsetsReader(MemoryConsumer(self.log, config))


class MemoryOffsetsReader:
    """`OffsetsReader` on the in-memory log: answered at once (no thread: a run stays
    reproducible)."""

    def __init__(self, consumer: MemoryConsumer) -> None:
        self.consumer = consumer

    def committed(self, partitions: list[TopicPartition]) -> Future[list[TopicPartition]]:
        future: Future[list[TopicPartition]] = Future()
        try:
            future.set_result(self.consumer.committed(partitions, 0.0))
        except Exception as exc:  # noqa: BLE001 - as the real reader's future would hold it
            future.set_exception(exc)
        return future

    def close(self) -> None:
        self.consumer.close()
