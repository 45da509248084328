"""The dispatcher and failure detector (one per scheduler node).

It follows `heartbeats` (every worker's capacity, what it has free in the busiest second
of the coming minute, held attempts) and places the runs of its `dispatch` partitions:
best fit against each worker's free resources minus the reservations it made itself.
Reservations are in time (streams/core/timeline.py): a placement books the run's
resources for the second of its start (`not_before`), not from the moment it is placed,
so runs claimed ahead do not block runs due in other seconds; it is released when the
worker's heartbeat lists the attempt (the worker then counts it, with its own estimate
of the run's duration), when a heartbeat made a second after the placement does not
list it (the worker handed it back), or after `reservation_ms`.
Runs that fit nowhere now wait in a fair queue (priority first, then round-robin across
owners) and are placed when capacity frees; a run no known worker could ever fit fails
with the reason. Placement is only a proposal: the worker checks its own room before it
claims (and hands a run it has no room for straight back to `dispatch`), and the
ledger's claim deadline re-dispatches anything lost, so the dispatcher's state is soft
and is rebuilt from recent heartbeats after a restart.

Failure detection: a worker silent for `dead_after_missed` heartbeat intervals plus a
grace is declared dead, and each attempt it held gets a WorkerLost on its job's log (the
ledger ignores it if the attempt moved on). It is suspected (no new placements) after two
missed intervals. The verdict is taken only after reading every heartbeat available, so a
newer heartbeat already in the log cancels it. Workers fence themselves earlier (their
lease is 7 s), so a run is dead before its worker is declared dead.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

from schemas.codec import DISPATCH, HEARTBEAT, JOB_LOG, WORKER_INBOX, CodecError
from streams.core.placement import (
    Capacity,
    FairQueue,
    Item,
    WorkerView,
    best_fit,
    could_ever_fit,
)
from streams.core.records import DispatchFailed, DispatchRequest, WorkerAssignment, WorkerLost
from streams.core.spec import Resources
from streams.core.timeline import Timeline
from streams.kafka import consumer_config, producer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.dispatcher")
# A placement not listed by a heartbeat made this long after it was refused or lost.
REFUSAL_MARGIN_MS = 1000
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class DispatcherConfig:
    heartbeat_s: float = 3.0
    dead_after_missed: int = 3
    grace_s: float = 1.0
    reservation_ms: int = 35_000
    settle_s: float = 10.0  # know the workers this long before failing a run as unplaceable
    history_s: float = 30.0  # heartbeats read back at start-up


@dataclass
class WorkerInfo:
    worker_id: str
    capacity: Capacity
    free: Capacity
    labels: tuple[tuple[str, str], ...]
    seen_ms: int
    running: set[Key] = field(default_factory=set)
    reserved: dict[Key, tuple[Resources, int, int]] = field(default_factory=dict)
    dead: bool = False
    booked: Timeline = field(default_factory=lambda: Timeline(Capacity(0.0, 0, 0)))
    maybe: dict[Key, int] = field(default_factory=dict)  # released early, until (ms)

    def view(self, at_ms: int) -> WorkerView:
        """What this dispatcher believes is free on the worker in the second of `at_ms`."""
        booked = self.booked.booked(at_ms)
        free = Capacity(
            self.free.cpu - booked.cpu,
            self.free.memory_mb - booked.memory_mb,
            self.free.gpu - booked.gpu,
        )
        return WorkerView(self.worker_id, self.capacity, free, self.labels)

    def reserve(self, key: Key, need: Resources, start_ms: int, until_ms: int, now: int) -> None:
        """Book `need` on this worker for the second of its start: whole, because this
        dispatcher knows nothing of how long runs last (a run due now is about to hold
        its resources; the worker, which knows, judges finer once it lists the run)."""
        self.reserved[key] = (need, until_ms, now)
        self.booked.plan(key, need, start_ms, self.booked.slot_ms)

    def release(self, key: Key) -> None:
        self.reserved.pop(key, None)
        self.booked.end(key)


class Dispatcher:
    def __init__(
        self, settings: Settings, node_id: str, config: DispatcherConfig = DispatcherConfig()
    ):
        self.settings = settings
        self.node_id = node_id
        self.config = config
        self.workers: dict[str, WorkerInfo] = {}
        self.queue = FairQueue()
        self.pending: dict[str, DispatchRequest] = {}
        self.started = time.monotonic()
        self.declared_dead = 0
        self._stop = threading.Event()
        self.dispatch_consumer = Consumer(consumer_config(settings, settings.group("dispatcher")))
        self.heartbeat_consumer = Consumer(consumer_config(settings, None))
        self.producer = Producer(producer_config(settings))

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.dispatch_consumer.subscribe([self.settings.topic("dispatch")])
        self._follow_heartbeats()
        try:
            while not self._stop.is_set():
                self._read_heartbeats()
                for msg in self.dispatch_consumer.consume(500, timeout=0.05):
                    if msg.error() is None and msg.value():
                        self._queue(msg.value() or b"")
                now = int(time.time() * 1000)
                self._expire(now)
                self._detect(now)
                self._place(now)
                self.producer.poll(0)
        finally:
            self.producer.flush(10)
            self.dispatch_consumer.close()
            self.heartbeat_consumer.close()

    # -- heartbeats ---------------------------------------------------------------------------
    def _follow_heartbeats(self) -> None:
        topic = self.settings.topic("heartbeats")
        since = int((time.time() - self.config.history_s) * 1000)
        partitions = [TopicPartition(topic, p, since) for p in range(self.settings.partitions)]
        offsets = self.heartbeat_consumer.offsets_for_times(partitions, timeout=10)
        self.heartbeat_consumer.assign(offsets)

    def _read_heartbeats(self) -> None:
        while True:
            batch = self.heartbeat_consumer.consume(1000, timeout=0.01)
            for msg in batch:
                if msg.error() is None and msg.value():
                    self._beat(msg.value() or b"")
            if len(batch) < 1000:
                return

    def _beat(self, raw: bytes) -> None:
        try:
            beat = HEARTBEAT.decode(raw)
        except CodecError as exc:
            log.error("undecodable heartbeat: %s", exc)
            return
        worker_id = beat["worker_id"]
        info = self.workers.get(worker_id)
        if info is not None and beat["at_ms"] <= info.seen_ms:
            return  # an older beat (replay, reordering)
        capacity = _capacity(beat["capacity"])
        running = {(r["run_id"], int(r["attempt"])) for r in beat["running"]}
        if info is None:
            info = WorkerInfo(
                worker_id,
                capacity,
                _capacity(beat["free"]),
                tuple(sorted(beat["labels"].items())),
                beat["at_ms"],
            )
            self.workers[worker_id] = info
        if info.dead:
            log.warning("worker %s is back after being declared dead", worker_id)
        info.capacity, info.free, info.seen_ms, info.dead = (
            capacity,
            _capacity(beat["free"]),
            beat["at_ms"],
            False,
        )
        info.labels = tuple(sorted(beat["labels"].items()))
        info.running = running
        for key, (_, _, placed_ms) in list(info.reserved.items()):
            if key in running:
                info.release(key)  # the worker's own free figure now includes it
            elif placed_ms < beat["at_ms"] - REFUSAL_MARGIN_MS:
                # Placed well before this beat and not held: the worker handed it back
                # (no room) or lost it. Its free figure is the news now. The worker may
                # still have claimed it unseen (a view a moment old): should it die, the
                # verdict names this attempt too, until the reservation would have ended.
                info.maybe[key] = info.reserved[key][1]
                info.release(key)

    # -- queueing and placing ----------------------------------------------------------------
    def _queue(self, raw: bytes) -> None:
        try:
            request = DISPATCH.decode(raw)
        except CodecError as exc:
            log.error("undecodable dispatch record: %s", exc)
            return
        key = f"{request.run_id}#{request.attempt}"
        if key in self.pending:
            self.queue.remove(key)
        self.pending[key] = request
        self.queue.push(Item(key, request.resources, request.priority, request.owner))

    def _alive(self, now: int) -> list[WorkerInfo]:
        suspect_after = 2 * self.config.heartbeat_s * 1000
        return [w for w in self.workers.values() if not w.dead and now - w.seen_ms <= suspect_after]

    def _place(self, now: int) -> None:
        if not len(self.queue):
            return
        alive = self._alive(now)

        def fits(item: Item) -> bool:
            request = self.pending[item.key]
            start, key = request.not_before_ms, (request.run_id, request.attempt)
            # A worker that handed this run back (no room, by its own reckoning) still
            # holds the booking of that placement: not there again until its next
            # heartbeat says what it has free.
            candidates = [w.view(start) for w in alive if key not in w.reserved]
            chosen = best_fit(item.need, candidates)
            if chosen is None:
                return False
            self._assign(self.pending.pop(item.key), chosen.worker_id, now)
            return True

        self.queue.drain(fits)
        settled = time.monotonic() - self.started > self.config.settle_s
        if settled and self.workers:
            everyone = [w.view(now) for w in self.workers.values() if not w.dead]
            for key, request in list(self.pending.items()):
                if everyone and not could_ever_fit(request.resources, everyone):
                    self.queue.remove(key)
                    del self.pending[key]
                    self._send(
                        request.job_id,
                        DispatchFailed(
                            request.job_id,
                            request.run_id,
                            request.attempt,
                            f"no worker could ever fit cpu={request.resources.cpu} "
                            f"memory_mb={request.resources.memory_mb} gpu={request.resources.gpu} "
                            f"labels={dict(request.resources.labels)}",
                            now,
                        ),
                    )

    def _assign(self, request: DispatchRequest, worker_id: str, now: int) -> None:
        info = self.workers[worker_id]
        info.reserve(
            (request.run_id, request.attempt),
            request.resources,
            request.not_before_ms,
            max(now, request.not_before_ms) + self.config.reservation_ms,
            now,
        )
        self.producer.produce(
            self.settings.topic("worker-inbox"),
            key=worker_id.encode(),
            value=WORKER_INBOX.encode(WorkerAssignment(worker_id, now, request)),
        )

    def _expire(self, now: int) -> None:
        for info in self.workers.values():
            for key, (_, until, _) in list(info.reserved.items()):
                if until <= now:
                    info.release(key)
            for key, until in list(info.maybe.items()):
                if until <= now:
                    del info.maybe[key]

    # -- failure detection ---------------------------------------------------------------------
    def _detect(self, now: int) -> None:
        dead_after = (
            self.config.heartbeat_s * self.config.dead_after_missed + self.config.grace_s
        ) * 1000
        for info in self.workers.values():
            if info.dead or now - info.seen_ms <= dead_after:
                continue
            info.dead = True
            self.declared_dead += 1
            held = info.running | set(info.reserved) | set(info.maybe)
            log.warning(
                "worker %s silent for %.1f s: declared dead, %d attempts lost",
                info.worker_id,
                (now - info.seen_ms) / 1000,
                len(held),
            )
            for run_id, attempt in sorted(held):
                job_id = run_id.split("@", 1)[0]
                self._send(job_id, WorkerLost(job_id, run_id, attempt, info.worker_id, now))
            for key in list(info.reserved):
                info.release(key)
            info.maybe.clear()

    def _send(self, job_id: str, record: WorkerLost | DispatchFailed) -> None:
        self.producer.produce(
            self.settings.topic("job-log"), key=job_id.encode(), value=JOB_LOG.encode(record)
        )


def _capacity(raw: dict[str, float | int]) -> Capacity:
    return Capacity(float(raw["cpu"]), int(raw["memory_mb"]), int(raw.get("gpu", 0)))
