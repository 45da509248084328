"""`cronlog topics create` on the real broker: every contract topic, with its configs;
idempotent; a partition-count mismatch refused with a clear error."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
)

from streams.settings import Settings
from streams.topics import CATALOGUE, TopicError, delete_topics, ensure_topics
from tests.support.nodes import topics_create
from tests.support.waiting import eventually


def test_cli_creates_every_topic_then_finds_them(settings: Settings) -> None:
    first = topics_create(settings)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created ") == len(CATALOGUE)
    second = topics_create(settings)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("exists ") == len(CATALOGUE)
    assert "created" not in second.stdout

    admin = AdminClient({"bootstrap.servers": settings.kafka})
    metadata = admin.list_topics(timeout=10).topics
    for spec in CATALOGUE:
        assert len(metadata[settings.topic(spec.name)].partitions) == settings.partitions

    resources = [ConfigResource("topic", settings.topic(n)) for n in ("jobs", "run-events")]
    described = {r.name: f.result(10) for r, f in admin.describe_configs(resources).items()}
    assert described[settings.topic("jobs")]["cleanup.policy"].value == "compact"
    assert described[settings.topic("run-events")]["retention.ms"].value == "-1"
    assert described[settings.topic("run-events")]["cleanup.policy"].value == "delete"


def test_a_different_partition_count_is_refused(settings: Settings) -> None:
    ensure_topics(settings)
    other = settings.with_(partitions=settings.partitions + 1)
    with pytest.raises(TopicError, match="fixed at creation"):
        ensure_topics(other)
    result = topics_create(other)
    assert result.returncode == 1
    assert f"CRONLOG_PARTITIONS is {other.partitions}" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_broker_is_a_clear_error(settings: Settings) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "topics", "create", "--timeout", "3"],
        env={**os.environ, "CRONLOG_KAFKA": "127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "cannot reach Kafka at 127.0.0.1:1" in result.stderr


def test_topics_made_with_create_time_are_moved_to_broker_time(settings: Settings) -> None:
    """A job-log made by an older cronlog (CreateTime) gets LogAppendTime: afterwards a
    producer that stamps a record a year back cannot put its clock into the ledger."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition
    from confluent_kafka.cimpl import NewTopic

    settings = dataclasses.replace(settings, topic_prefix=f"{settings.topic_prefix}old.")
    admin = AdminClient({"bootstrap.servers": settings.kafka})
    name = settings.topic("job-log")
    created = admin.create_topics(
        [NewTopic(name, num_partitions=settings.partitions, replication_factor=-1)]
    )
    created[name].result(timeout=30)
    ensure_topics(settings)

    producer = Producer({"bootstrap.servers": settings.kafka})
    a_year_ago = int(time.time() * 1000) - 365 * 24 * 3600 * 1000
    producer.produce(name, key=b"k", value=b"v", partition=0, timestamp=a_year_ago)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka,
            "group.id": f"{name}-probe",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(name, 0, 0)])
    try:
        (msg,) = eventually(
            lambda: consumer.consume(1, timeout=1.0), "the record read back", 30, interval_s=0
        )
        assert msg.error() is None
        kind, stamp = msg.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME
        assert abs(stamp - time.time() * 1000) < 60_000, stamp
    finally:
        consumer.close()
        delete_topics(settings)
