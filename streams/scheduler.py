"""The scheduler: per owned partition, timers for due jobs and run deadlines; proposes.

It follows the ledger's committed state: the compacted `jobs` and `runs` topics
(read_committed). When the group gives it partition p it reads partition p of both from
the beginning, which rebuilds that partition's heaps from the committed state, and then
keeps following new writes; on revocation it drops them. The range assignor hands one
member the same partition number of both topics. A job state is learnt from its
`cronlog-timers` header (streams/headers.py) without decoding it. Catching up, it
decodes only the newest value of each key that needs decoding (run states, job states
written without the header): until a topic-partition's end is first reached (partition
EOF), or for `CATCH_UP_MAX_S` at most, it keeps the raw bytes of the newest such value
per key and decodes those at the end. The compacted topics still hold every value
written since their last compaction (the active segment is never compacted), and
decoding each would make a takeover grow with that history.

Reading ahead. A node taking over from a dead one first waits out the dead member's
session (6 s) before the group assigns anything, then would have to read every partition
(docs/performance.md has the figures). So from its start until its first assignment the scheduler
already reads every partition of both topics with a consumer outside the group, into
timers of their own; proposals come only from what it owns. On the first assignment it
keeps what it read of the partitions it got, and each of their topic-partitions is read
on from the read-ahead's position (or from the start if it read nothing of it), so every
record is learnt once and in order; the rest is dropped and the read-ahead ends. Later
assignments read from the start as before. It stops at `WARM_MAX_KEYS` keys, so a node of
a large cluster holds other nodes' timers only briefly and within a bound.

Every tick it proposes to `job-log` what is due: `FireProposed(job, next_due)` up to
`lead_ms` early (pre-dispatch), earlier within a look-ahead horizon at a bounded rate
(streams/core/proposals.py says when), and `DeadlineReached(run, attempt, kind)` once a
run's deadline passed. Proposals are only proposals: a duplicate, a stale one or a
zombie's is rejected by the ledger, so a proposal that has not been answered by a state
change is simply repeated after `repeat_ms`, unless the ledger has not read it yet: then
the repeat would only be more for a ledger that is behind to read, and it waits
(streams/core/unread.py; the node learns the ledger group's offsets every second).

A broker outage. The loop never stops for it: the consumers return errors (ignored; they
reconnect by themselves, and on the way back the group gives the partitions again, which
rebuilds the timers from the committed state), proposals wait in the producer's queue
and are delivered when the broker is back (stale ones are decided by the ledger by the
misfire policy), and a proposal the full queue refuses is dropped, to be repeated.

One clock: "due" means due by the broker's time, not this node's wall clock (a node 10
minutes ahead would propose everything 10 minutes early, wasted on the ledger's "too
early"; one behind would propose late: misfires). The clock is a `BrokerClock`
(streams/core/clock.py), a lower bound of the broker's time fed by the delivery reports
of the node's proposals (job-log has LogAppendTime) and by the heartbeats workers send
(also LogAppendTime, read from their end), which keep it fed while the node has nothing
to propose. Before its first sample it falls back to the wall clock; if proposals were
made that way and the wall clock turns out to be off, the timers they left (repeats
scheduled by a wrong clock) are rebuilt from the committed state, as after an
assignment.

Why not a Faust agent and table: a Faust table cannot follow a topic another process
writes (it only reads its changelog during recovery), and Faust consumes
read_uncommitted outside its exactly_once mode, which would expose the ledger's aborted
transactions. The scheduler therefore reads the ledger's state with a read_committed
confluent-kafka consumer, and stays a pure proposer like the Faust agents.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from schemas.codec import JOB_LOG, JOB_STATE, RUN_STATE, CodecError
from schemas.records import DeadlineKind, DeadlineReached, FireProposed
from streams import metrics
from streams.core.clock import PROBE_JOB_ID, SYSTEM_CLOCK, BrokerClock, Clock, broker_stamp
from streams.core.duequeue import DueQueue
from streams.core.ids import job_of
from streams.core.proposals import (
    FireTimers,
    Pacer,
    ProposalPolicy,
    take_early,
)
from streams.core.unread import UnreadProposals
from streams.headers import Deadline, Timers, deadline_of, job_timers, run_deadline, timers_of
from streams.kafka import (
    KAFKA_CLIENTS,
    Clients,
    GroupWatch,
    abandon_consumer,
    consumer_config,
    producer_config,
)
from streams.lifecycle import run_steps, trim_malloc_once
from streams.settings import Settings

log = logging.getLogger("cronlog.scheduler")
_FIRES = metrics.PROPOSALS.labels("fire")
_DEADLINES = metrics.PROPOSALS.labels("deadline")
_FIRES_HELD = metrics.REPEATS_HELD.labels("fire")
_DEADLINES_HELD = metrics.REPEATS_HELD.labels("deadline")

ProposalTime = Callable[[], int]  # broker ms
# A wall clock this far off the broker's makes the proposals made by it before the first
# broker sample worth redoing (their repeats would come that much late).
RESYNC_SKEW_MS = 1000
# With no sample of the broker's time for this long (nothing proposed, no heartbeat), the
# node writes a clock probe (streams/core/clock.py): a node whose wall clock is an hour
# behind would otherwise see nothing due and never learn the broker's time, and a clock
# carried forward for long drifts (1 ms a second at most, see BrokerClock).
PROBE_AFTER_S = 5.0
# How long a node without a broker sample waits for its first probe's answer before it
# proposes by its wall clock.
PROBE_WAIT_S = 2.0
# A burst this large is logged when it begins and ends.
BURST_LOGGED = 1000
# A catch-up that has not reached the end by then decodes what it kept and goes on
# record by record: it is only a shortcut, and a partition must never wait on it.
CATCH_UP_MAX_S = 10.0
# Reading ahead before the first assignment (module docstring) stops at this many keys,
# so a node that will own few partitions of a large registry holds the rest only briefly
# and never beyond this (~250 bytes a job in the timers, its id included).
WARM_MAX_KEYS = 2_000_000
# How often the node asks for the ledger group's committed offsets (`UnreadProposals`).
LEDGER_READ_EVERY_S = 1.0


@dataclass
class PartitionTimers:
    fires: FireTimers
    deadlines: DueQueue[str] = field(default_factory=DueQueue)  # run_id -> deadline
    runs: dict[str, tuple[str, int, DeadlineKind]] = field(default_factory=dict)
    # run_id -> when its deadline notice was last sent (broker ms), until the run's next
    # state: a repeat waits while the ledger has not read that one.
    noticed: dict[str, int] = field(default_factory=dict)
    # Catching up: topic -> key -> the newest value read so far that needs decoding (a
    # run state, a job state without the timers header), for the topics whose end has not
    # been reached yet (module docstring).
    backlog: dict[str, dict[str, bytes]] = field(default_factory=dict)
    since: float = 0.0  # when its catch-up began (monotonic)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    proposals: ProposalPolicy = field(default_factory=ProposalPolicy)
    tick_s: float = 0.05


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        node_id: str,
        config: SchedulerConfig = SchedulerConfig(),
        propose_at: ProposalTime | None = None,
        clock: Clock = SYSTEM_CLOCK,
        clients: Clients = KAFKA_CLIENTS,
    ):
        """`propose_at`: the time to propose by, by default the broker's (see the
        module); `clock`: this machine's clocks, which carry the broker's forward."""
        self.settings = settings
        self.clients = clients
        self.node_id = node_id
        self.config = config
        self.clock = clock
        self.broker = BrokerClock()
        self.propose_at = propose_at or self._broker_now
        self._own_clock = propose_at is None
        self._in_burst = False  # a burst of BURST_LOGGED or more is being proposed
        self._sampled = -math.inf  # monotonic time of the last broker sample
        self._probed = -math.inf  # and of the last clock probe sent
        self._unsynced = False  # proposals were made by the fallback wall clock
        self.jobs_topic = settings.topic("jobs")
        self.runs_topic = settings.topic("runs")
        self.job_log = settings.topic("job-log")
        self.timers: dict[int, PartitionTimers] = {}
        # Reading ahead until the first assignment (module docstring): every partition's
        # timers, from a consumer outside the group.
        self._warm: Consumer | None = None
        self._warm_timers: dict[int, PartitionTimers] = {}
        self.assigned = False  # a first assignment came (readiness)
        self._gauged = 0.0
        self.early = Pacer(config.proposals, self.propose_at())
        self.proposed = 0
        self.dropped = 0  # proposals the full local queue refused (broker down)
        self.unread = UnreadProposals()
        self.held = 0  # deadline notices held: the ledger had not read the last one
        # The ledger group's committed offsets, read without joining it (isolation
        # read_uncommitted: the newest committed, not waiting on a transaction's).
        self.ledger_offsets = self.clients.offsets_reader(
            consumer_config(
                settings, settings.group("ledger"), **{"isolation.level": "read_uncommitted"}
            )
        )
        self._offsets_asked = -math.inf  # monotonic time of the last ask
        self._offsets: Future[list[TopicPartition]] | None = None
        self._stop = threading.Event()
        self.watch = GroupWatch(settings, f"scheduler {node_id}")
        self.consumer = self._new_consumer()
        self.producer = self.clients.producer(producer_config(settings))
        # Heartbeats, from their end, only for their broker stamps: the clock's samples
        # while this node has nothing to propose.
        self.beats = self.clients.consumer(
            consumer_config(settings, None, **{"isolation.level": "read_uncommitted"})
        )

    def stop(self) -> None:
        self._stop.set()

    def _new_consumer(self) -> Consumer:
        return self.clients.consumer(
            consumer_config(
                self.settings,
                self.settings.group("scheduler"),
                # The end of a catch-up (module docstring); the end is known only when a
                # fetch comes back empty, which the broker holds up to fetch.wait.max.ms
                # (500 ms by default): 100 ms, ten empty fetches a second when idle.
                **{"enable.partition.eof": True, "fetch.wait.max.ms": 100, **self.watch.config()},
            )
        )

    def fresh_timers(self) -> PartitionTimers:
        """A partition's timers before its catch-up: both topics' backlogs open (for the
        assignment, the warm-up, and tests/integration/test_scheduler_catchup.py)."""
        return PartitionTimers(
            FireTimers(self.config.proposals, bulk=True),
            backlog={self.jobs_topic: {}, self.runs_topic: {}},
            since=self.clock.monotonic(),
        )

    def _subscribe(self) -> None:
        self.consumer.subscribe(
            [self.jobs_topic, self.runs_topic],
            on_assign=self.on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )

    def _replace_consumer(self) -> None:
        """A consumer stuck out of its group (GroupWatch): a new member in its place. The
        timers go with the old one and are rebuilt from the committed state on the new
        assignment, as after any rebalance."""
        old = self.consumer
        abandon_consumer(old, "scheduler")
        self.timers.clear()
        self.consumer = self._new_consumer()
        self._subscribe()

    def run(self) -> None:
        run_steps(self.open, self.step, self.close, self._stop)

    def open(self) -> bool:
        """Join the group, start the warm-up, follow the heartbeats' stamps (True). `run` is
        `open`, `step` until stopped, `close`; a test drives the steps itself."""
        self._lag = metrics.ConsumerLag("scheduler", self.settings.topic_prefix)
        self._subscribe()
        self.start_warm_up()
        beats = self.settings.topic("heartbeats")
        self.beats.assign(
            [TopicPartition(beats, p, OFFSET_END) for p in range(self.settings.partitions)]
        )
        return True

    def step(self) -> None:
        """One turn: read the state topics (serving rebalances), then propose what is due."""
        warming = self._warm is not None
        wait = 0 if warming else self.config.tick_s  # the warm-up waits instead
        self.read_into(self.consumer.consume(2000, timeout=wait), self.timers)
        if self._warm is not None:
            self.warm_up()
        self.cap_catch_ups()
        if self.watch.stuck():
            self._replace_consumer()
        self._read_beats()
        self.producer.poll(0)  # delivery reports: samples of the broker's time
        self._probe()
        self._ledger_offsets()
        self._resync()
        if self._waits_for_probe():
            return
        self._propose(self.propose_at())
        self._gauges()
        self._lag.report(self.consumer)

    def close(self) -> None:
        self.end_warm_up()
        self.producer.flush(10)
        self.consumer.close()
        self.beats.close()
        self.ledger_offsets.close()

    def _gauges(self) -> None:
        now = self.clock.monotonic()
        if now - self._gauged < 1.0:
            return
        self._gauged = now
        owned = list(self.timers.values())
        metrics.SCHEDULER_TIMERS.labels("jobs").set(sum(len(t.fires) for t in owned))
        metrics.SCHEDULER_TIMERS.labels("deadlines").set(sum(len(t.deadlines) for t in owned))
        metrics.SCHEDULER_PARTITIONS.labels("owned").set(len(owned))
        metrics.SCHEDULER_PARTITIONS.labels("caught_up").set(sum(not t.backlog for t in owned))

    def ready(self) -> str | None:
        """None once assigned with every owned partition caught up, else why not."""
        if not self.assigned:
            return "scheduler: no partitions assigned yet"
        behind = sorted(p for p, t in list(self.timers.items()) if t.backlog)
        return f"scheduler: catching up partitions {behind}" if behind else None

    def read_into(self, messages: list[Message], timers: dict[int, PartitionTimers]) -> None:
        """Learn `messages` (records and ends of partitions) into `timers`: the group's
        consumer's into `timers`, the warm-up's into its own; the catch-up tests of
        tests/integration/test_scheduler_catchup.py read with it too."""
        for msg in messages:
            error = msg.error()
            if error is None:
                self._follow(msg, timers)
            elif error.code() == KafkaError._PARTITION_EOF:
                self._caught_up(msg.partition() or 0, msg.topic() or "", timers)

    # -- reading ahead while the group decides --------------------------------------------
    @property
    def warming(self) -> bool:
        """Whether the read-ahead before the first assignment is still going (ended by
        that assignment, or by holding WARM_MAX_KEYS); checked by the catch-up tests."""
        return self._warm is not None

    @property
    def warm_timers(self) -> dict[int, PartitionTimers]:
        """The timers the read-ahead built so far, by partition (the assignment takes
        them over); read by tests/integration/test_scheduler_catchup.py."""
        return self._warm_timers

    def start_warm_up(self) -> None:
        """Start reading every partition from the beginning, outside the group, while it
        decides (`run` at its start; the catch-up tests drive it themselves)."""
        self._warm = self.clients.consumer(
            consumer_config(
                self.settings, None, **{"enable.partition.eof": True, "fetch.wait.max.ms": 100}
            )
        )
        partitions = range(self.settings.partitions)
        self._warm_timers = {p: self.fresh_timers() for p in partitions}
        self._warm.assign(
            [
                TopicPartition(topic, p, OFFSET_BEGINNING)
                for topic in (self.jobs_topic, self.runs_topic)
                for p in partitions
            ]
        )

    def warm_up(self) -> None:
        """Read on ahead one fetch; end the read-ahead once it holds WARM_MAX_KEYS keys
        (`run` each turn while warming; the catch-up tests)."""
        assert self._warm is not None
        self.read_into(self._warm.consume(5000, timeout=self.config.tick_s), self._warm_timers)
        held = sum(len(t.fires) + len(t.runs) for t in self._warm_timers.values())
        if held >= WARM_MAX_KEYS:
            log.info(
                "scheduler %s: read ahead %d keys; the rest after assignment", self.node_id, held
            )
            self.end_warm_up()

    def _warm_positions(self, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """Where the warm-up stands in these topic-partitions (only those it read from)."""
        if self._warm is None:
            return {}
        try:
            where = self._warm.position(
                [TopicPartition(tp.topic, tp.partition) for tp in partitions]
            )
        except KafkaException:
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in where if tp.offset >= 0}

    def end_warm_up(self) -> None:
        """Drop the read-ahead and close its consumer (the first assignment, the stop,
        the read-ahead's bound; the catch-up tests clean up with it)."""
        warm, self._warm = self._warm, None
        self._warm_timers = {}
        if warm is not None:
            warm.close()

    # -- the broker's time ------------------------------------------------------------------
    def _broker_now(self) -> int:
        now = self.broker.now_ms(self.clock.monotonic())
        return self._wall_ms() if now is None else now

    def _wall_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def _observe(self, stamp: int | None) -> None:
        if stamp is None:
            return
        first = not self.broker.synced
        self._sampled = self.clock.monotonic()
        self.broker.observe(stamp, self._sampled)
        if first:
            skew_s = (self._wall_ms() - (self.broker.now_ms(self.clock.monotonic()) or 0)) / 1000
            log.log(
                logging.WARNING if abs(skew_s) >= 1 else logging.INFO,
                "scheduler %s: broker clock synced; this machine's clock is %.3f s %s the "
                "broker's, proposals follow the broker's",
                self.node_id,
                abs(skew_s),
                "ahead of" if skew_s >= 0 else "behind",
            )

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            stamp = broker_stamp(msg.timestamp())
            self._observe(stamp)
            partition, offset = msg.partition(), msg.offset()
            if stamp is not None and partition is not None and offset is not None:
                self.unread.delivered(partition, offset, stamp)

    def _ledger_offsets(self) -> None:
        """Learn the ledger group's committed job-log offsets (`UnreadProposals`): the
        answer to the last ask if it came, and a new ask every LEDGER_READ_EVERY_S, one at
        a time, for the partitions it owns (a future: `OffsetsReader` asks on a thread of
        its own; the loop never waits on it)."""
        asked = self._offsets
        if asked is not None:
            if not asked.done():
                return
            self._offsets = None
            try:
                answer = asked.result()
            except Exception as exc:  # noqa: BLE001 - the broker away: fail open, ask again
                log.debug("scheduler %s: the ledger's offsets: %s", self.node_id, exc)
            else:
                at = self.clock.monotonic()
                for tp in answer:
                    if tp.offset >= 0 and tp.error is None:
                        self.unread.read(tp.partition, tp.offset, at)
        now = self.clock.monotonic()
        if now - self._offsets_asked < LEDGER_READ_EVERY_S or not self.timers:
            return
        self._offsets_asked = now
        owned = [TopicPartition(self.job_log, p) for p in sorted(self.timers)]
        self._offsets = self.ledger_offsets.committed(owned)

    def _probe(self) -> None:
        """A clock probe when no sample came for PROBE_AFTER_S (at most one in flight a
        PROBE_AFTER_S): its delivery report is the sample."""
        now = self.clock.monotonic()
        if not self._own_clock or now - max(self._sampled, self._probed) < PROBE_AFTER_S:
            return
        self._probed = now
        probe = FireProposed(PROBE_JOB_ID, 0, self._wall_ms(), self.node_id)
        with contextlib.suppress(BufferError):  # the broker is away: probed again later
            self.producer.produce(
                self.job_log, value=JOB_LOG.encode(probe), on_delivery=self._delivered
            )

    def _waits_for_probe(self) -> bool:
        """Before the first broker sample, wait a moment for the first probe's answer
        rather than propose by a wall clock that may be minutes off (the ledger accepts
        a burst's proposals up to 11 minutes early); a broker that does not answer in
        PROBE_WAIT_S leaves the wall clock to stand in (`_resync` repairs its timers)."""
        if not self._own_clock or self.broker.synced:
            return False
        return self.clock.monotonic() - self._probed < PROBE_WAIT_S

    def _read_beats(self) -> None:
        newest: int | None = None
        for msg in self.beats.consume(1000, timeout=0):
            if msg.error() is None:
                stamp = broker_stamp(msg.timestamp())
                if stamp is not None and (newest is None or stamp > newest):
                    newest = stamp
        self._observe(newest)

    def _resync(self) -> None:
        """Proposals made by the fallback wall clock before the first broker sample left
        timers set by that clock: if it is off, rebuild them from the committed state."""
        if not self._unsynced or not self.broker.synced:
            return
        self._unsynced = False
        skew = abs(self._wall_ms() - self._broker_now())
        if skew < RESYNC_SKEW_MS:
            return
        log.warning(
            "scheduler %s proposed by a wall clock %.1f s off the broker's before it knew "
            "the broker's time: rebuilding its timers",
            self.node_id,
            skew / 1000,
        )
        for tp in self.consumer.assignment():
            try:
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))
            except KafkaException as exc:  # keep the timers it has: late, not lost
                log.error("cannot reread %s[%d] (%s)", tp.topic, tp.partition, exc)
                continue
            self.timers[tp.partition] = self.fresh_timers()
        self.early = Pacer(self.config.proposals, self._broker_now())

    # -- assignment: rebuild from the beginning of the committed state --------------------
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The group consumer's assignment callback: take over what the read-ahead read
        of `partitions`, catch up the rest (tests/integration/test_scheduler_catchup.py
        calls it as the consumer would)."""
        if consumer is not self.consumer:  # a replaced consumer, closing late
            return
        # What the warm-up read of a partition is kept: each topic of it is read on from
        # where the warm-up stands, or from the start if it read nothing of it yet.
        ahead = self._warm_positions(partitions)
        for tp in partitions:
            warm = self._warm_timers.pop(tp.partition, None)
            if tp.partition not in self.timers:
                self.timers[tp.partition] = warm or self.fresh_timers()
                if warm is not None and not warm.backlog:
                    self._log_caught_up(tp.partition, warm, " (read ahead)")
            tp.offset = ahead.get((tp.topic, tp.partition), OFFSET_BEGINNING)
        self.end_warm_up()
        self.assigned = True
        consumer.incremental_assign(partitions)
        self._release_if_caught_up()  # all of it read ahead
        self.watch.reset()
        log.info(
            "scheduler %s owns partitions %s",
            self.node_id,
            sorted({tp.partition for tp in partitions}),
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:  # a replaced consumer, closing late
            return
        for tp in partitions:
            self.timers.pop(tp.partition, None)

    def _follow(self, msg: Message, owned: dict[int, PartitionTimers]) -> None:
        timers = owned.get(msg.partition() or 0)
        if timers is None:
            return
        key = (msg.key() or b"").decode()
        topic = msg.topic() or ""
        value: bytes | Timers | Deadline | None = msg.value()
        if value is not None:
            # What it needs of a state is in the record's header (streams/headers.py).
            headers = msg.headers()
            if topic == self.jobs_topic:
                value = timers_of(headers) or value
            else:
                value = deadline_of(headers) or value
        backlog = timers.backlog.get(topic)
        if backlog is not None:
            if isinstance(value, bytes):
                backlog[key] = value  # catching up: decoded once the end is reached
                return
            # A header or a tombstone costs nothing to learn: learnt now (it supersedes
            # whatever older value of the key waits in the backlog), not held.
            backlog.pop(key, None)
        self._learn(timers, topic, key, value, msg.partition(), msg.offset())

    def _caught_up(
        self, partition: int, topic: str, owned: dict[int, PartitionTimers], how: str = ""
    ) -> None:
        """The end of `topic` in `partition` reached: learn the newest value of each key
        kept meanwhile, and follow record by record from now on."""
        timers = owned.get(partition)
        backlog = None if timers is None else timers.backlog.pop(topic, None)
        if timers is None or backlog is None:
            return
        for key, value in backlog.items():
            self._learn(timers, topic, key, value, partition, None)
        if topic == self.jobs_topic:
            timers.fires.settle()
        if not timers.backlog and owned is self.timers:
            self._log_caught_up(partition, timers, how)
            self._release_if_caught_up()

    def _release_if_caught_up(self) -> None:
        """Every owned partition caught up: what the catch-up read is freed, hand it back."""
        if self.timers and not any(t.backlog for t in self.timers.values()):
            trim_malloc_once(f"scheduler {self.node_id} caught up", log.info)

    def _log_caught_up(self, partition: int, timers: PartitionTimers, how: str = "") -> None:
        log.info(
            "scheduler %s caught up with partition %d in %.2f s%s: %d jobs",
            self.node_id,
            partition,
            self.clock.monotonic() - timers.since,
            how,
            len(timers.fires),
        )

    def cap_catch_ups(self) -> None:
        """End the catch-ups older than CATCH_UP_MAX_S (`run` each turn; the catch-up
        tests check the bound with it)."""
        now = self.clock.monotonic()
        for partition, timers in list(self.timers.items()):
            if timers.backlog and now - timers.since > CATCH_UP_MAX_S:
                for topic in list(timers.backlog):
                    self._caught_up(partition, topic, self.timers, " (at its time bound)")

    def _learn(
        self,
        timers: PartitionTimers,
        topic: str,
        key: str,
        value: bytes | Timers | Deadline | None,
        partition: int | None,
        offset: int | None,
    ) -> None:
        try:
            if topic == self.jobs_topic:
                if isinstance(value, bytes) and value:  # written without the header
                    value = job_timers(JOB_STATE.decode(value))
                if not isinstance(value, Timers):
                    timers.fires.learn(key, None)
                else:
                    timers.fires.learn(
                        key, value.next_due_ms, value.fired_ms, value.early, lead=value.lead
                    )
            else:
                if isinstance(value, bytes) and value:  # written without the header
                    value = run_deadline(RUN_STATE.decode(value))
                timers.noticed.pop(key, None)  # a new state: its notices answered
                if not isinstance(value, Deadline) or value.kind is None:
                    timers.deadlines.set(key, None)
                    timers.runs.pop(key, None)
                else:
                    # A run id begins with its job's id (streams/core/ids.py).
                    timers.runs[key] = (job_of(key), value.attempt, value.kind)
                    timers.deadlines.set(key, value.deadline_ms)
        except CodecError as exc:  # the ledger wrote it; log, never stop proposing
            log.error("undecodable state record %s[%s]@%s: %s", topic, partition, offset, exc)

    # -- proposing ------------------------------------------------------------------------
    def _propose(self, now: int) -> None:
        repeat = self.config.proposals.repeat_ms
        owned = list(self.timers.values())
        self.early.judge(now, [t.fires for t in owned])
        large = self.early.needed >= BURST_LOGGED
        if large != self._in_burst:  # said of bursts only, not of every quiet job's slack
            self._in_burst = large
            log.info(
                "scheduler %s: %s (%d firings to propose early, %.0f a second)",
                self.node_id,
                "a burst ahead" if large else "burst proposed",
                self.early.needed,
                self.early.rate,
            )
        mono = self.clock.monotonic()
        for partition, timers in list(self.timers.items()):
            # Each proposal surfaces again after `repeat` unless the ledger's answer (a
            # new state record) replaces it first; it is sent again only if the ledger
            # has read the last one (streams/core/unread.py).
            # Not while proposals are made by the wall clock (no broker sample yet): their
            # times are not the broker's, which the hold compares with.
            unsynced = self._own_clock and not self.broker.synced
            held_from = None if unsynced else self.unread.held_from(partition, mono)
            held = timers.fires.held
            fires, _ = timers.fires.take(now, held_from=held_from)
            _FIRES_HELD.inc(timers.fires.held - held)
            for job_id, due in fires:
                self._send(job_id, FireProposed(job_id, due, now, self.node_id))
            _FIRES.inc(len(fires))
            for run_id, _ in timers.deadlines.pop_due(now):
                timers.deadlines.set(run_id, now + repeat)
                noticed = timers.noticed.get(run_id)
                if noticed is not None and held_from is not None and noticed >= held_from:
                    self.held += 1
                    _DEADLINES_HELD.inc()
                    continue
                job_id, attempt, kind = timers.runs[run_id]
                self._send(job_id, DeadlineReached(job_id, run_id, attempt, kind, now))
                timers.noticed[run_id] = now
                _DEADLINES.inc()
        allowed = self.early.grant(now)
        if allowed > 0:
            for fires in take_early([t.fires for t in owned], now, allowed):
                self.early.spend(len(fires))
                for job_id, due in fires:
                    self._send(job_id, FireProposed(job_id, due, now, self.node_id))
                _FIRES.inc(len(fires))

    def _send(self, job_id: str, record: FireProposed | DeadlineReached) -> None:
        if self._own_clock and not self.broker.synced:
            self._unsynced = True
        try:
            self.producer.produce(
                self.job_log,
                key=job_id.encode(),
                value=JOB_LOG.encode(record),
                on_delivery=self._delivered,
            )
        except BufferError:
            # The local queue is full: the broker has been unreachable for a while. Drop
            # it: an unanswered proposal is repeated after `repeat_ms` anyway.
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.warning(
                    "scheduler %s: producer queue full (broker down?): %d proposals "
                    "dropped so far, each is repeated later",
                    self.node_id,
                    self.dropped,
                )
            return
        self.proposed += 1
