"""The audit reads each partition's offsets again while its leader is moving (a topic just
made, a broker restarted), and fails with the broker's error otherwise (on the in-memory
Kafka, streams/memory.py)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.audit.replay import AuditError, _ranges
from streams.core.clock import ManualClock
from streams.kafka import consumer_config
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=2)


def _consumer(refusals: list[int]) -> tuple[object, str]:
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)

    def leader_moving(call: str, client: object) -> None:
        if call == "get_watermark_offsets" and refusals:
            raise KafkaException(KafkaError(refusals.pop(), "Broker: Not leader for partition"))

    log.faults.append(leader_moving)
    consumer = MemoryClients(log).consumer(consumer_config(SETTINGS, "audit-test"))
    return consumer, SETTINGS.topic("run-events")


def test_a_moving_leader_is_asked_again() -> None:
    refusals = [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE]
    consumer, topic = _consumer(refusals)
    assert _ranges(consumer, topic, None, None, 5.0) == {0: (0, 0), 1: (0, 0)}
    assert refusals == []


def test_another_error_fails_the_audit_at_once() -> None:
    consumer, topic = _consumer([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(AuditError, match="cannot read the offsets"):
        _ranges(consumer, topic, None, None, 5.0)


def test_a_leader_that_never_comes_fails_the_audit_after_its_timeout() -> None:
    consumer, topic = _consumer([KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    with pytest.raises(AuditError, match="Not leader"):
        _ranges(consumer, topic, None, None, 1.0)
