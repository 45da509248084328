"""Kafka client configuration shared by every cronlog process.

One partitioner everywhere: `murmur2_random` is the Java client's (and aiokafka's, so
Faust's) partitioner. librdkafka's default (CRC32) would put a job's records on another
partition than Faust's ingress does, and the ledger relies on every record of a job, and
its state, living in the same partition number of each topic.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from streams.settings import Settings

log = logging.getLogger("cronlog.kafka")

PARTITIONER = "murmur2_random"

# Failover in seconds (design.md section 4, point 8): a member silent for the session
# timeout loses its partitions. 6 s tolerates a few missed 1.5 s heartbeats (GC pauses,
# a saturated 2-core machine) while moving partitions of a killed node in ~6-8 s. The
# broker's group.min.session.timeout.ms (2 s in the local stack) allows it.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1500
# Short: a dead ledger's open transaction blocks every read_committed reader of the
# partitions it wrote (the new owner's restore, dispatchers, workers' inboxes) until the
# broker aborts it after this long. About the session timeout, so the abort overlaps the
# rebalance. The ledger bounds the work of one transaction well below it (its budget,
# streams/ledger.py); a transaction that still takes longer is aborted and redone.
TRANSACTION_TIMEOUT_MS = 7000


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": settings.kafka,
        "partitioner": PARTITIONER,
        # Idempotence implies acks=all; said explicitly because a replicated cluster's
        # guarantee rests on it: a record is acknowledged only once every in-sync replica
        # (at least min.insync.replicas of them) has it.
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": "lz4",
        **extra,
    }


def transactional_producer_config(settings: Settings, transactional_id: str) -> dict[str, Any]:
    return producer_config(
        settings,
        **{
            "transactional.id": transactional_id,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        },
    )


def consumer_config(settings: Settings, group: str | None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": settings.kafka,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        # Range assignment gives one member partition p of every topic it subscribes to
        # (all cronlog topics have the same count): the co-partitioning the scheduler needs.
        "partition.assignment.strategy": "range",
        **extra,
    }
    if group is not None:
        config["group.id"] = group
    else:
        config["group.id"] = "cronlog-unused"  # librdkafka needs one even for assign()
    return config


def committed_or(
    consumer: Consumer,
    partitions: list[TopicPartition],
    default: int = OFFSET_BEGINNING,
    stop: threading.Event | None = None,
) -> list[TopicPartition]:
    """`partitions` at the consumer group's committed offsets (`default` where none is),
    asked for explicitly and retried until the group coordinator answers.

    Why not `assign()` without offsets and let librdkafka look them up: if that lookup
    gets a request-level NOT_COORDINATOR (the group coordinator still moving or loading,
    as on a freshly started broker) librdkafka never retries it and never starts fetching
    the partition, silently (confluentinc/librdkafka#5586). A worker whose inbox stalls
    that way heartbeats forever and never runs anything.
    """
    while stop is None or not stop.is_set():
        try:
            found = consumer.committed(partitions, timeout=5)
        except KafkaException as exc:
            log.warning("committed offsets not available yet (%s); retrying", exc)
            time.sleep(0.5)
            continue
        if all(tp.error is None for tp in found):
            return [
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else default)
                for tp in found
            ]
        log.warning("committed offsets not available yet (%s); retrying", found[0].error)
        time.sleep(0.5)
    return [TopicPartition(tp.topic, tp.partition, default) for tp in partitions]
