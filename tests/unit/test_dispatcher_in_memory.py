"""The dispatcher and failure detector process on the in-memory Kafka, on a manual clock
(pure: no broker, no sleeps): a run the ledger dispatches is placed on the live worker
with a seal only the nodes' key makes, and once that worker falls silent the detector
declares the attempt it held lost, not a moment before its verdict time."""

from __future__ import annotations

import pytest

from schemas.codec import HEARTBEAT, JOB_LOG, WORKER_INBOX
from schemas.records import (
    Heartbeat,
    JobUpserted,
    RunningAttempt,
    RunNowRequested,
    WorkerAssignment,
    WorkerCapacity,
    WorkerLost,
)
from schemas.spec import JobSpec
from streams import ledger as ledger_module
from streams.core.clock import ManualClock
from streams.core.ledger import LedgerConfig
from streams.core.seals import sealed
from streams.dispatcher import Dispatcher, DispatcherConfig
from streams.kafka import producer_config
from streams.ledger import Ledger
from streams.memory import MemoryClients, MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=2, topic_prefix="disp.")
CONFIG = DispatcherConfig()


def test_a_run_is_placed_on_the_live_worker_and_declared_lost_when_it_falls_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)  # real time, not the log's
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_catalogue(SETTINGS)
    clients = MemoryClients(log)
    outside = clients.producer(producer_config(SETTINGS))

    def now_ms() -> int:
        return int(clock.time() * 1000)

    def beat(running: tuple[RunningAttempt, ...] = ()) -> None:
        capacity = WorkerCapacity(4.0, 4096, 0)
        record = Heartbeat("w1", now_ms(), capacity, capacity, (), running)
        outside.produce(SETTINGS.topic("heartbeats"), key=b"w1", value=HEARTBEAT.encode(record))

    dispatcher = Dispatcher(SETTINGS, "d1", CONFIG, clock=clock, clients=clients)
    assert dispatcher.open()
    ledger = Ledger(SETTINGS, LedgerConfig(), node_id="L", clients=clients, clock=clock)
    assert ledger.open()
    spec = JobSpec(job_id="job", owner="o", schedule=None, command=("true",))
    for record in (JobUpserted(spec, now_ms()), RunNowRequested("job", "r1", now_ms())):
        outside.produce(SETTINGS.topic("job-log"), key=b"job", value=JOB_LOG.encode(record))

    assignments: list[WorkerAssignment] = []
    beaten = -CONFIG.heartbeat_s
    for _ in range(200):  # the worker beats every 3 s; the loops turn meanwhile
        if clock.monotonic() - beaten >= CONFIG.heartbeat_s:
            beaten = clock.monotonic()
            beat()
        ledger.step()
        dispatcher.step()
        assignments = [
            m
            for m in (
                WORKER_INBOX.decode(r.value() or b"")
                for r in log.records(SETTINGS.topic("worker-inbox"))
            )
            if isinstance(m, WorkerAssignment)
        ]
        if assignments:
            break
    assert len(assignments) == 1, "the run was not placed"
    placed = assignments[0]
    key = log.records(SETTINGS.topic("node-keys"))[0].value() or b""
    d = placed.dispatch
    assert placed.worker_id == "w1"
    assert sealed(key, d.placement, d.run_id, d.attempt, "w1")

    # The worker lists the attempt, then falls silent: the detector's verdict comes after
    # `dead_after` (3 missed beats and the grace) on the dispatcher's clock, not before.
    beat((RunningAttempt(d.run_id, d.attempt),))
    silent_since = clock.monotonic()
    dead_after = CONFIG.heartbeat_s * CONFIG.dead_after_missed + CONFIG.grace_s
    lost: list[tuple[float, WorkerLost]] = []
    while clock.monotonic() - silent_since < 3 * dead_after and not lost:
        dispatcher.step()
        lost = [
            (clock.monotonic() - silent_since, r)
            for r in (
                JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log"))
            )
            if isinstance(r, WorkerLost)
        ]
    assert lost, "the silent worker was never declared dead"
    after, verdict = lost[0]
    assert (verdict.run_id, verdict.attempt, verdict.worker_id) == (d.run_id, d.attempt, "w1")
    # Judged from the receipt of the last beat (read after `silent_since`), and promptly.
    assert dead_after <= after < dead_after + 1.0
