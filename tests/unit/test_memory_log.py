"""The in-memory Kafka (streams/memory.py) keeps what the ledger's guarantees rest on:
read_committed, transactional offsets, fencing by epoch and by group generation,
require_stable, session timeouts. Each test states one of them."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from streams.core.clock import ManualClock
from streams.kafka import consumer_config, producer_config, transactional_producer_config
from streams.memory import MemoryClients
from streams.memory_consumer import MemoryConsumer
from streams.memory_log import MemoryLog
from streams.memory_producer import MemoryProducer
from streams.settings import Settings

SETTINGS = Settings(partitions=2)


@pytest.fixture
def log() -> MemoryLog:
    log = MemoryLog(ManualClock())
    log.create_topic("in", 2)
    log.create_topic("out", 2)
    log.create_topic("stamped", 1, broker_time=True)
    return log


def _producer(log: MemoryLog, txn_id: str | None = None) -> MemoryProducer:
    clients = MemoryClients(log)
    if txn_id is None:
        return clients.producer(producer_config(SETTINGS))  # type: ignore[no-any-return]
    producer = clients.producer(transactional_producer_config(SETTINGS, txn_id))
    producer.init_transactions()
    return producer  # type: ignore[no-any-return]


def _reader(log: MemoryLog, topic: str, committed: bool = True) -> MemoryConsumer:
    level = "read_committed" if committed else "read_uncommitted"
    reader = MemoryClients(log).consumer(
        consumer_config(SETTINGS, None, **{"isolation.level": level})
    )
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(2)])
    return reader  # type: ignore[no-any-return]


def _values(consumer: MemoryConsumer) -> list[bytes | None]:
    return [m.value() for m in consumer.consume(100, timeout=0) if m.error() is None]


def _member(log: MemoryLog, group: str = "g") -> MemoryConsumer:
    consumer: MemoryConsumer = MemoryClients(log).consumer(consumer_config(SETTINGS, group))
    consumer.subscribe(["in"])
    consumer.consume(1, timeout=0)  # joins: the assignment is served in consume
    return consumer


def test_read_committed_stops_at_an_open_transaction_and_skips_an_aborted_one(
    log: MemoryLog,
) -> None:
    producer = _producer(log, "t")
    plain = _producer(log)
    producer.begin_transaction()
    producer.produce("out", b"a", partition=0)
    plain.produce("out", b"after", partition=0)
    assert _values(_reader(log, "out")) == []  # the open transaction holds the partition
    assert _values(_reader(log, "out", committed=False)) == [b"a", b"after"]
    producer.abort_transaction()
    assert _values(_reader(log, "out")) == [b"after"]
    producer.begin_transaction()
    producer.produce("out", b"b", partition=0)
    producer.commit_transaction()
    assert _values(_reader(log, "out")) == [b"after", b"b"]


def test_an_open_transaction_is_aborted_after_its_timeout(log: MemoryLog) -> None:
    producer = _producer(log, "t")
    producer.begin_transaction()
    producer.produce("out", b"a", partition=0)
    assert isinstance(log.clock, ManualClock)
    log.clock.advance(7.0)  # transactional_producer_config's transaction.timeout.ms
    assert _values(_reader(log, "out")) == []
    with pytest.raises(KafkaException) as failed:
        producer.commit_transaction()
    assert failed.value.args[0].txn_requires_abort()


def test_init_transactions_fences_the_older_producer_of_the_same_id(log: MemoryLog) -> None:
    old = _producer(log, "node-1")
    old.begin_transaction()
    old.produce("out", b"zombie", partition=0)
    new = _producer(log, "node-1")  # a restarted node: its predecessor's work is aborted
    assert _values(_reader(log, "out", committed=False)) == [b"zombie"]
    assert _values(_reader(log, "out")) == []  # aborted at once, not after a timeout
    with pytest.raises(KafkaException) as fenced:
        old.commit_transaction()
    assert fenced.value.args[0].fatal()
    new.begin_transaction()
    new.produce("out", b"successor", partition=0)
    new.commit_transaction()
    assert _values(_reader(log, "out")) == [b"successor"]


def test_offsets_commit_with_their_transaction_and_a_stale_generation_is_refused(
    log: MemoryLog,
) -> None:
    member = _member(log)
    assert [tp.partition for tp in member.assignment()] == [0, 1]
    producer = _producer(log, "t")
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [TopicPartition("in", 0, 5)], member.consumer_group_metadata()
    )
    producer.abort_transaction()
    assert member.committed([TopicPartition("in", 0)])[0].offset < 0  # none committed
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [TopicPartition("in", 0, 5)], member.consumer_group_metadata()
    )
    producer.commit_transaction()
    assert member.committed([TopicPartition("in", 0)])[0].offset == 5
    # A second member joins: the group's generation moves on, and the first member's
    # metadata (taken before it heard of it) no longer commits anything.
    stale = member.consumer_group_metadata()
    _member(log)
    producer.begin_transaction()
    with pytest.raises(KafkaException) as refused:
        producer.send_offsets_to_transaction([TopicPartition("in", 0, 9)], stale)
    assert refused.value.args[0].code() == KafkaError.ILLEGAL_GENERATION
    producer.abort_transaction()
    assert member.committed([TopicPartition("in", 0)])[0].offset == 5


def test_the_range_assignor_and_the_rebalance_callbacks(log: MemoryLog) -> None:
    seen: list[tuple[str, list[int]]] = []
    first: MemoryConsumer = MemoryClients(log).consumer(consumer_config(SETTINGS, "g"))

    def on_assign(consumer: MemoryConsumer, tps: list[TopicPartition]) -> None:
        seen.append(("assign", [tp.partition for tp in tps]))
        consumer.incremental_assign(tps)

    def on_revoke(consumer: MemoryConsumer, tps: list[TopicPartition]) -> None:
        seen.append(("revoke", [tp.partition for tp in tps]))

    first.subscribe(["in"], on_assign=on_assign, on_revoke=on_revoke)
    first.consume(1, timeout=0)
    second = _member(log)
    first.consume(1, timeout=0)
    assert seen == [("assign", [0, 1]), ("revoke", [0, 1]), ("assign", [0])]
    assert [tp.partition for tp in second.assignment()] == [1]
    second.close()  # a clean leave: the partition comes back at once
    first.consume(1, timeout=0)
    assert seen[-1] == ("assign", [0, 1])


def test_an_eager_assign_in_a_group_callback_is_refused(log: MemoryLog) -> None:
    # The groups' KIP-848 protocol is incremental, as librdkafka enforces: a loop whose
    # callback assigns eagerly fails here, not only against a real broker.
    consumer: MemoryConsumer = MemoryClients(log).consumer(consumer_config(SETTINGS, "g"))
    consumer.subscribe(["in"], on_assign=lambda c, tps: c.assign(tps))
    with pytest.raises(KafkaException) as refused:
        consumer.consume(1, timeout=0)
    assert "incremental_assign" in str(refused.value)


def test_a_silent_member_loses_its_partitions_after_its_session(log: MemoryLog) -> None:
    silent = _member(log)
    alive = _member(log)
    assert isinstance(log.clock, ManualClock)
    for _ in range(4):  # 8 s, past the 6 s session: only `alive` keeps polling
        log.clock.advance(2.0)
        alive.consume(1, timeout=0)
    assert [tp.partition for tp in alive.assignment()] == [0, 1]
    assert len(log.groups["g"].members) == 1
    silent.consume(1, timeout=0)  # back: it rejoins, and the group splits again
    alive.consume(1, timeout=0)
    assert [tp.partition for tp in silent.assignment()] == [1]


def test_committed_waits_for_a_transaction_holding_offsets(log: MemoryLog) -> None:
    """require_stable: while a transaction holds offsets for the partition the answer
    waits; here nothing commits it, so it is aborted at its timeout and the old offset
    stands."""
    member = _member(log)
    producer = _producer(log, "t")
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [TopicPartition("in", 1, 3)], member.consumer_group_metadata()
    )
    assert isinstance(log.clock, ManualClock)
    before = log.clock.monotonic()
    with pytest.raises(KafkaException):
        member.committed([TopicPartition("in", 1)], timeout=2)
    found = member.committed([TopicPartition("in", 1)], timeout=10)
    assert found[0].offset < 0
    assert log.clock.monotonic() - before >= 7.0  # waited out the transaction timeout


def test_broker_time_stamps_and_the_end_of_a_partition(log: MemoryLog) -> None:
    plain = _producer(log)
    plain.produce("stamped", b"x", partition=0)
    reader: MemoryConsumer = MemoryClients(log).consumer(
        consumer_config(SETTINGS, None, **{"enable.partition.eof": True})
    )
    reader.assign([TopicPartition("stamped", 0, OFFSET_BEGINNING)])
    first, end = reader.consume(10, timeout=0)
    assert first.timestamp() == (2, int(log.clock.time() * 1000))  # LogAppendTime
    error = end.error()
    assert error is not None
    assert error.code() == KafkaError._PARTITION_EOF
    assert reader.consume(10, timeout=0) == []  # the end is told once
