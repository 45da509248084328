"""The ledger's takeover of job-log partitions: the committed offsets, then the state.

A ledger that gets partitions (an assignment, or its own recovery after a failed
transaction: streams/ledger.py) takes them over here: it fetches the group's committed
offsets, then restores each partition's state - the same partition of the compacted
`jobs` and `runs` topics - to the log's real end, and hands both back (`TakenOver`); the
ledger assigns or seeks the positions and holds the states. `Takeover.take_over` says
why in that order, `Takeover.restore_all` how the state is read. From its start to its
first assignment a ledger already reads ahead the state of the partitions it will likely
get (`Takeover.start_read_ahead`), and its first takeover reads on from there.

In the ledger process this module alone reads the state topics; its commit cycle only
writes them (streams/ledger.py: `_write_states`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from schemas.codec import JOB_STATE, RUN_STATE
from schemas.records import JobState, RunState
from streams.core import partition as core
from streams.core.clock import Clock
from streams.kafka import RETRY_SLEEP_S, Clients, committed_or, consumer_config
from streams.settings import Settings
from streams.state_store import DiskStore, MemoryStates, Topic
from streams.state_table import Encoded, StateTable

log = logging.getLogger("cronlog.ledger")

# A restore fails only when it made no progress for this long. Longer than the
# transaction timeout: a dead owner's open transaction holds the restore back that long.
RESTORE_STALL_S = 30.0
# Reading ahead before the first assignment (`_ReadAhead`) stops at this many records:
# a node of a large cluster holds other owners' states only briefly and within a bound.
AHEAD_MAX_RECORDS = 2_000_000

# (topic, partition) -> a table already holding what the read-ahead read of it, and the
# offset it stopped at (`Takeover.take_ahead`).
Ahead = dict[tuple[str, int], tuple[Encoded, int]]


def _jobs() -> StateTable[JobState]:
    return StateTable(JOB_STATE.decode)


def _runs() -> StateTable[RunState]:
    return StateTable(RUN_STATE.decode)


def range_share(partitions: int, index: int, members: int) -> range:
    """The partitions the range assignor gives member `index` of `members` (librdkafka's
    RangeAssignor: consecutive ranges, the first `partitions % members` one larger)."""
    if not 0 <= index < members:
        raise ValueError(f"ledger index {index} out of {members}")
    size, extra = divmod(partitions, members)
    start = index * size + min(index, extra)
    return range(start, start + size + (index < extra))


@dataclass
class PartitionState(core.PartitionState):
    """One job-log partition's jobs and runs, held decoded or encoded (`StateTable`):
    decided and applied by the core's rules (streams/core/partition.py)."""

    jobs: StateTable[JobState] = field(default_factory=_jobs)
    runs: StateTable[RunState] = field(default_factory=_runs)


@dataclass(frozen=True, slots=True)
class TakenOver:
    """A takeover's outcome: the positions to resume from (the committed offsets, for
    the caller to assign or seek) and the partitions' restored states (none when the
    takeover was cut short by stop: such a restore is never used)."""

    positions: list[TopicPartition]
    states: dict[int, PartitionState]
    records: int  # state records read by the restore (read ahead included): its log line


@dataclass(frozen=True, slots=True)
class AheadProgress:
    """What the read-ahead holds so far (`Takeover.ahead`)."""

    topic_partitions: frozenset[tuple[str, int]]  # the state topic-partitions it reads
    read: int  # records read
    full: bool  # AHEAD_MAX_RECORDS read: no more is read


@dataclass
class _ReadAhead:
    """From a ledger's start to its first assignment, every partition's state records
    read into tables of their own (those of its share: `range_share`), by a consumer
    outside the group (`Takeover.start_read_ahead`)."""

    reader: Consumer
    sinks: dict[tuple[str, int], Encoded]
    read: int = 0
    full: bool = False  # AHEAD_MAX_RECORDS read: what it holds is kept, no more is read


