"""The worker's heartbeat and lease thread.

Every `heartbeat_s` it sends a heartbeat (capacity, what is free in the busiest second of
the coming minute, labels, the attempts held) and, only once Kafka acknowledged it,
renews the lease: alive until `lease_s` after the beat was *made* (conservative), on the
monotonic clock (connectors/worker/engine.py: a wall-clock step must not stretch it). No
lease is written before the first acknowledged beat, so a worker that cannot reach Kafka
never starts anything.

The acknowledgement also tells the time: `heartbeats` has LogAppendTime, so the delivery
report carries the broker's append time, a sample for the worker's broker clock
(streams/core/clock.py), by which the worker starts its runs.

A beat left unacknowledged twice in a row makes the thread replace its producer: librdkafka
keeps retrying a request on the broker it sent it to for as long as that broker's
connection stays open, and a paused broker (SIGSTOP, a hung machine) keeps it open while
the cluster has long moved its partitions elsewhere; a new producer asks for the
metadata afresh and finds the new leader. The old one is purged and destroyed on a
thread of its own (its destruction can wait on that broker). A beat it had sent may
still be appended when that broker wakes: an old beat read late only delays a verdict.

It never waits for the main loop, which may be busy for seconds under a saturated CPU: it
sends the view the main loop last published. A beat that waited would renew the lease
late and fence runs that are about to start. But a main loop stuck for much longer
(`loop_alive` false: no pass for 20 s) stops the renewals: such a worker reads no orders
and sends no reports, and its jobs must be fenced rather than kept alive by beats.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer

from connectors.worker.engine import lease_text
from connectors.worker.lease import write_atomic
from schemas.codec import HeartbeatWriter
from schemas.records import Heartbeat as Beat
from schemas.records import WorkerCapacity
from streams.core.clock import broker_stamp
from streams.core.placement import Capacity

log = logging.getLogger("cronlog.worker")
UNACKED_LOG_S = 10.0  # while Kafka is unreachable, say so this often
REPLACE_AFTER = 2  # unacknowledged beats in a row after which the producer is replaced

View = tuple[Capacity, tuple[tuple[str, int], ...]]


class Heartbeat:
    def __init__(
        self,
        producer: Producer,
        topic: str,
        worker_id: str,
        capacity: Capacity,
        labels: tuple[tuple[str, str], ...],
        *,
        heartbeat_s: float,
        lease_s: float,
        ack_window_s: float | None = None,
        arm_ahead_s: float | None = None,
        view: Callable[[], View],
        lease_file: Callable[[], Path],
        stop: threading.Event,
        loop_alive: Callable[[], bool] = lambda: True,
        observe: Callable[[int], None] | None = None,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        new_producer: Callable[[], Producer] | None = None,
        broker_ms: Callable[[], int | None] | None = None,
    ) -> None:
        self.producer = producer
        self.new_producer = new_producer  # None: never replaced (tests of one producer)
        self.missed = 0  # beats unacknowledged in a row
        self.replaced = 0
        self.topic = topic
        self.worker_id = worker_id
        self.capacity = capacity
        self.labels = labels
        self.heartbeat_s = heartbeat_s
        # A beat renews the lease only if acknowledged this soon after it was made: a
        # later acknowledgement may come after the failure detector's verdict.
        self.ack_window_s = heartbeat_s if ack_window_s is None else ack_window_s
        self.lease_s = lease_s
        # Each beat arms the starts due up to this far ahead of the broker's time (its
        # horizon, `armed_ms`, never lower than the one before); None: no horizon (the
        # lease alone bounds the starts, as before arming).
        self.arm_ahead_ms = None if arm_ahead_s is None else int(arm_ahead_s * 1000)
        self.armed_ms: int | None = None  # the horizon of the newest beat made
        # The broker's time from below, None until the broker clock has a sample: a
        # horizon is armed only from it (a machine clock ahead would arm starts that
        # far ahead, and the highest horizon stands for good; one behind, after a
        # restart, could arm below what an earlier incarnation started). Unsynced,
        # a beat carries no horizon and the lease alone bounds the starts, as before.
        self.broker_ms = broker_ms or now_ms
        self.view = view
        self.lease_file = lease_file
        self.stop = stop
        self.loop_alive = loop_alive
        self.observe = observe  # gets the broker's time of each acknowledged beat
        self.now_ms = now_ms
        self.acknowledged = 0  # beats acknowledged so far
        # The current lease's end, and when a beat last renewed a lease that had lapsed
        # (CLOCK_MONOTONIC; 0: never): the lease file says the latter, and the executor
        # starts no attempt claimed before it (engine.py `Lease.voids`).
        self.lease_until: float | None = None
        self.renewed_mono = 0.0
        self.unacked_since: float | None = None  # monotonic: first beat left unacknowledged
        self.unacked_logged = 0.0
        self.writer = HeartbeatWriter()  # reuses the held attempts' bytes beat to beat

    def beat(self) -> bool:
        """Send one heartbeat; renew the lease if Kafka acknowledged it in time."""
        started = time.monotonic()
        at_ms = self.now_ms()
        free, held = self.view()
        capacity = self.capacity
        broker_now = self.broker_ms() if self.arm_ahead_ms is not None else None
        if self.arm_ahead_ms is not None and broker_now is not None:
            self.armed_ms = max(self.armed_ms or 0, broker_now + self.arm_ahead_ms)
        record = Beat(
            self.worker_id,
            at_ms,
            WorkerCapacity(capacity.cpu, capacity.memory_mb, capacity.gpu),
            WorkerCapacity(max(free.cpu, 0.0), max(free.memory_mb, 0), max(free.gpu, 0)),
            tuple(sorted(self.labels)),
            armed_ms=self.armed_ms,
        )
        delivered: list[bool] = []

        def acked(err: object, msg: Any) -> None:
            delivered.append(err is None)
            stamp = broker_stamp(msg.timestamp()) if err is None else None
            if stamp is not None and self.observe is not None:
                self.observe(stamp)

        try:
            self.producer.produce(
                self.topic,
                key=self.worker_id.encode(),
                value=self.writer.encode(record, held),
                on_delivery=acked,
            )
        except (KafkaException, BufferError) as exc:
            # Refused before it left (too large, a full queue): not delivered, so the
            # lease is not renewed; the thread goes on beating, it never dies of it.
            log.error("heartbeat of %d attempts refused: %s", len(held), exc)
            delivered.append(False)
        self.producer.flush(self.ack_window_s)
        took = time.monotonic() - started
        if delivered and delivered[0] and took > self.ack_window_s / 2:
            log.warning("slow heartbeat: acknowledged after %.2f s", took)
        if delivered and delivered[0] and self.unacked_since is not None:
            log.warning(
                "heartbeats acknowledged again, after %.1f s without: Kafka is back",
                started - self.unacked_since,
            )
            self.unacked_since = None
        if delivered and delivered[0] and not self.loop_alive():
            # Beats alone do not make a worker: a main loop stuck this long reads no
            # orders and sends no reports, so its jobs must be fenced, not kept alive.
            log.error("the worker's main loop is stuck; the lease is not renewed")
            return False
        if delivered and delivered[0]:
            # The lease and the horizon together: the executor starts a run only while
            # the lease holds and its start time is within a horizon Kafka acknowledged.
            renewed_at = time.monotonic()
            if self.lease_until is not None and renewed_at >= self.lease_until:
                # Renewed only now: every claim made before is void, the ones made while
                # it lapsed too (a verdict may have come at any moment of the lapse).
                self.renewed_mono = renewed_at
                log.warning(
                    "the lease had lapsed for %.1f s: attempts claimed before now are not "
                    "started (the worker may have been declared dead meanwhile)",
                    renewed_at - self.lease_until,
                )
            self.lease_until = started + self.lease_s
            write_atomic(
                self.lease_file(),
                lease_text(self.lease_until, record.armed_ms, self.renewed_mono),
            )
            self.acknowledged += 1
            self.missed = 0
            return True
        self._unacknowledged(started, delivered[0] if delivered else None)
        self.missed += 1
        if self.missed >= REPLACE_AFTER and self.new_producer is not None:
            self._replace_producer()
        return False

    def _replace_producer(self) -> None:
        """A fresh producer, with fresh metadata; the old one purged and dropped on a
        thread of its own."""
        old, self.producer = self.producer, self.new_producer()  # type: ignore[misc]
        self.missed = 0
        self.replaced += 1
        log.log(
            logging.WARNING if self.replaced == 1 else logging.INFO,
            "heartbeats unacknowledged %d times in a row: a new producer asks where the "
            "heartbeat partition is led now (%d replaced so far)",
            REPLACE_AFTER,
            self.replaced,
        )

        def dispose() -> None:
            try:
                old.purge()
                old.flush(0)
            except (KafkaException, RuntimeError) as exc:
                log.debug("disposing of a replaced heartbeat producer: %s", exc)

        threading.Thread(target=dispose, name="heartbeat-producer-dispose", daemon=True).start()

    def _unacknowledged(self, started: float, delivered: bool | None) -> None:
        """Say that the worker waits for Kafka: at the first beat left unacknowledged,
        then every UNACKED_LOG_S (an outage of any length is waited out, beat by beat;
        the beats not delivered yet stay queued and go once the broker is back)."""
        if self.unacked_since is None:
            self.unacked_since = started
        elif time.monotonic() - self.unacked_logged < UNACKED_LOG_S:
            return
        self.unacked_logged = time.monotonic()
        log.warning(
            "heartbeat %s within %.1f s: Kafka unreachable for %.0f s; the lease is not "
            "renewed (running jobs are fenced when it ends); retrying every %.1f s",
            "refused" if delivered is False else "not acknowledged",
            self.ack_window_s,
            time.monotonic() - self.unacked_since,
            self.heartbeat_s,
        )

    def loop(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.beat()
            self.stop.wait(max(0.0, self.heartbeat_s - (time.monotonic() - started)))
