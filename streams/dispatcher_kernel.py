"""What the dispatcher's concerns share: its configuration, what it knows of each worker,
its soft state and clients, and how it sends a record and counts it handled once delivered.

One dispatcher's state is read and changed by each of its concerns (a beat releases
reservations a placement made; a verdict ends them), so it is held once, here, and each
concern is a class on it, as the ledger's rules share theirs (streams/core/ledger/kernel.py):
the heartbeats read (streams/dispatcher_heartbeats.py), placing and placing again
(streams/dispatcher_placing.py), the failure detector's verdicts
(streams/dispatcher_verdicts.py). streams/dispatcher.py puts them together with the loop,
its `dispatch` offsets and the group's callbacks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message

from schemas.codec import HEARTBEAT, JOB_LOG, CodecError
from schemas.records import DispatchFailed, DispatchRequest, WorkerLost
from schemas.spec import Resources
from streams.core.clock import SYSTEM_CLOCK, Clock
from streams.core.liveness import BeatMark, Liveness
from streams.core.placement import Capacity, FairQueue, WorkerView
from streams.core.timeline import Timeline
from streams.core.timing import TIMING
from streams.inboxes import Inboxes
from streams.kafka import (
    KAFKA_CLIENTS,
    Clients,
    GroupWatch,
    admin_config,
    consumer_config,
    producer_config,
)
from streams.settings import Settings

log = logging.getLogger("cronlog.dispatcher")
# While the broker cannot say where heartbeat partitions end, say so this often.
UNANSWERED_LOG_S = 10.0
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class DispatcherConfig:
    suspect_after_s: float = TIMING.suspect_after_s
    dead_after_s: float = TIMING.dead_after_s
    # A dead worker started nothing whose start time is past the broker time of its
    # last beat read plus this (its lease, plus a margin): WorkerLost says so.
    lease_bound_ms: int = int((TIMING.lease_s + TIMING.lease_bound_margin_s) * 1000)
    reservation_ms: int = 35_000
    settle_s: float = 10.0  # know the workers this long before failing a run as unplaceable
    history_s: float = 30.0  # heartbeats read back at start-up
    # Runs placed on one worker to start in the same second before the next fitting
    # worker is preferred (placement.spread_fit): a burst is spread over the workers'
    # start loops instead of queueing behind the tightest fit's.
    spread_starts_above: int = 100


class Progress:
    """Which consumed `dispatch` records are handled, per partition: the offset to commit
    is the lowest record not handled yet, or past the last one consumed (pure)."""

    def __init__(self) -> None:
        self.open: dict[int, set[int]] = {}
        self.next: dict[int, int] = {}

    def consumed(self, partition: int, offset: int) -> None:
        self.open.setdefault(partition, set()).add(offset)
        self.next[partition] = max(self.next.get(partition, 0), offset + 1)

    def handled(self, partition: int, offset: int) -> None:
        found = self.open.get(partition)
        if found is not None:
            found.discard(offset)

    def points(self) -> dict[int, int]:
        return {p: min(self.open[p], default=n) for p, n in self.next.items()}

    def forget(self, partition: int) -> None:
        self.open.pop(partition, None)
        self.next.pop(partition, None)


@dataclass
class WorkerInfo:
    worker_id: str
    capacity: Capacity
    free: Capacity
    labels: tuple[tuple[str, str], ...]
    mark: BeatMark  # the newest beat read
    received_s: float  # when it was read (this dispatcher's monotonic clock)
    running: set[Key] = field(default_factory=set)
    # Reserved: (need, until (ms of this dispatcher's clock), placed (monotonic s)).
    reserved: dict[Key, tuple[Resources, int, float]] = field(default_factory=dict)
    dead: bool = False
    booked: Timeline = field(default_factory=lambda: Timeline(Capacity(0.0, 0, 0)))
    maybe: dict[Key, int] = field(default_factory=dict)  # released early, until (ms)
    cut: tuple[str, ...] = ()  # what the worker limits cut from its last offer
    beat_ms: int | None = None  # the broker's append time of the newest beat read
    # No attempt whose start time is later was started by this worker: the highest start
    # horizon of its beats read (`armed_ms`), or for a beat without one (a worker from
    # before arming) its broker time plus the lease. None: not known.
    start_bound_ms: int | None = None
    taken_back: bool = False  # its unclaimed placements were placed again (suspected)
    listed_s: float = float("-inf")  # when `running` was read from a beat's list
    unlisted: bytes = b""  # the newest beat, when read without its list (else empty)

    def view(self, at_ms: int) -> WorkerView:
        """What this dispatcher believes is free on the worker in the second of `at_ms`."""
        booked = self.booked.booked(at_ms)
        free = Capacity(
            self.free.cpu - booked.cpu,
            self.free.memory_mb - booked.memory_mb,
            self.free.gpu - booked.gpu,
        )
        return WorkerView(self.worker_id, self.capacity, free, self.labels)

    def reserve(
        self, key: Key, need: Resources, start_ms: int, until_ms: int, placed_s: float
    ) -> None:
        """Book `need` on this worker for the second of its start: whole, because this
        dispatcher knows nothing of how long runs last (a run due now is about to hold
        its resources; the worker, which knows, judges finer once it lists the run)."""
        self.reserved[key] = (need, until_ms, placed_s)
        self.booked.plan(key, need, start_ms, self.booked.slot_ms)

    def release(self, key: Key) -> None:
        self.reserved.pop(key, None)
        self.booked.end(key)


class DispatcherKernel:
    """One dispatcher's settings, clients and soft state, and the sending of its records."""

    def __init__(
        self,
        settings: Settings,
        node_id: str,
        config: DispatcherConfig = DispatcherConfig(),
        clock: Clock = SYSTEM_CLOCK,
        clients: Clients = KAFKA_CLIENTS,
    ):
        self.settings = settings
        self.clients = clients
        self.clock = clock
        self.node_id = node_id
        self.config = config
        self.liveness = Liveness(config.suspect_after_s, config.dead_after_s)
        # Each worker's inbox topic (streams/inboxes.py).
        self.inboxes = Inboxes(settings, clients.admin(admin_config(settings)))
        self.workers: dict[str, WorkerInfo] = {}
        self.queue = FairQueue()
        self.pending: dict[str, DispatchRequest] = {}
        # second -> worker_id -> runs this dispatcher placed there to start in it (the
        # last minute's): what spreads a burst (DispatcherConfig.spread_starts_above).
        self.placed: dict[int, dict[str, int]] = {}
        self.origin: dict[str, tuple[int, int]] = {}  # pending key -> (partition, offset)
        # What this dispatcher placed, for releases: (run, attempt) -> (request, worker,
        # placed at); kept for a reservation's time.
        self.assigned: dict[Key, tuple[DispatchRequest, str, int]] = {}
        self.progress = Progress()
        self.committed: dict[int, int] = {}
        self.started = self.clock.monotonic()
        self.reading_since = self.started  # heartbeats read without interruption since
        self.declared_dead = 0
        # A verdict in progress: (asked at, heartbeat partition ends then, workers silent).
        self._check: tuple[float, dict[int, int], set[str]] | None = None
        self._drained_s = self.started  # the start of the last heartbeat read pass
        self._fetched_after_s = self.started  # beats read in this pass arrived after it
        self._committed_at = self.started
        self._unanswered_logged = -UNANSWERED_LOG_S  # the broker's silence, said this often
        self._stop = threading.Event()
        self.dispatch_topic = settings.topic("dispatch")
        self.heartbeats_topic = settings.topic("heartbeats")
        self.watch = GroupWatch(settings, f"dispatcher {node_id}")
        self.dispatch_consumer = self._new_consumer()
        self.heartbeat_consumer = self.clients.consumer(consumer_config(settings, None))
        self.releases_topic = settings.topic("worker-handbacks")
        self.release_consumer = self.clients.consumer(consumer_config(settings, None))
        self.producer = self.clients.producer(producer_config(settings))
        self.key: bytes | None = None  # the placement key, read at the start of run()

    def stop(self) -> None:
        self._stop.set()

    def _new_consumer(self) -> Consumer:
        return self.clients.consumer(
            consumer_config(self.settings, self.settings.group("dispatcher"), **self.watch.config())
        )

    @staticmethod
    def _held(info: WorkerInfo) -> set[Key]:
        """The attempts the worker's newest beat lists (read now if it was skimmed)."""
        if info.unlisted:
            try:
                beat = HEARTBEAT.decode(info.unlisted)
            except CodecError:  # its list is undecodable (read without it, it was not)
                return info.running
            return {(r.run_id, r.attempt) for r in beat.running}
        return info.running

    def _handled_when_delivered(
        self, where: tuple[int, int] | None, what: str
    ) -> Callable[[KafkaError | None, Message], None]:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                # The ledger's claim deadline dispatches the attempt again.
                log.warning("%s not delivered: %s", what, err)
            if where is not None:
                self.progress.handled(*where)

        return delivered

    def _send(
        self,
        job_id: str,
        record: WorkerLost | DispatchFailed,
        where: tuple[int, int] | None = None,
    ) -> None:
        self._produce(
            self.settings.topic("job-log"),
            job_id,
            JOB_LOG.encode(record),
            self._handled_when_delivered(where, f"{type(record).__name__}"),
        )

    def _produce(
        self,
        topic: str,
        key: str,
        value: bytes,
        delivered: Callable[[KafkaError | None, Message], None],
    ) -> None:
        """produce(); a full local queue (the broker down for a while) counts as a failed
        delivery: the ledger's claim deadline dispatches the attempt again."""
        try:
            self.producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
        except BufferError:
            delivered(KafkaError(KafkaError._QUEUE_FULL), None)  # type: ignore[arg-type]
