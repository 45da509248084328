"""Produce/consume round trips on the real broker with both client libraries cronlog uses:
confluent-kafka (the ledger, CLI, projector) and aiokafka (under Faust)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Producer

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
