"""The dispatcher commits its `dispatch` offsets (streams/dispatcher.py): a node stopped
or killed after hundreds of runs resumes where it left off. Counted on the worker's own inbox:
the assignments of a dispatch record that had already been assigned before the restart
(a record is one (run, attempt, decision time); a re-dispatch by the ledger's claim
deadline is another record, and a legitimate second assignment). Without committed
offsets every restart re-sent the whole retained `dispatch` log."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas.codec import WORKER_INBOX, CodecError
from schemas.records import WorkerAssignment
from streams.inboxes import private_inbox
from streams.settings import Settings
from tests.support.nodes import EventReader, Node, WorkerProc, send_commands
from tests.support.waiting import until_passes

JOBS = 20  # every 1 s: ~20 dispatch records a second


@pytest.fixture
def world(topics: Settings, tmp_path: Path) -> Iterator[tuple[Node, WorkerProc]]:
    node = Node(topics, "offsets-node", tmp_path)
    worker = WorkerProc(topics, "offsets-w", tmp_path, cpu=1000, memory_mb=10**6)
    worker.argv += ["--executor", "noop"]
    node.start()
    worker.start()
    yield node, worker
    worker.stop()
    node.stop()


def _assignments(settings: Settings) -> Counter[tuple[str, int, int]]:
    """Every WorkerAssignment in the worker's own inbox up to its end now, counted by its
    dispatch record."""
    topic = private_inbox(settings, "offsets-w") or ""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka,
            "group.id": settings.group("inbox-count"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[1]
        for p in range(1)
    }
    pending = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
    counted: Counter[tuple[str, int, int]] = Counter()

    def read_to_the_end() -> None:
        for msg in consumer.consume(1000, timeout=0.5) if pending else []:
            partition, offset = msg.partition() or 0, msg.offset() or 0
            if msg.error() is not None:
                continue
            if offset >= ends[partition] - 1:
                pending.discard(partition)
            if offset >= ends[partition] or not msg.value():
                continue
            try:
                record = WORKER_INBOX.decode(msg.value() or b"")
            except CodecError:
                continue
            if isinstance(record, WorkerAssignment):
                d = record.dispatch
                counted[(d.run_id, d.attempt, d.at_ms)] += 1
        for tp in consumer.position([TopicPartition(topic, p) for p in list(pending)]):
            if tp.offset >= ends[tp.partition]:
                pending.discard(tp.partition)  # the end is a transaction marker
        assert not pending, f"worker-inbox not read to its end: {pending}"

    try:
        until_passes(read_to_the_end, 60, interval_s=0)
    finally:
        consumer.close()
    return counted


def _resent(before: Counter[tuple[str, int, int]], after: Counter[tuple[str, int, int]]) -> int:
    """Assignments sent after the restart for records already assigned before it."""
    return sum(after[k] - before[k] for k in before if after[k] > before[k])


def _claimed(events: EventReader) -> int:
    """Runs claimed by the worker: each was assigned to it first."""
    return sum(1 for e, _ in events.run_events() if e.state == "dispatched")


def test_a_restarted_node_does_not_resend_handled_assignments(
    topics: Settings, world: tuple[Node, WorkerProc]
) -> None:
    node, _ = world
    events = EventReader(topics, "offsets-check")
    try:
        send_commands(
            topics,
            [
                {
                    "type": "job.upsert",
                    "job_id": f"off-{i:02d}",
                    "owner": "t",
                    "schedule": {"every": "1s"},
                    "command": ["true"],
                }
                for i in range(JOBS)
            ],
        )
        events.wait_until(lambda: _claimed(events) >= 400, 180, "400 runs claimed")
        before = _assignments(topics)
        handled = sum(before.values())

        node.stop()  # SIGTERM: the dispatcher commits what it handled on the way out
        node.start()
        events.wait_until(
            lambda: _claimed(events) >= 400 + 200, 180, "runs after a graceful restart"
        )
        after_stop = _assignments(topics)
        resent_stop = _resent(before, after_stop)

        node.kill()  # SIGKILL: at most what was handled since the last commit (~1 s)
        node.start()
        events.wait_until(lambda: _claimed(events) >= 600 + 200, 180, "runs after a kill")
        after_kill = _assignments(topics)
        resent_kill = _resent(after_stop, after_kill)
        assert node.alive
    finally:
        events.close()
    print(
        f"dispatcher offsets: {handled} assignments before the first restart; re-sent "
        f"after SIGTERM {resent_stop}, after SIGKILL {resent_kill} "
        f"(of {sum(after_stop.values())})"
    )
    assert handled >= 400
    assert resent_stop <= 5
    assert resent_kill <= 3 * JOBS + 20  # a second or two of records, and those in flight
