"""A worker holding a large burst still heartbeats (real broker).

A heartbeat lists every attempt its worker holds: a worker that claimed 50,000 runs of a
burst ahead sends a ~2 MB beat. With the broker's 1 MB default the beat was refused at
`produce`, the heartbeat thread died, the lease lapsed and the failure detector declared
the worker dead: every claimed run went back to `due` and the burst never started.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]
from confluent_kafka.cimpl import NewTopic

from connectors.worker.heartbeat import Heartbeat
from connectors.worker.worker import HEARTBEAT_PRODUCER
from schemas.codec import HEARTBEAT
from schemas.records import Heartbeat as Beat
from streams.core.placement import Capacity
from streams.kafka import consumer_config, producer_config
from streams.settings import Settings
from streams.topics import HEARTBEAT_MAX_BYTES, delete_topics, ensure_topics

HELD = 60_000


def test_a_beat_listing_sixty_thousand_attempts_is_acknowledged(
    settings: Settings, tmp_path: Path
) -> None:
    # A heartbeats topic made by an older cronlog, with the broker's default record limit:
    # ensure_topics raises it.
    settings = dataclasses.replace(settings, topic_prefix=f"{settings.topic_prefix}beat.")
    topic = settings.topic("heartbeats")
    admin = AdminClient({"bootstrap.servers": settings.kafka})
    made = admin.create_topics(
        [NewTopic(topic, num_partitions=settings.partitions, replication_factor=-1)]
    )
    made[topic].result(timeout=30)
    try:
        ensure_topics(settings)
        resource = ConfigResource("topic", topic)
        found = admin.describe_configs([resource])[resource].result(timeout=30)
        assert found["max.message.bytes"].value == str(HEARTBEAT_MAX_BYTES)

        held = tuple((f"burst-{i:06d}@2026-12-03T15:22:12Z", 1) for i in range(HELD))
        assert len(HEARTBEAT.encode(_beat(held))) > 1_048_576  # beyond the old limit
        lease = tmp_path / "lease"
        beat = Heartbeat(
            Producer(producer_config(settings, **HEARTBEAT_PRODUCER)),  # the worker's
            topic,
            "big-worker",
            Capacity(1000, 1000, 0),
            (),
            heartbeat_s=10.0,
            lease_s=7.0,
            view=lambda: (Capacity(1000, 1000, 0), held),
            lease_file=lambda: lease,
            stop=threading.Event(),
        )
        assert beat.beat(), "the beat was not acknowledged"
        assert lease.exists()  # so the lease was renewed

        consumer = Consumer(consumer_config(settings, None))
        try:
            consumer.assign(
                [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(settings.partitions)]
            )
            got: list[Beat] = []
            for _ in range(60):
                got += [
                    HEARTBEAT.decode(m.value() or b"")
                    for m in consumer.consume(10, timeout=1.0)
                    if m.error() is None
                ]
                if got:
                    break
            assert [len(b.running) for b in got] == [HELD]
        finally:
            consumer.close()
    finally:
        delete_topics(settings)


def _beat(held: tuple[tuple[str, int], ...]) -> Beat:
    from schemas.records import RunningAttempt, WorkerCapacity

    capacity = WorkerCapacity(1000, 1000, 0)
    return Beat("w", 0, capacity, capacity, (), tuple(RunningAttempt(r, a) for r, a in held))
