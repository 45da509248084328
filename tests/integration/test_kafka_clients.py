"""cronlog's own helpers over confluent-kafka, on the real broker: where a reader that
assigns partitions itself starts (streams.kafka.committed_or). (Round trips that only
exercised confluent-kafka and aiokafka themselves are gone: the integration tests of
every loop cover what cronlog relies on, per-key order above all.)"""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer, TopicPartition

from streams.kafka import committed_or, consumer_config
from streams.settings import Settings
from tests.support.kafka import drain

pytestmark = pytest.mark.integration


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
