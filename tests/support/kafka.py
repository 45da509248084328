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
    c: Consumer, expected: int, timeout_s: float = 30.0, *, to_end: bool = False
) -> list[Message]:
    """Read until `expected` records arrived; with `to_end`, then on to the end every
    assigned partition has at that moment (past a transaction's marker; an open
    transaction is waited for): a positive sign that no further record written before
    the call is on its way, which is what a test counting extras needs (a fixed wait
    passes when they merely come late)."""
    found: list[Message] = []
    deadline = time.monotonic() + timeout_s

    def take(wait_s: float) -> None:
        msg = c.poll(wait_s)
        if msg is not None and msg.error() is None:
            found.append(msg)

    while time.monotonic() < deadline and len(found) < expected:
        take(0.5)
    if not to_end:
        return found
    assignment = c.assignment()
    # (low, high): a partition with nothing in it has no position to reach its end with.
    marks = {(tp.topic, tp.partition): c.get_watermark_offsets(tp, timeout=10) for tp in assignment}

    def behind() -> dict[tuple[str, int], tuple[int, int]]:
        return {
            (tp.topic, tp.partition): (tp.offset, high)
            for tp in c.position(assignment)
            for low, high in [marks[tp.topic, tp.partition]]
            if high > low and tp.offset < high
        }

    while behind() and time.monotonic() < deadline:
        take(0.2)
    assert not behind(), f"not read to the end, (position, end): {behind()}"
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
