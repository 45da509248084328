"""A worker whose producer queue is full (`BufferError`: a long broker outage, a burst of
output) keeps its reports and its runs' output, and sends them once the queue has room,
in the order made (on the in-memory Kafka, streams/memory.py)."""

from __future__ import annotations

import os
from pathlib import Path

from connectors.worker.rundirs import attempt_dir, prepare
from connectors.worker.runlogs import CHUNK, LogTail
from connectors.worker.worker import Worker, WorkerConfig
from schemas.codec import JOB_LOG, RUN_LOG
from schemas.records import RunFinished, RunLogChunk, RunReleased
from streams.core.clock import ManualClock
from streams.core.placement import Capacity
from streams.kafka import producer_config
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=1)


def _full_for(log: MemoryLog, refusals: int) -> list[int]:
    """Refuse the next `refusals` produce calls as a full queue does; returns the count
    left, which the test may raise again."""
    left = [refusals]

    def full(call: str, client: object) -> None:
        if call == "produce" and left[0] > 0:
            left[0] -= 1
            raise BufferError("Local: Queue full")

    log.faults.append(full)
    return left


def test_reports_refused_by_a_full_queue_go_later_in_the_order_made(tmp_path: Path) -> None:
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)
    config = WorkerConfig("wfull", Capacity(1, 512, 0), state_dir=tmp_path, executor="noop")
    worker = Worker(SETTINGS, config, clock=log.clock, clients=MemoryClients(log))
    reports = [
        RunReleased("j", "j@1", 1, "wfull", "no room", 1_000),
        RunFinished("j", "j@2", 1, "wfull", 0, "", 2_000),
        RunFinished("j", "j@3", 1, "wfull", 1, "", 3_000),
    ]
    left = _full_for(log, 1)
    for report in reports:  # the first is refused; the others must not overtake it
        worker.send(report)
    assert left[0] == 0
    assert log.records(SETTINGS.topic("worker-reports"), committed=False) == []
    left[0] = 1  # still full at the next pass: nothing is lost, nothing reordered
    worker.pump()
    assert log.records(SETTINGS.topic("worker-reports"), committed=False) == []
    worker.pump()
    worker.producer.poll(0)
    sent = [
        JOB_LOG.decode(m.value() or b"")
        for m in log.records(SETTINGS.topic("worker-reports"), committed=False)
    ]
    assert sent == reports
    assert worker.resend == []


def test_output_refused_by_a_full_queue_is_sent_from_where_it_stopped(tmp_path: Path) -> None:
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)
    producer = MemoryClients(log).producer(producer_config(SETTINGS))
    run_dir = attempt_dir(tmp_path / "runs", "job@4", 1)
    made = prepare(run_dir, None)
    output = b"".join(bytes([65 + i]) * CHUNK for i in range(3)) + b"tail\n"
    os.write(made.stdout, output)
    made.close()
    tail = LogTail("job@4", 1, run_dir)
    topic = SETTINGS.topic("run-logs")

    def chunks() -> list[RunLogChunk]:
        found = [RUN_LOG.decode(m.value() or b"") for m in log.records(topic, committed=False)]
        return [c for c in found if isinstance(c, RunLogChunk) and c.stream == "stdout"]

    queued = [0]

    def full_after_two(call: str, client: object) -> None:
        if call == "produce" and client is producer:
            if queued[0] >= 2:
                raise BufferError("Local: Queue full")
            queued[0] += 1

    log.faults.append(full_after_two)
    tail.send_new(producer, topic, "w1")
    assert [c.seq for c in chunks()] == [0, 1]
    log.faults.remove(full_after_two)
    tail.send_new(producer, topic, "w1")
    sent = chunks()
    assert [c.seq for c in sent] == [0, 1, 2, 3]
    assert "".join(c.data for c in sent).encode() == output
    tail.send_new(producer, topic, "w1")
    assert len(chunks()) == 4  # nothing sent twice
