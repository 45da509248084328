"""Small helpers for integration tests on the real broker (wait on offsets, never sleep)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Message

from streams.settings import Settings


def consumer(
    settings: Settings, *topics: str, isolation: str = "read_committed", group: str | None = None
) -> Consumer:
    """A consumer from the earliest offset in a fresh group under the module's prefix."""
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka,
            "group.id": group or settings.group(f"probe-{uuid.uuid4().hex[:8]}"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.subscribe([settings.topic(t) for t in topics])
    return c


def drain(
    c: Consumer, expected: int, timeout_s: float = 30.0, settle_s: float = 0.0
) -> list[Message]:
    """Read until `expected` records arrived (then `settle_s` more, to catch extras)."""
    found: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(found) < expected:
        msg = c.poll(0.5)
        if msg is not None and msg.error() is None:
            found.append(msg)
    settle_until = time.monotonic() + settle_s
    while time.monotonic() < settle_until:
        msg = c.poll(0.2)
        if msg is not None and msg.error() is None:
            found.append(msg)
    return found
