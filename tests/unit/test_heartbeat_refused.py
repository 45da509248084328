"""A heartbeat the client refuses (too large, a full queue) renews no lease and stops
nothing: the next beat goes out (on the in-memory Kafka, streams/memory.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException

from connectors.worker.engine import read_lease_file
from connectors.worker.heartbeat import Heartbeat
from connectors.worker.worker import HEARTBEAT_PRODUCER
from schemas.codec import HEARTBEAT
from streams.core.clock import ManualClock
from streams.core.placement import Capacity
from streams.kafka import producer_config
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=1)


def test_a_refused_beat_renews_no_lease_and_the_next_one_goes_out(tmp_path: Path) -> None:
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)
    refuse = [True]

    def too_large(call: str, client: object) -> None:
        if call == "produce" and refuse[0]:
            refuse[0] = False
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))

    log.faults.append(too_large)
    lease = tmp_path / "lease"
    beat = Heartbeat(
        MemoryClients(log).producer(producer_config(SETTINGS, **HEARTBEAT_PRODUCER)),
        SETTINGS.topic("heartbeats"),
        "w1",
        Capacity(1, 100, 0),
        (),
        heartbeat_s=3.0,
        lease_s=7.0,
        view=lambda: (Capacity(1, 100, 0), (("job@t", 1),)),
        lease_file=lambda: lease,
        stop=threading.Event(),
    )
    assert beat.beat() is False  # refused: not delivered
    assert not lease.exists()
    assert log.records(SETTINGS.topic("heartbeats")) == []
    assert beat.beat() is True  # the thread goes on; this one is acknowledged
    assert lease.exists()
    assert len(log.records(SETTINGS.topic("heartbeats"))) == 1


def test_a_producer_whose_beats_go_unacknowledged_is_replaced(tmp_path: Path) -> None:
    """Two beats in a row unacknowledged (a paused broker keeps the producer's requests
    on it): the thread takes a new producer, whose beat is acknowledged and renews the
    lease; the old one is purged."""
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)
    clients = MemoryClients(log)
    made: list[object] = []

    def new_producer() -> object:
        made.append(clients.producer(producer_config(SETTINGS, **HEARTBEAT_PRODUCER)))
        return made[-1]

    def stuck(call: str, client: object) -> None:
        if call == "produce" and client is made[0]:
            raise BufferError("the first producer's queue never drains")

    log.faults.append(stuck)
    lease = tmp_path / "lease"
    beat = Heartbeat(
        new_producer(),  # type: ignore[arg-type]
        SETTINGS.topic("heartbeats"),
        "w1",
        Capacity(1, 100, 0),
        (),
        heartbeat_s=1.0,
        ack_window_s=2.0,
        lease_s=8.0,
        view=lambda: (Capacity(1, 100, 0), ()),
        lease_file=lambda: lease,
        stop=threading.Event(),
        new_producer=new_producer,  # type: ignore[arg-type]
    )
    assert beat.beat() is False
    assert len(made) == 1  # one miss is not enough
    assert beat.beat() is False
    assert len(made) == 2
    assert beat.producer is made[1]
    assert beat.replaced == 1
    assert beat.beat() is True  # the new producer's beat is acknowledged
    assert lease.exists()
    assert len(log.records(SETTINGS.topic("heartbeats"))) == 1


def test_a_beat_arms_starts_only_from_the_brokers_time(tmp_path: Path) -> None:
    """Before the worker's broker clock has a sample, a beat carries no horizon and its
    lease file none either (the lease alone bounds starts, as a worker before arming):
    a machine clock an hour ahead must not arm starts an hour ahead for good. Once it
    has one, each beat arms up to the broker's time plus the arm-ahead, never lower."""
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)
    lease = tmp_path / "lease"
    broker: list[int | None] = [None]
    beat = Heartbeat(
        MemoryClients(log).producer(producer_config(SETTINGS, **HEARTBEAT_PRODUCER)),
        SETTINGS.topic("heartbeats"),
        "w1",
        Capacity(1, 100, 0),
        (),
        heartbeat_s=1.0,
        lease_s=8.0,
        arm_ahead_s=2.0,
        view=lambda: (Capacity(1, 100, 0), ()),
        lease_file=lambda: lease,
        stop=threading.Event(),
        now_ms=lambda: 5_000_000_000_000,  # the machine's clock, far ahead
        broker_ms=lambda: broker[0],
    )

    def sent() -> list[int | None]:
        return [
            HEARTBEAT.decode(r.value() or b"").armed_ms
            for r in log.records(SETTINGS.topic("heartbeats"))
        ]

    assert beat.beat() is True
    assert sent() == [None]
    assert read_lease_file(lease).armed_ms is None
    broker[0] = 1_000_000
    assert beat.beat() is True
    assert read_lease_file(lease).armed_ms == 1_002_000
    broker[0] = 999_000  # a later sample's bound is never taken below the horizon
    assert beat.beat() is True
    assert sent() == [None, 1_002_000, 1_002_000]
    assert read_lease_file(lease).arms(1_002_000)
    assert not read_lease_file(lease).arms(1_002_001)


def test_a_lease_renewed_after_it_lapsed_says_so_and_one_renewed_in_time_does_not(
    tmp_path: Path,
) -> None:
    """The lease file carries when a lease that had lapsed was renewed: the executor
    starts no attempt claimed before (connectors/worker/engine.py `Lease.voids`)."""
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)
    lease = tmp_path / "lease"
    beat = Heartbeat(
        MemoryClients(log).producer(producer_config(SETTINGS, **HEARTBEAT_PRODUCER)),
        SETTINGS.topic("heartbeats"),
        "w1",
        Capacity(1, 100, 0),
        (),
        heartbeat_s=0.05,
        lease_s=0.3,
        view=lambda: (Capacity(1, 100, 0), ()),
        lease_file=lambda: lease,
        stop=threading.Event(),
    )
    assert beat.beat() is True
    assert read_lease_file(lease).renewed_mono == 0.0  # the first lease: no lapse
    assert beat.beat() is True
    assert read_lease_file(lease).renewed_mono == 0.0  # renewed in time
    time.sleep(0.35)  # the lease lapses
    lapsed_by = time.monotonic()
    assert not read_lease_file(lease).holds
    assert beat.beat() is True
    renewed = read_lease_file(lease)
    assert renewed.holds
    assert renewed.renewed_mono >= lapsed_by
    assert renewed.voids(lapsed_by)
    assert not renewed.voids(time.monotonic())
