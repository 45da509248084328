"""Produce/consume round trips on the real broker with both client libraries cronlog uses:
confluent-kafka (the ledger, CLI, projector) and aiokafka (under Faust)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer, TopicPartition

from streams.kafka import committed_or, consumer_config
from streams.settings import Settings
from tests.support.kafka import consumer, drain

pytestmark = pytest.mark.integration


def _records(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"job-{i % 7}".encode(), f"value-{i}".encode()) for i in range(n)]


def test_confluent_round_trip_keeps_per_key_order_and_headers(topics: Settings) -> None:
    producer = Producer({"bootstrap.servers": topics.kafka, "enable.idempotence": True})
    sent = _records(200)
    for key, value in sent:
        producer.produce(
            topics.topic("commands"), key=key, value=value, headers=[("origin", b"test")]
        )
    assert producer.flush(30) == 0

    c = consumer(topics, "commands")
    try:
        got = drain(c, len(sent), settle_s=1.0)
    finally:
        c.close()
    assert len(got) == len(sent)
    assert all(m.headers() == [("origin", b"test")] for m in got)
    # Kafka orders per partition, and a key always maps to one partition: per-key order
    # is what the ledger relies on.
    for key in {k for k, _ in sent}:
        assert [m.value() for m in got if m.key() == key] == [v for k, v in sent if k == key]
    assert len({m.partition() for m in got}) > 1  # keys really spread over partitions


def test_aiokafka_round_trip_and_confluent_reads_what_it_wrote(topics: Settings) -> None:
    sent = _records(50)

    async def produce_and_consume() -> list[tuple[bytes | None, bytes | None]]:
        producer = AIOKafkaProducer(bootstrap_servers=topics.kafka, acks="all")
        await producer.start()
        try:
            for key, value in sent:
                await producer.send_and_wait(topics.topic("run-logs"), value=value, key=key)
        finally:
            await producer.stop()
        consumer_ = AIOKafkaConsumer(
            topics.topic("run-logs"),
            bootstrap_servers=topics.kafka,
            group_id=topics.group("aiokafka-probe"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer_.start()
        got: list[tuple[bytes | None, bytes | None]] = []
        try:
            async with asyncio.timeout(30):
                while len(got) < len(sent):
                    batch = await consumer_.getmany(timeout_ms=500)
                    for records in batch.values():
                        got.extend((r.key, r.value) for r in records)
        finally:
            await consumer_.stop()
        return got

    got = asyncio.run(produce_and_consume())
    assert sorted(got) == sorted(sent)

    c = consumer(topics, "run-logs")
    try:
        seen = drain(c, len(sent), settle_s=0.5)
    finally:
        c.close()
    assert sorted((m.key(), m.value()) for m in seen) == sorted(sent)


def test_committed_or_starts_where_the_group_committed_else_at_the_default(
    topics: Settings,
) -> None:
    """The worker's inbox start: the group's committed offset, or the default where the
    group never committed, asked for explicitly (see streams.kafka.committed_or)."""
    topic = topics.topic("worker-inbox")
    producer = Producer({"bootstrap.servers": topics.kafka})
    for i in range(5):
        producer.produce(topic, value=f"m{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    group = topics.group("committed-or")
    first = Consumer(consumer_config(topics, group))
    try:
        partitions = [TopicPartition(topic, p) for p in range(topics.partitions)]
        start = committed_or(first, partitions)
        assert [tp.offset for tp in start] == [OFFSET_BEGINNING] * topics.partitions
        first.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    finally:
        first.close()
    second = Consumer(consumer_config(topics, group))
    try:
        start = committed_or(second, [TopicPartition(topic, 0)], default=OFFSET_END)
        assert [(tp.partition, tp.offset) for tp in start] == [(0, 3)]
        second.assign(start)
        got = drain(second, 2, settle_s=1.0)
        assert [m.value() for m in got] == [b"m3", b"m4"]
        start = committed_or(second, [TopicPartition(topic, 1)], default=OFFSET_END)
        assert [tp.offset for tp in start] == [OFFSET_END]
    finally:
        second.close()