class Takeover:
    """One ledger process's takeovers: its read-ahead, and the offset fetch and restore
    of the partitions it is given. `stop` is the ledger's: a takeover stops retrying,
    and a restore stops reading, when it is set."""

    def __init__(
        self,
        settings: Settings,
        clients: Clients,
        clock: Clock,
        stop: threading.Event,
        node_id: str,
        share: tuple[int, int] = (0, 1),
        store: DiskStore | None = None,
        stall_s: float = RESTORE_STALL_S,
    ):
        self.settings = settings
        self.clients = clients
        self.clock = clock
        self.node_id = node_id
        # (index, count) of the node's ledger processes: which partitions are read ahead.
        self.share = share
        # Where the states held encoded live: on disk (the ledger's store), or on the heap.
        self.store = store
        self.stall_s = stall_s
        self.topics: dict[Topic, str] = {t: settings.topic(t) for t in ("jobs", "runs")}
        self._stop = stop
        self._restored_records = 0  # read by the newest restore (its log line)
        self._ahead: _ReadAhead | None = None
        self._read_before = 0  # records of the takeover's restore read ahead

    # -- reading ahead while the group decides ------------------------------------------
    def start_read_ahead(self) -> None:
        """A node taking over from a dead one waits out the dead member's session (6 s)
        before anything is assigned, then restored every partition it got. So from its
        start it already reads the state of the partitions it will likely get (its
        `range_share`; read_committed, outside the group); the first assignment's
        restore goes on from there (`take_ahead`), and restores what it got beyond
        them from the start. The
        fencing argument of `take_over` is untouched: what is read before the offset
        fetch is a prefix of each topic-partition, and the rest, to the real end as it
        stands after the fetch, is still read after it, so the state holds exactly
        the same records as a restore from the start."""
        partitions = range_share(self.settings.partitions, *self.share)
        sinks = {
            (self.topics[topic], p): self._encoded(p, topic)
            for topic in ("jobs", "runs")
            for p in partitions
        }
        reader = self.clients.consumer(
            consumer_config(self.settings, None, **{"fetch.wait.max.ms": 100})
        )
        reader.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in sinks])
        self._ahead = _ReadAhead(reader, sinks)

    @property
    def reading_ahead(self) -> bool:
        """Whether a read-ahead is on and not full: the ledger calls `read_ahead` then."""
        return self._ahead is not None and not self._ahead.full

    @property
    def ahead(self) -> AheadProgress | None:
        """What the read-ahead reads and has read (None: none is on). Public for the
        tests, which check what a ledger reads ahead and how far it got; the ledger
        itself needs only `reading_ahead`."""
        ahead = self._ahead
        if ahead is None:
            return None
        return AheadProgress(frozenset(ahead.sinks), ahead.read, ahead.full)

    def read_ahead(self) -> None:
        ahead = self._ahead
        assert ahead is not None
        for msg in ahead.reader.consume(10_000, timeout=0.1):
            if msg.error() is None:
                ahead.read += 1
                ahead.sinks[(msg.topic() or "", msg.partition() or 0)].stage(
                    (msg.key() or b"").decode(), msg.value()
                )
        if ahead.read >= AHEAD_MAX_RECORDS:
            ahead.full = True
            log.info(
                "ledger %s: read %d state records ahead; the rest after assignment",
                self.node_id,
                ahead.read,
            )

    def take_ahead(self, partitions: list[int]) -> Ahead:
        """End the read-ahead: (topic, partition) -> its table and the offset to read on
        from, for these partitions and the topic-partitions it read anything of; the
        rest is dropped."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return {}
        kept: Ahead = {}
        try:
            wanted = [TopicPartition(t, p) for t, p in ahead.sinks if p in partitions]
            for tp in ahead.reader.position(wanted) if wanted else []:
                if tp.offset >= 0:
                    sink = ahead.sinks[(tp.topic, tp.partition)]
                    sink.flush()
                    kept[(tp.topic, tp.partition)] = (sink, tp.offset)
        except KafkaException as exc:  # read from the start instead: slower, as correct
            log.warning("ledger %s: read-ahead position unknown (%s)", self.node_id, exc)
            kept = {}
        finally:
            ahead.reader.close()
        if self.store is not None:
            for p in range(self.settings.partitions):
                if p not in partitions:
                    self.store.drop(p)
        self._read_before = ahead.read
        return kept

    def end_read_ahead(self) -> None:
        self.take_ahead([])

    # -- taking over --------------------------------------------------------------------
    def take_over(self, consumer: Consumer, partitions: list[TopicPartition]) -> TakenOver:
        """Committed offsets first (fetched by `consumer`, the ledger's group member),
        then the state, then the positions to resume from (returned; the caller assigns
        or seeks them). Used on assignment and recovery.

        Why this order. The committed offsets say which inputs are decided; the state
        must contain exactly those decisions. The offset fetch is made with
        require_stable (librdkafka sets it for a read_committed consumer): the group
        coordinator answers only once no transaction with offsets for these partitions
        is pending, so a zombie's batch whose offsets were sent before the rebalance is
        either committed (and its offsets are in the answer) or aborted. After the
        fetch no transaction can add offsets any more (the generation moved on, so a
        zombie's send_offsets is fenced). The state, read next to the log's real end,
        then holds every batch whose offsets were fetched, and no batch whose offsets
        were not: a committed batch wrote its state before its commit marker, which
        came before the fetch. In the other order - state first, offsets afterwards (as
        librdkafka does by itself after on_assign returns) - a zombie's batch whose
        offsets committed late, after the state was read, is missing from the state
        while its offsets say it is decided: its job's watermark stays behind, and a
        repeated proposal for the same time is decided a second time.
        """
        wanted = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        failures = 0
        ahead_of = self._ahead is not None
        while True:
            committed = committed_or(consumer, wanted, OFFSET_BEGINNING, self._stop)
            # Only now, after the fetch, is what was read ahead taken (and only by the
            # first attempt: a retry reads from the start).
            taken = [tp.partition for tp in committed]
            ahead = self.take_ahead(taken) if ahead_of and not failures else {}
            try:
                restored = self.restore_all(taken, ahead)
                break
            except KafkaException as exc:
                # The broker down, or a restore that stalled: both steps again, in order.
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning(
                        "ledger %s: takeover of %s failed (%s); retrying",
                        self.node_id,
                        sorted(tp.partition for tp in wanted),
                        exc,
                    )
                if self._stop.wait(RETRY_SLEEP_S):
                    return TakenOver(committed, {}, self._restored_records)
        if self._stop.is_set():  # a restore cut short by stop() is never used
            restored = {}
        return TakenOver(committed, restored, self._restored_records)

    def restore(self, partition: int) -> PartitionState:
        """One partition's state, restored from the start (`restore_all`)."""
        return self.restore_all([partition])[partition]

    def restore_all(
        self, partitions: list[int], ahead: Ahead | None = None
    ) -> dict[int, PartitionState]:
        """Read these partitions of `jobs` and `runs` to their end (read_committed), all
        at once with one consumer: a failover restores every partition it takes over.

        The end to read to is the log's real end (read_uncommitted), not the last stable
        offset a read_committed consumer reports: the previous owner's last transaction
        may be committed (its offsets about to become visible) while its markers are
        still being written, and stopping at the LSO would restore state without that
        batch and resume after it: duplicate runs. So wait for every transaction below
        the real end to be resolved (a dead ledger's is aborted within
        transaction.timeout.ms).

        No limit on the total time (a large partition takes as long as it takes, and a
        fixed limit would make every rebalance start it over): it fails only when no
        record arrived and no position moved for `stall_s`.

        Nothing is decoded here: the newest value's bytes of each key are kept (a
        tombstone drops the key) and a state is decoded when the ledger first decides
        about it (`StateTable`). The compacted topics still hold every value written
        since their last compaction (the active segment is never compacted), so decoding
        each record as it came made the restore grow with the history rather than with
        the state (`bench.restore`: 10 values per key took 5.2 times as long as one), and
        decoding every newest value made it grow with the registry, though few of its
        jobs are due in the next minutes.

        `ahead`: (topic, partition) -> a table already holding what the read-ahead read
        of it (`start_read_ahead`) and the offset it stopped at, to read on from there.
        """
        ahead = ahead or {}
        read_before, self._read_before = self._read_before if ahead else 0, 0
        states: dict[int, PartitionState] = {}
        sinks: dict[tuple[str, int], Encoded] = {}
        starts: dict[tuple[str, int], int] = {}
        for p in partitions:
            for topic in ("jobs", "runs"):
                where = (self.topics[topic], p)
                if where in ahead:
                    sinks[where], starts[where] = ahead[where]
                else:
                    sinks[where] = self._encoded(p, topic)
            states[p] = PartitionState(
                StateTable(JOB_STATE.decode, sinks[(self.topics["jobs"], p)]),
                StateTable(RUN_STATE.decode, sinks[(self.topics["runs"], p)]),
            )
        read = self._read_state_topics(sinks, starts)
        for sink in sinks.values():
            sink.flush()
        self._restored_records = read_before + read
        return states

    def _encoded(self, partition: int, topic: Topic) -> Encoded:
        """A new, empty holder for the encoded states of `topic` in `partition`."""
        return MemoryStates() if self.store is None else self.store.table(partition, topic)

    def _read_state_topics(
        self, sinks: dict[tuple[str, int], Encoded], starts: dict[tuple[str, int], int]
    ) -> int:
        """Stage into each (topic, partition)'s sink the newest value of each key of the
        `jobs` and `runs` partitions, from `starts` (else the beginning) to the log's
        real end (`restore_all` says why and how long). Returns the records read."""
        probe = self.clients.consumer(
            consumer_config(self.settings, None, **{"isolation.level": "read_uncommitted"})
        )
        try:
            targets = {
                (topic, p): probe.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[
                    1
                ]
                for topic, p in sinks
            }
        finally:
            probe.close()
        pending = {key: high for key, high in targets.items() if high > starts.get(key, 0)}
        if not pending:
            return 0
        reader = self.clients.consumer(
            consumer_config(
                self.settings,
                None,
                **{"enable.partition.eof": True, "fetch.wait.max.ms": 20},
            )
        )
        try:
            reader.assign(
                [TopicPartition(t, p, starts.get((t, p), OFFSET_BEGINNING)) for t, p in pending]
            )
            progress_at = self.clock.monotonic()
            positions: dict[tuple[str, int], int] = {}
            read = 0
            while pending:
                if self._stop.is_set():
                    break
                if self.clock.monotonic() - progress_at > self.stall_s:
                    raise KafkaException(
                        KafkaError(
                            KafkaError._TIMED_OUT,
                            f"restore of {sorted(pending)} made no progress for "
                            f"{self.stall_s:.0f} s (at {positions})",
                        )
                    )
                messages = reader.consume(10_000, timeout=0.1)
                if messages:
                    progress_at = self.clock.monotonic()
                for msg in messages:
                    error = msg.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            raise KafkaException(error)
                        continue
                    read += 1
                    sink = sinks[(msg.topic() or "", msg.partition() or 0)]
                    sink.stage((msg.key() or b"").decode(), msg.value())
                for tp in reader.position([TopicPartition(t, p) for t, p in pending]):
                    where = (tp.topic, tp.partition)
                    if tp.offset > positions.get(where, -1):
                        positions[where] = tp.offset
                        progress_at = self.clock.monotonic()
                    if tp.offset >= pending[where]:
                        del pending[where]
        finally:
            reader.close()
        return read
