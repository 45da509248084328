"""cronlog's own helpers over confluent-kafka, on the real broker: where a reader that
assigns partitions itself starts (streams.kafka.committed_or), and the stuck-group watch
on a broker that answers. (Round trips that only
exercised confluent-kafka and aiokafka themselves are gone: the integration tests of
every loop cover what cronlog relies on, per-key order above all.)"""

from __future__ import annotations

import json
import time

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer, TopicPartition

from streams.kafka import GroupWatch, committed_or, consumer_config
from streams.settings import Settings
from tests.support.kafka import drain
from tests.support.services import Services


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
        got = drain(second, 2, to_end=True)
        assert [m.value() for m in got] == [b"m3", b"m4"]
        start = committed_or(second, [TopicPartition(topic, 1)], default=OFFSET_END)
        assert [tp.offset for tp in start] == [OFFSET_END]
    finally:
        second.close()


def _stats(state: str, join_state: str) -> str:
    return json.dumps({"cgrp": {"state": state, "join_state": join_state}})


def test_group_watch_flags_a_stuck_group_when_the_broker_answers(services: Services) -> None:
    watch = GroupWatch(
        Settings(kafka=services.kafka), "scheduler x", stuck_after_s=0.5, check_every_s=0.1
    )
    watch.config()["stats_cb"](_stats("query-coord", "init"))
    time.sleep(3)  # out of the group all along, but nobody watched: counts from now
    assert not watch.stuck()
    time.sleep(0.15)
    assert not watch.stuck()  # the broker answers, but the consumer gets time to rejoin
    time.sleep(0.5)
    assert watch.stuck()
    assert watch.since is None  # replaced: a fresh start for the new consumer
