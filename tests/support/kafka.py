"""Small helpers for integration tests on the real broker (wait on offsets, never sleep)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Message, Producer

from schemas.codec import RUN_EVENTS
from schemas.records import RunEvent, RunStateName
from streams.kafka import consumer_config, producer_config
from streams.settings import Settings


def consumer(
    settings: Settings, *topics: str, isolation: str = "read_committed", group: str | None = None
) -> Consumer:
    """A consumer from the earliest offset in a fresh group under the module's prefix."""
    c = Consumer(
        consumer_config(
            settings,
            group or settings.group(f"probe-{uuid.uuid4().hex[:8]}"),
            **{"auto.offset.reset": "earliest", "isolation.level": isolation},
        )
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


SYNTHETIC_STATES: tuple[RunStateName, ...] = ("due", "dispatched", "running", "succeeded")
SYNTHETIC_T0 = 1_800_000_000_000


def synthetic_run(r: int, attempt: int = 1) -> list[RunEvent]:
    """Run number r of a synthetic history: four transitions of a succeeded run."""
    job = f"job-{r % 500}"
    scheduled = SYNTHETIC_T0 + r * 1000
    run_id = f"{job}@{scheduled}"
    return [
        RunEvent(
            f"{run_id}#{seq}",
            job,
            run_id,
            scheduled,
            "schedule",
            attempt,
            state,
            scheduled + seq,
            "w1",
            "",
            0 if state == "succeeded" else None,
        )
        for seq, state in enumerate(SYNTHETIC_STATES, start=1)
    ]


def produce_runs(settings: Settings, runs: range, producer: Producer | None = None) -> int:
    """Produce synthetic runs' transitions to run-events; the number of events."""
    producer = producer or Producer(producer_config(settings, **{"linger.ms": 20}))
    count = 0
    for r in runs:
        for event in synthetic_run(r):
            producer.produce(
                settings.topic("run-events"),
                key=event.job_id.encode(),
                value=RUN_EVENTS.encode(event),
            )
            count += 1
            if len(producer) > 50_000:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    return count
