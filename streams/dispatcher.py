"""The dispatcher and failure detector (one per scheduler node).

It follows `heartbeats` (every worker's capacity, what it has free in the busiest second
of the coming minute, held attempts) and places the runs of its `dispatch` partitions:
best fit against each worker's free resources minus the reservations it made itself.
Reservations are in time (streams/core/timeline.py): a placement books the run's
resources for the second of its start (`not_before`), not from the moment it is placed,
so runs claimed ahead do not block runs due in other seconds; it is released when the
worker's heartbeat lists the attempt (the worker then counts it, with its own estimate
of the run's duration), when a heartbeat fetched more than a second after the placement
does not list it (the worker handed it back), or after `reservation_ms`.
Runs that fit nowhere now wait in a fair queue (priority first, then round-robin across
owners) and are placed when capacity frees; a run no known worker could ever fit fails
with the reason. Placement is only a proposal: the worker checks its own room before it
claims (and hands a run it has no room for straight back to `dispatch`), and the
ledger's claim deadline re-dispatches anything lost, so the dispatcher's state is soft
and is rebuilt from recent heartbeats after a restart.

Offsets. The dispatcher commits its `dispatch` offsets (group `dispatcher`), so a
restart or a rebalance resumes where it left off instead of re-sending every assignment
of the retained log (phantom reservations, stale claims). A record is handled once the
assignment or the DispatchFailed it led to is delivered (or a newer record for the same
attempt replaced it); the offset committed for a partition, every second and on
revocation and shutdown, is its lowest record not handled yet. A record still waiting
for room holds the point, but not for long: the ledger dispatches an unclaimed attempt
again at its claim deadline, which replaces it. After a crash the records handled since
the last commit are sent again (at least once): about a second's worth.

Failure detection (the judgement itself is pure: `streams/core/liveness.py`): one clock.
Liveness is judged only on this dispatcher's
`time.monotonic()`: each worker's last beat is remembered by the time it was *received*
(read from `heartbeats`), never by the time the worker stamped on it, so no worker's
clock, ahead or behind, moves a verdict. Which of two beats of one worker is newer is
told by their order in the log (one partition per worker id), or else by the worker's
own stamps (one clock). A worker is suspected when no beat was received for
`suspect_after_s` (4 s): no new placements, and what this dispatcher placed there that no
beat listed yet is placed again elsewhere. It is declared dead after `dead_after_s`
(11 s): each attempt it held gets a WorkerLost on its job's log, carrying the broker
time by which its lease had ended (the last beat read's append time plus the lease and
a margin), so the ledger releases the runs due after it (the ledger ignores a verdict
if the attempt moved on). The verdict is taken in two steps: when
a worker looks dead the dispatcher asks the broker where that worker's heartbeat
partition ends, and declares it dead only once it has read up to there and the worker
was still silent when it asked; so every beat the broker had acknowledged by then
cancels the verdict. And never before `dead_after` has passed on this clock since the
dispatcher started (or restarted, after a consumer error or a question the broker did
not answer) reading heartbeats: one that just started cannot tell a silent worker from
one whose beats it has not read.
Why it is safe (the letters and numbers of streams/core/timing.py): a worker's lease ends
L (8 s) after it *made* its last beat that renewed it, on its own clock, and it kills its
runs then; a beat renews the lease only if the broker acknowledged it within the ack
window A (2 s) of its making. The verdict comes D >= L + A (11 s) of the dispatcher's
clock after the *receipt* of the last beat it read, and a beat is received after it is
made: that beat's lease ended before the verdict, whatever the offset between the two
clocks (their rates agree to far better than a second in 11 s). A later beat that could
still have extended the lease was made within L of that one and acknowledged within A,
so before the verdict's question to the broker: it would have been read and cancelled
the verdict; a beat made after the lease lapsed finds the worker's runs already killed.
Comparing the dispatcher's wall clock with the worker's stamp instead would let a worker
clock behind the dispatcher's bring the verdict before the lease ends. How much history
to read at start (the last `history_s`, by `offsets_for_times` against the broker's
append times) does compare this machine's clock with the broker's: a skew only reads a
little more or less history, and no verdict depends on it.

A broker outage. The loop keeps going: the start waits for the broker to say where to read
heartbeats from, consumer errors are logged (a heartbeat consumer error restarts the
reading clock, so no worker is judged on beats it could not read), and a placement the
full local queue refuses counts as undelivered (the claim deadline re-dispatches it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from schemas.codec import DISPATCH, HEARTBEAT, JOB_LOG, WORKER_INBOX, CodecError
from schemas.records import (
    DispatchFailed,
    DispatchRequest,
    RunReleased,
    WorkerAssignment,
    WorkerCapacity,
    WorkerLost,
)
from schemas.spec import Resources
from streams import metrics
from streams.core.clock import SYSTEM_CLOCK, Clock, broker_stamp
from streams.core.ids import job_of
from streams.core.liveness import BeatMark, Liveness, newer
from streams.core.placement import (
    Capacity,
    FairQueue,
    Item,
    WorkerView,
    could_ever_fit,
    spread_fit,
)
from streams.core.seals import seal
from streams.core.timeline import Timeline
from streams.core.timing import TIMING
from streams.inboxes import Inboxes
from streams.kafka import (
    KAFKA_CLIENTS,
    Clients,
    GroupWatch,
    abandon_consumer,
    admin_config,
    consumer_config,
    producer_config,
    until_done,
)
from streams.lifecycle import run_steps
from streams.placement_key import placement_key
from streams.settings import Settings

log = logging.getLogger("cronlog.dispatcher")
_PLACED = metrics.PLACEMENTS.labels("placed")
_NEVER_FITS = metrics.PLACEMENTS.labels("never_fits")
# A placement not listed by a heartbeat fetched this long after it was refused or lost.
REFUSAL_MARGIN_S = 1.0
# A beat lists every attempt its worker holds. Holding a burst claimed ahead, that is tens
# of thousands, a beat a second from each worker: decoding those lists took 58 % of the
# dispatcher's time and placements fell behind by a minute (100,000 jobs over one
# minute, docs/performance.md, "Bursts with default options"). So a list this long is
# read at most every LIST_EVERY_S; the beats between are read without it (their
# capacity, free figure and liveness count at once). What the list decides waits that
# long: the reservations it confirms or ends hold a little longer. A verdict reads the
# newest beat's list whole.
LONG_LIST = 1000
LIST_EVERY_S = 5.0
# How often the handled dispatch offsets are committed.
COMMIT_EVERY_S = 1.0
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


class Dispatcher:
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

    def _subscribe(self) -> None:
        self.dispatch_consumer.subscribe(
            [self.dispatch_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _replace_consumer(self) -> None:
        """A consumer stuck out of its group (GroupWatch): a new member in its place. Its
        close serves the revocation (deliver, commit what is handled, drop the rest)."""
        abandon_consumer(self.dispatch_consumer, "dispatch")
        self.dispatch_consumer = self._new_consumer()
        self._subscribe()

    def run(self) -> None:
        run_steps(self.open, self.step, self.close, self._stop)

    def open(self) -> bool:
        """Read the placement key, join the group, follow heartbeats and releases
        (False: stopped before it could). `run` is `open`, `step` until stopped, `close`;
        a test drives the steps itself."""
        self._lag = metrics.ConsumerLag("dispatcher", self.settings.topic_prefix)
        try:
            self.key = placement_key(self.settings, self._stop, self.clients)
        except KeyError:
            return False  # stopped while waiting for the broker
        self._subscribe()
        self._follow_heartbeats()
        self.release_consumer.assign(
            [
                TopicPartition(self.releases_topic, p, OFFSET_END)
                for p in range(self.settings.partitions)
            ]
        )
        return True

    def step(self) -> None:
        """One turn: read beats, releases and dispatch requests; expire reservations,
        judge liveness, place what waits; commit what is handled now and then."""
        if self.watch.stuck():
            self._replace_consumer()
        self._read_heartbeats()
        self._read_releases()
        for msg in self.dispatch_consumer.consume(500, timeout=0.05):
            self._consumed(msg)
        now = int(self.clock.time() * 1000)
        self._expire(now)
        self._detect(now)
        self._take_back(self.clock.monotonic())
        self._place(now)
        self.producer.poll(0)
        if self.clock.monotonic() - self._committed_at >= COMMIT_EVERY_S:
            self._commit(asynchronous=True)
            self._report_reserved()
        self._lag.report(self.dispatch_consumer)

    def close(self) -> None:
        self.producer.flush(10)
        self._commit(asynchronous=False)
        self.dispatch_consumer.close()
        self.heartbeat_consumer.close()
        self.release_consumer.close()

    def _report_reserved(self) -> None:
        cpu, memory_mb, gpu = 0.0, 0, 0
        for info in self.workers.values():
            for need, _, _ in info.reserved.values():
                cpu += need.cpu
                memory_mb += need.memory_mb
                gpu += need.gpu
        metrics.RESERVED.labels("cpu").set(cpu)
        metrics.RESERVED.labels("memory_mb").set(memory_mb)
        metrics.RESERVED.labels("gpu").set(gpu)

    # -- dispatch offsets ----------------------------------------------------------------------
    def _consumed(self, msg: Message) -> None:
        if msg.error() is not None:
            log.warning("dispatch consumer error: %s", msg.error())
            return
        where = (msg.partition() or 0, msg.offset() or 0)
        self.progress.consumed(*where)
        if not self._queue(msg.value() or b"", where):
            self.progress.handled(*where)

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

    def _commit(self, asynchronous: bool, partitions: set[int] | None = None) -> None:
        """Commit the handled offsets that moved (of `partitions`, else of all)."""
        self._committed_at = self.clock.monotonic()
        points = {
            p: o
            for p, o in self.progress.points().items()
            if (partitions is None or p in partitions) and o > self.committed.get(p, -1)
        }
        if not points:
            return
        offsets = [TopicPartition(self.dispatch_topic, p, o) for p, o in points.items()]
        try:
            if asynchronous:
                self.dispatch_consumer.commit(offsets=offsets, asynchronous=True)
            else:
                self.dispatch_consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("could not commit dispatch offsets %s: %s", points, exc)
            return
        self.committed.update(points)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group's committed offsets are looked up after this (a subscribed consumer
        # joined the group, so its coordinator is known).
        if consumer is not self.dispatch_consumer:  # a replaced consumer, closing late
            return
        self.watch.reset()
        for tp in partitions:
            self.committed.pop(tp.partition, None)
            self.progress.forget(tp.partition)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Deliver what was placed, commit what is handled, and leave the rest of these
        partitions (still queued here) to their next owner, which reads it again."""
        if consumer is not self.dispatch_consumer:  # a replaced consumer, closing late
            return
        self.producer.flush(5)
        self._commit(asynchronous=False, partitions={tp.partition for tp in partitions})
        self._drop(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.dispatch_consumer:  # a replaced consumer, closing late
            return
        self._drop(partitions)  # no commit: the group has moved on without this member

    def _drop(self, partitions: list[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        for key, (partition, _) in list(self.origin.items()):
            if partition in gone:
                del self.origin[key]
                self.pending.pop(key, None)
                self.queue.remove(key)
        for partition in gone:
            self.progress.forget(partition)
            self.committed.pop(partition, None)

    # -- heartbeats ---------------------------------------------------------------------------
    def _follow_heartbeats(self) -> None:
        # The history to read is found by this machine's clock against the broker's
        # append times: a skew reads a little more or less of it, and no verdict depends
        # on how much was read (a worker is judged only on beats received from now on).
        since = int((self.clock.time() - self.config.history_s) * 1000)
        partitions = [
            TopicPartition(self.heartbeats_topic, p, since) for p in range(self.settings.partitions)
        ]
        offsets = until_done(
            lambda: self.heartbeat_consumer.offsets_for_times(partitions, timeout=10),
            "finding where to read heartbeats from",
            self._stop,
        )
        if offsets is None:  # stopped while the broker was down
            return
        self.reading_since = self.clock.monotonic()
        self.heartbeat_consumer.assign(offsets)

    def _read_heartbeats(self) -> None:
        started = self.clock.monotonic()
        # Every beat read in this pass reached the client after the previous pass began
        # (that pass read the client's queue empty).
        self._fetched_after_s = self._drained_s
        while True:
            batch = self.heartbeat_consumer.consume(1000, timeout=0.01)
            received_s = self.clock.monotonic()
            for msg in batch:
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        # Beats may have been missed: judge nobody until a full
                        # dead_after of uninterrupted reading has passed again.
                        log.warning("heartbeat consumer error: %s", error)
                        self.reading_since = received_s
                    continue
                if msg.value():
                    self._beat(
                        msg.value() or b"",
                        msg.partition() or 0,
                        msg.offset() or 0,
                        received_s,
                        broker_stamp(msg.timestamp()),
                        msg.key(),
                    )
            if len(batch) < 1000:
                break
        self._drained_s = started

    def _beat(
        self,
        raw: bytes,
        partition: int,
        offset: int,
        received_s: float,
        appended_ms: int | None = None,
        beat_key: bytes | None = None,
    ) -> None:
        known = self.workers.get(beat_key.decode(errors="replace")) if beat_key else None
        skim = known is not None and self._skims(known, received_s)
        try:
            beat = HEARTBEAT.decode_without(raw, "running") if skim else HEARTBEAT.decode(raw)
            if skim and self.workers.get(beat.worker_id) is not known:
                skim, beat = False, HEARTBEAT.decode(raw)  # keyed as another worker
        except CodecError as exc:
            log.error("undecodable heartbeat: %s", exc)
            return
        worker_id = beat.worker_id
        # The broker's append time orders beats across partitions (a forged stamp must
        # not); the beat's own stamp only where the topic is not broker-stamped.
        mark = BeatMark(partition, offset, beat.at_ms if appended_ms is None else appended_ms)
        info = self.workers.get(worker_id)
        if info is not None and not newer(info.mark, mark):
            return  # an older beat (replay, reordering)
        offer = self.settings.worker_limits.bound(
            _capacity(beat.capacity), _capacity(beat.free), beat.labels
        )
        if info is None:
            info = WorkerInfo(worker_id, offer.capacity, offer.free, offer.labels, mark, received_s)
            self.workers[worker_id] = info
        if offer.cut:
            metrics.WORKER_OFFERS_BOUNDED.inc()
            if offer.cut != info.cut:  # once per change, not once per beat
                log.warning(
                    "worker %s offers more than allowed: %s", worker_id, "; ".join(offer.cut)
                )
        info.cut = offer.cut
        if info.dead:
            log.warning("worker %s is back after being declared dead", worker_id)
            metrics.WORKER_VERDICTS.labels("back").inc()
        info.capacity, info.free, info.mark, info.received_s, info.dead = (
            offer.capacity,
            offer.free,
            mark,
            received_s,
            False,
        )
        info.labels = offer.labels
        info.beat_ms, info.taken_back = appended_ms, False
        if skim:
            info.unlisted = raw
            return
        running = {(r.run_id, r.attempt) for r in beat.running}
        info.running, info.listed_s, info.unlisted = running, received_s, b""
        for key, (_, _, placed_s) in list(info.reserved.items()):
            if key in running:
                info.release(key)  # the worker's own free figure now includes it
            elif placed_s + REFUSAL_MARGIN_S < self._fetched_after_s:
                # Placed well before this beat reached us and not held: the worker handed
                # it back (no room) or lost it. Its free figure is the news now. The worker
                # may still have claimed it unseen (a view a moment old): should it die,
                # the verdict names this attempt too, until the reservation would have
                # ended.
                info.maybe[key] = info.reserved[key][1]
                info.release(key)

    @staticmethod
    def _skims(info: WorkerInfo, received_s: float) -> bool:
        """Whether to read this worker's next beat without its list (`LIST_EVERY_S`)."""
        return len(info.running) >= LONG_LIST and received_s - info.listed_s < LIST_EVERY_S

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

    def _read_releases(self) -> None:
        """Assignments a worker had no room for: placed again at once, elsewhere (the
        worker's booking of it stays until its next heartbeat). A release only names a
        run: it counts when this dispatcher placed that attempt on that worker, so a
        worker can make it place again only what it placed there. One not taken (another
        dispatcher's, or read after a restart) is left to the claim deadline; that is
        why these are read from the end, with no group and no commits."""
        for msg in self.release_consumer.consume(500, timeout=0):
            if msg.error() is not None or not msg.value():
                continue
            try:
                back = JOB_LOG.decode(msg.value() or b"")
            except CodecError as exc:
                log.warning("undecodable release skipped: %s", exc)
                continue
            if not isinstance(back, RunReleased):
                continue
            key = (back.run_id, back.attempt)
            placed = self.assigned.get(key)
            if placed is None or placed[1] != back.worker_id:
                continue
            del self.assigned[key]
            self._place_again(placed[0])

    def _place_again(self, request: DispatchRequest) -> None:
        pending = f"{request.run_id}#{request.attempt}"
        if pending not in self.pending:
            self.pending[pending] = request
            self.queue.push(Item(pending, request.resources, request.priority, request.owner))

    def _take_back(self, now_s: float) -> None:
        """A worker suspected (silent for `suspect_after_s`) claims nothing more in time
        if it is dead: what this dispatcher placed there and no beat listed yet is placed
        again elsewhere now, not at the claim deadline. Should the worker be alive after
        all, the ledger grants the first of the two claims (both placements are sealed)
        and refuses the other; its booking stays until a beat comes, so nothing goes
        there again meanwhile."""
        for info in self.workers.values():
            if info.dead or info.taken_back or not self.liveness.suspected(info.received_s, now_s):
                continue
            info.taken_back = True
            listed = self._held(info) if info.unlisted else set()  # a skimmed beat's list
            again = [
                key
                for key in info.reserved
                if key not in listed
                and (placed := self.assigned.get(key)) is not None
                and placed[1] == info.worker_id
            ]
            for key in again:
                self._place_again(self.assigned.pop(key)[0])
            if again:
                metrics.PLACEMENTS.labels("taken_back").inc(len(again))
                log.warning(
                    "worker %s: no beat received for %.1f s: suspected, %d unclaimed "
                    "placements placed again",
                    info.worker_id,
                    now_s - info.received_s,
                    len(again),
                )

    # -- queueing and placing ----------------------------------------------------------------
    def _queue(self, raw: bytes, where: tuple[int, int] | None = None) -> bool:
        """Queue a dispatch record for placement; False if there is nothing to place."""
        if not raw:
            return False
        try:
            request = DISPATCH.decode(raw)
        except CodecError as exc:
            log.error("undecodable dispatch record: %s", exc)
            return False
        key = f"{request.run_id}#{request.attempt}"
        if key in self.pending:
            self.queue.remove(key)
            replaced = self.origin.pop(key, None)
            if replaced is not None:
                self.progress.handled(*replaced)  # this newer record stands for it
        self.pending[key] = request
        if where is not None:
            self.origin[key] = where
        self.queue.push(Item(key, request.resources, request.priority, request.owner))
        return True

    def _alive(self, now_s: float) -> list[WorkerInfo]:
        return [
            w
            for w in self.workers.values()
            if not w.dead and not self.liveness.suspected(w.received_s, now_s)
        ]

    def _place(self, now: int) -> None:
        if not len(self.queue):
            return
        alive = self._alive(self.clock.monotonic())

        def fits(item: Item) -> bool:
            request = self.pending[item.key]
            start, key = request.not_before_ms, (request.run_id, request.attempt)
            # A worker that handed this run back (no room, by its own reckoning) still
            # holds the booking of that placement: not there again until its next
            # heartbeat says what it has free.
            candidates = [w.view(start) for w in alive if key not in w.reserved]
            second = start // 1000
            chosen = spread_fit(
                item.need,
                candidates,
                self.placed.get(second, {}),
                self.config.spread_starts_above,
            )
            if chosen is None:
                return False
            self._assign(
                self.pending.pop(item.key), chosen.worker_id, now, self.origin.pop(item.key, None)
            )
            return True

        self.queue.drain(fits)
        settled = self.clock.monotonic() - self.started > self.config.settle_s
        if settled and self.workers:
            everyone = [w.view(now) for w in self.workers.values() if not w.dead]
            for key, request in list(self.pending.items()):
                if everyone and not could_ever_fit(request.resources, everyone):
                    self.queue.remove(key)
                    del self.pending[key]
                    _NEVER_FITS.inc()
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
                        self.origin.pop(key, None),
                    )

    def _assign(
        self, request: DispatchRequest, worker_id: str, now: int, where: tuple[int, int] | None
    ) -> None:
        info = self.workers[worker_id]
        _PLACED.inc()
        key = (request.run_id, request.attempt)
        self.assigned.pop(key, None)  # kept in the order made: `_expire` reads the front
        self.assigned[key] = (request, worker_id, now)
        placed = self.placed.setdefault(request.not_before_ms // 1000, {})
        placed[worker_id] = placed.get(worker_id, 0) + 1
        info.reserve(
            (request.run_id, request.attempt),
            request.resources,
            request.not_before_ms,
            max(now, request.not_before_ms) + self.config.reservation_ms,
            self.clock.monotonic(),
        )
        delivered = self._handled_when_delivered(where, f"assignment of {request.run_id}")
        try:
            inbox = self.inboxes.topic(worker_id)
        except KafkaException as exc:  # unsent, as if undelivered: placed again
            delivered(exc.args[0], None)  # type: ignore[arg-type]
            return
        self._produce(
            inbox,
            worker_id,
            WORKER_INBOX.encode(WorkerAssignment(worker_id, now, self._sealed(request, worker_id))),
            delivered,
        )

    def _sealed(self, request: DispatchRequest, worker_id: str) -> DispatchRequest:
        """The copy of `request` assigned to `worker_id`: with the seal of that placement,
        without which the ledger grants the worker no claim (streams/core/seals.py)."""
        if self.key is None:
            self.key = placement_key(self.settings, self._stop, self.clients)
        mark = seal(self.key, request.run_id, request.attempt, worker_id)
        return replace(request, placement=mark)

    def _expire(self, now: int) -> None:
        for second in [s for s in self.placed if s < now // 1000 - 60]:
            del self.placed[second]
        # The oldest assignments first (`_assign`): stop at the first still kept, not
        # scan them all each pass (35 s of them at 1,000 runs/s is 35,000).
        forget = now - self.config.reservation_ms
        while self.assigned:
            key, (_, _, at) = next(iter(self.assigned.items()))
            if at >= forget:
                break
            del self.assigned[key]
        for info in self.workers.values():
            for key, (_, until, _) in list(info.reserved.items()):
                if until <= now:
                    info.release(key)
            for key, until in list(info.maybe.items()):
                if until <= now:
                    del info.maybe[key]

    # -- failure detection ---------------------------------------------------------------------
    def _detect(self, now: int) -> None:
        """Two steps. When workers look dead, ask the broker where their heartbeat
        partitions end; once every beat up to there has been read, declare dead those of
        them still silent as of that question. Any beat the broker had acknowledged by
        then has been read first, so it cancels the verdict."""
        now_s = self.clock.monotonic()
        if self._check is None:
            silent = {
                info.worker_id
                for info in self.workers.values()
                if not info.dead and self.liveness.dead(info.received_s, self.reading_since, now_s)
            }
            if silent:
                ends = self._ends({self.workers[w].mark.partition for w in silent})
                if ends is not None:
                    self._check = (now_s, ends, silent)
                else:
                    # The broker does not answer this dispatcher: what it did not read
                    # meanwhile may hold beats, so nobody is judged until a full
                    # dead_after of reading after it answers again (the workers beat
                    # within a second of its return, and are not declared dead for an
                    # outage of the broker's).
                    self.reading_since = now_s
            return
        asked_s, ends, silent = self._check
        if not self._read_to(ends):
            if now_s - asked_s > self.liveness.dead_after_s:
                self._check = None  # not reached in all that time: ask again
            return  # read them first (the next pass)
        self._check = None
        for worker_id in sorted(silent):
            info = self.workers[worker_id]
            if info.dead or not self.liveness.dead(info.received_s, self.reading_since, asked_s):
                continue  # a beat came, or reading was interrupted: judged afresh later
            info.dead = True
            self.declared_dead += 1
            metrics.WORKER_VERDICTS.labels("lost").inc()
            held = self._held(info) | set(info.reserved) | set(info.maybe)
            log.warning(
                "worker %s: no beat received for %.1f s: declared dead, %d attempts lost",
                info.worker_id,
                now_s - info.received_s,
                len(held),
            )
            # No beat after the last one read renewed the worker's lease (it would have
            # been read first), so the lease ended by that beat's broker time plus the
            # lease: a run whose start time is later never started.
            lease_ended = (
                None if info.beat_ms is None else info.beat_ms + self.config.lease_bound_ms
            )
            for run_id, attempt in sorted(held):
                job_id = job_of(run_id)
                self._send(
                    job_id, WorkerLost(job_id, run_id, attempt, info.worker_id, now, lease_ended)
                )
            for key in list(info.reserved):
                info.release(key)
            info.maybe.clear()

    def _ends(self, partitions: set[int]) -> dict[int, int] | None:
        """Where these heartbeat partitions end now, by the broker (None if it cannot
        tell: no verdict then)."""
        try:
            return {
                p: self.heartbeat_consumer.get_watermark_offsets(
                    TopicPartition(self.heartbeats_topic, p), 2, cached=False
                )[1]
                for p in partitions
            }
        except KafkaException as exc:
            if self.clock.monotonic() - self._unanswered_logged >= UNANSWERED_LOG_S:
                self._unanswered_logged = self.clock.monotonic()
                log.warning(
                    "cannot tell whether every heartbeat was read (%s): no verdict until "
                    "the broker answers and %.0f s of beats were read",
                    exc,
                    self.liveness.dead_after_s,
                )
            return None

    def _read_to(self, ends: dict[int, int]) -> bool:
        positions = self.heartbeat_consumer.position(
            [TopicPartition(self.heartbeats_topic, p) for p in ends]
        )
        return all(tp.offset >= ends[tp.partition] for tp in positions)

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


def _capacity(offered: WorkerCapacity) -> Capacity:
    return Capacity(offered.cpu, offered.memory_mb, offered.gpu)
