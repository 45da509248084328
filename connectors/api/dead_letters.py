"""The newest records of the `commands.dlq` topic, read for the dashboard.

Dead letters live only in Kafka (no projection keeps them: they are not the contract's
history, and an undecodable record has nothing to join on). A page view reads the tail of
each partition with a group-less consumer: at most `limit` records per partition, bounded
in time, nothing committed.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from schemas.json import read_dlq_record
from streams.kafka import consumer_config
from streams.settings import Settings

READ_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class DeadLetterView:
    at: datetime
    partition: int
    offset: int
    reason: str
    source: str  # topic/partition/offset the rejected record came from
    original: str  # its bytes as text (undecodable bytes replaced)
    owner: str | None  # from the original command, when it is JSON and names one
    job_id: str | None


def _view(partition: int, offset: int, at_ms: int, value: bytes) -> DeadLetterView:
    try:
        letter = read_dlq_record(value)
    except (ValueError, KeyError, TypeError):
        text = value.decode("utf-8", "replace")
        return DeadLetterView(
            datetime.fromtimestamp(at_ms / 1000, UTC), partition, offset, "unreadable", "?", text,
            None, None,
        )  # fmt: skip
    doc: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        doc = orjson.loads(letter.original)
    named = doc if isinstance(doc, dict) else {}
    owner, job_id = named.get("owner"), named.get("job_id")
    return DeadLetterView(
        at=datetime.fromtimestamp(at_ms / 1000, UTC),
        partition=partition,
        offset=offset,
        reason=letter.reason,
        source=f"{letter.topic}/{letter.partition}/{letter.offset}",
        original=letter.original.decode("utf-8", "replace"),
        owner=owner if isinstance(owner, str) else None,
        job_id=job_id if isinstance(job_id, str) else None,
    )


def recent_dead_letters(settings: Settings, limit: int) -> list[DeadLetterView]:
    """Up to `limit` of the newest dead letters of every partition, newest first.
    Raises KafkaException when the broker cannot be asked."""
    topic = settings.topic("commands.dlq")
    consumer = Consumer(consumer_config(settings, None, **{"enable.partition.eof": True}))
    try:
        meta = consumer.list_topics(topic, timeout=READ_TIMEOUT_S).topics[topic]
        if meta.error is not None:
            raise KafkaException(meta.error)
        wanted: list[TopicPartition] = []
        ends: dict[int, int] = {}
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=READ_TIMEOUT_S
            )
            if high > low:
                wanted.append(TopicPartition(topic, p, max(low, high - limit)))
                ends[p] = high
        found: list[DeadLetterView] = []
        if not wanted:
            return found
        consumer.assign(wanted)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            p = msg.partition() or 0
            err = msg.error()
            if err is not None:
                # The end of a partition (enable.partition.eof): the ledger writes dead
                # letters in transactions, so the last offset may be a commit marker
                # that no record reaches.
                if err.code() == KafkaError._PARTITION_EOF:
                    ends.pop(p, None)
                continue
            offset = msg.offset() or 0
            found.append(_view(p, offset, msg.timestamp()[1], msg.value() or b""))
            if offset + 1 >= ends.get(p, OFFSET_END):
                ends.pop(p, None)
        return sorted(found, key=lambda v: (v.at, v.partition, v.offset), reverse=True)
    finally:
        consumer.close()
