"""cronlog's run events from your own code: `from connectors.events import read_events`.

Every transition of every run, and every job change, as typed records
(`schemas.records.RunEvent`, `JobEvent`), decoded from `run-events` with the codec
`cronlog audit` uses (`schemas.codec.RUN_EVENTS`: Avro single-object encoding, every
schema version ever shipped readable). It needs read access to the topic, as a stream
app of the user's would have; the REST API's `Client.events` gives one run's events with
a token only.

    for event in read_events(Settings.from_env(), since_ms=iso_ms("2026-12-01T00:00:00Z")):
        if isinstance(event, RunEvent) and event.state == "failed":
            ...

It joins no consumer group and commits nothing: every partition is read from the first
record at or after `since_ms` (its broker timestamp) to the end, `read_committed` (only
what the ledger committed), or on for ever with `follow`. Events of one run are in
order (one partition per job); across partitions they interleave.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from schemas.codec import RUN_EVENTS, CodecError
from schemas.records import JobEvent, RunEvent
from streams.kafka import connection_config
from streams.settings import Settings


def _consumer(settings: Settings) -> Any:
    return Consumer(
        {
            **connection_config(settings),
            "group.id": f"cronlog-events-{uuid.uuid4().hex}",  # never joined: assign only
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )


def read_events(
    settings: Settings,
    *,
    since_ms: int | None = None,
    job_id: str | None = None,
    follow: bool = False,
    poll_s: float = 0.5,
) -> Iterator[RunEvent | JobEvent]:
    """run-events from `since_ms` on (all of it when None), of one job or all, until the
    end of every partition (or on for ever with `follow`). A record that cannot be
    decoded (not cronlog's) is passed over."""
    consumer = _consumer(settings)
    topic = settings.topic("run-events")
    try:
        meta = consumer.list_topics(topic, timeout=10)
        partitions = sorted(meta.topics[topic].partitions)
        start = [
            TopicPartition(topic, p, since_ms if since_ms else OFFSET_BEGINNING) for p in partitions
        ]
        if since_ms:
            start = consumer.offsets_for_times(start, timeout=10)
        consumer.assign(start)
        open_partitions = set(partitions)
        wanted = None if job_id is None else job_id.encode()
        while open_partitions or follow:
            msg = consumer.poll(poll_s)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(msg.partition())
                continue
            if wanted is not None and msg.key() != wanted:
                continue
            try:
                yield RUN_EVENTS.decode(msg.value() or b"")
            except CodecError:
                continue
    finally:
        consumer.close()
