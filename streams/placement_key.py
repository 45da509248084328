"""The nodes' placement key, agreed on through the `node-keys` topic.

Every node's dispatcher seals the assignments it sends and every node's ledger checks
the seals of claims (streams/core/seals.py), so all nodes of a deployment need the same
key, and nobody should have to configure it. It is the first record of partition 0 of
`node-keys`: a node that finds the partition empty writes a fresh random key there and
reads the partition again from the start. Nodes racing to write each take the first
record the broker appended, so they agree; later records are never used. Each record is
keyed by its writer's random id, so compaction keeps every one, the first included.

Only node principals (and the admin) may read or write `node-keys`
(connectors/stack/acls.py): a worker that cannot read the key cannot seal a placement
for itself. The key never leaves the nodes: not in logs, metrics or any other topic.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from streams.core.seals import KEY_BYTES
from streams.kafka import KAFKA_CLIENTS, Clients, consumer_config, producer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.keys")
TOPIC = "node-keys"


def placement_key(
    settings: Settings,
    stop: threading.Event | None = None,
    clients: Clients = KAFKA_CLIENTS,
) -> bytes:
    """The deployment's placement key, written first if there is none yet. Waits for the
    broker as long as it takes (a node starting during an outage just starts later),
    unless `stop` is set meanwhile (then KeyError)."""
    failures = 0
    while True:
        try:
            found = _first_key(settings, clients)
            if found is None:
                _offer_key(settings, clients)
                found = _first_key(settings, clients)
            if found is not None:
                return found
        except KafkaException as exc:
            failures += 1
            if failures == 1 or failures % 10 == 0:
                log.warning("cannot read the placement key yet (%s); retrying", exc)
        if stop is not None and stop.wait(1.0):
            raise KeyError("stopped before the placement key was read")
        if stop is None:
            time.sleep(1.0)


def _first_key(settings: Settings, clients: Clients) -> bytes | None:
    """The first well-formed record of partition 0, or None if there is none."""
    topic = settings.topic(TOPIC)
    consumer = clients.consumer(consumer_config(settings, None))
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high <= low:
            return None
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            value = msg.value() or b""
            if len(value) == KEY_BYTES:
                return value
            log.warning("node-keys offset %d is not a key; skipped", msg.offset())
            if (msg.offset() or 0) + 1 >= high:
                return None
        raise KafkaException(f"could not read {topic} up to offset {high} in 30 s")
    finally:
        consumer.close()


def _offer_key(settings: Settings, clients: Clients) -> None:
    producer = clients.producer(producer_config(settings))
    producer.produce(
        settings.topic(TOPIC),
        key=secrets.token_hex(8).encode(),
        value=secrets.token_bytes(KEY_BYTES),
        partition=0,
    )
    if producer.flush(30):
        raise KafkaException("could not write a placement key in 30 s")
