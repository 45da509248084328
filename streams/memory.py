"""An in-memory Kafka: the loops run against it unchanged (``clients=MemoryClients(log)``),
in unit tests and in the seeded simulation, with no broker and no sleeps.

What it keeps of Kafka, because the ledger's guarantees rest on it (streams/ledger.py):
 - Partitioned, append-only logs with offsets; a topic of the catalogue with
   LogAppendTime gets the log's clock as each record's stamp.
 - Transactions: a transactional producer's records are in the log at once but a
   read_committed reader stops at the first record of an open transaction (the last
   stable offset) and skips aborted ones; the consumed offsets a transaction carries
   (`send_offsets_to_transaction`) are committed with it or not at all. An open
   transaction is aborted when it outlives `transaction.timeout.ms` on the clock.
 - Fencing: `init_transactions` under a transactional.id bumps its epoch and aborts that
   id's open transaction; the older producer can then neither produce into nor commit
   any transaction. Offsets sent with a group generation that is no longer current
   (the member was rebalanced away: a zombie) are refused, as the broker refuses a
   TxnOffsetCommit of a stale generation (KIP-447).
 - Consumer groups with the range assignor: a join, a leave, or a member silent for
   `session.timeout.ms` starts a new generation; each member learns of it at its next
   `consume` (its revoke and assign callbacks run there), so until then it still
   believes it owns its old partitions, as a paused member does.
 - `committed()` with require_stable: while a transaction holds offsets for a
   partition the answer waits for it (and fails after its timeout).

What it leaves out: replication, compaction (readers take the newest value per key
anyway), quotas, retention, record batches and control records (offsets of a
partition are consecutive), and the network: a call either happens or raises.

Time. Every timeout is read on the log's clock. With a `ManualClock` a call that would
wait moves the clock forward instead (a `consume` that finds nothing "waits" its
timeout), so a test drives time by calling the loops, and a run is reproducible; with
the system clock it waits for real on a condition (threads may share one log).

Faults. `MemoryLog.faults` are called before every client call with (call, client): a
test may raise from one (a crash at that point: the client is left as it is, like a
process killed there) or act in between (let another node take partitions over while a
transaction is about to commit).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from streams.core.clock import SYSTEM_CLOCK, Clock, ManualClock
from streams.core.timing import TIMING
from streams.kafka import Clients, partition_for
from streams.settings import Settings
from streams.topics import CATALOGUE

Fault = Callable[[str, object], None]
Where = tuple[str, int]  # (topic, partition)


def _error(code: int, reason: str, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, reason, **flags))


@dataclass
class _Txn:
    txn_id: str
    epoch: int
    started: float  # the clock's monotonic reading at begin
    timeout_s: float
    state: str = "open"  # open, committed, aborted
    offsets: dict[str, dict[Where, int]] = field(default_factory=dict)  # group -> offsets


@dataclass(frozen=True, slots=True)
class _Record:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp: tuple[int, int]
    txn: _Txn | None


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """What `consumer_group_metadata()` hands to `send_offsets_to_transaction`."""

    group: str
    generation: int
    member: str


@dataclass
class _Member:
    consumer: MemoryConsumer
    topics: list[str]
    session_s: float
    seen: float
    generation: int = -1  # the generation whose assignment it holds


@dataclass
class _Group:
    members: dict[str, _Member] = field(default_factory=dict)
    generation: int = 0
    assignment: dict[str, list[Where]] = field(default_factory=dict)
    offsets: dict[Where, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Partition:
    id: int
    replicas: tuple[int, ...] = (0,)


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic: str
    partitions: dict[int, _Partition]
    error: KafkaError | None = None


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    topics: dict[str, TopicMetadata]
    brokers: dict[int, str]


class MemoryLog:
    """The cluster: topics, transactions and consumer groups, behind one lock."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.topics: dict[str, list[list[_Record]]] = {}
        self.log_append_time: set[str] = set()
        self.groups: dict[str, _Group] = {}
        self.epochs: dict[str, int] = {}
        self.open: dict[str, _Txn] = {}  # transactional.id -> its open transaction
        self.faults: list[Fault] = []
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._ids = itertools.count(1)

    # -- the cluster --------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, broker_time: bool = False) -> None:
        with self.lock:
            if name not in self.topics:
                self.topics[name] = [[] for _ in range(partitions)]
            if broker_time:
                self.log_append_time.add(name)

    def create_catalogue(self, settings: Settings) -> None:
        """Every topic of the contract, as `cronlog topics create` makes them."""
        for spec in CATALOGUE:
            broker_time = spec.config.get("message.timestamp.type") == "LogAppendTime"
            count = 1 if spec.name == "node-keys" else settings.partitions
            self.create_topic(settings.topic(spec.name), count, broker_time)

    def metadata(self) -> ClusterMetadata:
        with self.lock:
            topics = {
                name: TopicMetadata(name, {p: _Partition(p) for p in range(len(parts))})
                for name, parts in self.topics.items()
            }
        return ClusterMetadata(topics, {0: "memory:0"})

    def records(self, topic: str, committed: bool = True) -> list[Message]:
        """Every record of `topic` a read_committed reader sees (every one, with
        `committed=False`), partition by partition: for a test's checks."""
        with self.lock:
            self.expire()
            out: list[Message] = []
            for p, log in enumerate(self.topics[topic]):
                for offset, record in enumerate(log):
                    state = "committed" if record.txn is None else record.txn.state
                    if committed and state != "committed":
                        if state == "open":
                            break
                        continue
                    out.append(_message(topic, p, offset, record))
            return out

    def lag(self, group: str, topic: str) -> int:
        """The records of `topic` a read_committed member of `group` would still be
        given after its committed offsets (0: the group has decided all it can see)."""
        with self.lock:
            self.expire()
            offsets = self.groups.get(group, _Group()).offsets
            behind = 0
            for p, log in enumerate(self.topics[topic]):
                for record in log[offsets.get((topic, p), 0) :]:
                    state = "committed" if record.txn is None else record.txn.state
                    if state == "open":
                        break
                    behind += state == "committed"
            return behind

    def fault(self, call: str, client: object) -> None:
        for fault in list(self.faults):
            fault(call, client)

    def wait(self, seconds: float) -> None:
        """Let `seconds` pass (lock held): a manual clock moves, the system's is waited
        on (woken early by any change)."""
        if seconds <= 0:
            return
        if isinstance(self.clock, ManualClock):
            self.clock.advance(seconds)
        else:
            self.changed.wait(seconds)
        self.expire()

    def expire(self) -> None:
        """Abort transactions past their timeout; drop members silent past their session."""
        now = self.clock.monotonic()
        for txn in list(self.open.values()):
            if now - txn.started >= txn.timeout_s:
                self.end_transaction(txn, "aborted")
        for group in self.groups.values():
            silent = [
                m for m, member in group.members.items() if now - member.seen > member.session_s
            ]
            for member_id in silent:
                del group.members[member_id]
            if silent:
                self._rebalance(group)

    # -- transactions -------------------------------------------------------------------
    def end_transaction(self, txn: _Txn, state: str) -> None:
        """End `txn` as `state` ("committed": its offsets stored; "aborted") unless it
        ended already; for the log's own timeout (`expire`) and MemoryProducer's
        init_transactions (fencing an older epoch), commit and abort. Call it holding
        `lock`."""
        if txn.state != "open":
            return
        txn.state = state
        if self.open.get(txn.txn_id) is txn:
            del self.open[txn.txn_id]
        if state == "committed":
            for group, offsets in txn.offsets.items():
                self.groups.setdefault(group, _Group()).offsets.update(offsets)
        self.changed.notify_all()

    def unstable(self, group: str, where: Iterable[Where]) -> bool:
        wanted = set(where)
        return any(wanted & set(txn.offsets.get(group, {})) for txn in self.open.values())

    # -- groups -------------------------------------------------------------------------
    def join(self, group_id: str, member: _Member) -> str:
        member_id = f"member-{next(self._ids)}"
        group = self.groups.setdefault(group_id, _Group())
        group.members[member_id] = member
        self._rebalance(group)
        return member_id

    def leave(self, group_id: str, member_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and group.members.pop(member_id, None) is not None:
            self._rebalance(group)

    def _rebalance(self, group: _Group) -> None:
        """A new generation, partitions spread by the range assignor: per topic, the
        members subscribed to it in id order take consecutive runs of partitions."""
        group.generation += 1
        group.assignment = {m: [] for m in group.members}
        topics = sorted({t for member in group.members.values() for t in member.topics})
        for topic in topics:
            takers = sorted(
                (m for m, member in group.members.items() if topic in member.topics),
                key=lambda m: int(m.rsplit("-", 1)[1]),
            )
            count = len(self.topics.get(topic, []))
            if not takers:
                continue
            each, extra = divmod(count, len(takers))
            start = 0
            for i, member_id in enumerate(takers):
                n = each + (1 if i < extra else 0)
                group.assignment[member_id] += [(topic, p) for p in range(start, start + n)]
                start += n
        self.changed.notify_all()


def _message(topic: str, partition: int, offset: int, record: _Record) -> Message:
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=record.key,
        value=record.value,
        headers=record.headers,  # type: ignore[arg-type]
        timestamp=record.timestamp,
        error=None,
    )


class MemoryConsumer:
    """confluent_kafka.Consumer's calls the loops make, over a `MemoryLog`."""

    def __init__(self, log: MemoryLog, config: dict[str, Any]):
        self.log = log
        group = config.get("group.id")
        self.group = None if group in (None, "cronlog-unused") else str(group)
        self.read_committed = config.get("isolation.level", "read_committed") == "read_committed"
        self.eof = bool(config.get("enable.partition.eof", False))
        self.reset_latest = config.get("auto.offset.reset", "latest") in ("latest", "end")
        # The group protocol's session is a setting of the broker's group (as cronlog's
        # groups are set up, `streams/kafka.py` group_settings), not of the client.
        self.session_s = TIMING.consumer_session_s
        self.client_id = str(config.get("client.id", ""))
        self.positions: dict[Where, int] = {}
        self.eof_at: dict[Where, int] = {}
        self.member_id: str | None = None
        self.callbacks: dict[str, Callable[..., None] | None] = {}
        self.topics: list[str] = []
        self.closed = False
        self._turn = 0
        self._assigned = False  # assign() was called (in a rebalance callback)
        self._in_callback = False

    def _check(self, call: str) -> None:
        self.log.fault(call, self)
        if self.closed:
            raise RuntimeError("Consumer closed")

    # -- membership ---------------------------------------------------------------------
    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[..., None] | None = None,
        on_revoke: Callable[..., None] | None = None,
        on_lost: Callable[..., None] | None = None,
    ) -> None:
        self._check("subscribe")
        if self.group is None:
            raise _error(KafkaError._INVALID_ARG, "subscribe needs a group.id")
        self.topics = list(topics)
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        with self.log.lock:
            if self.member_id is not None:
                self.log.leave(self.group, self.member_id)
            self.member_id = self.log.join(
                self.group, _Member(self, self.topics, self.session_s, self.log.clock.monotonic())
            )

    def _serve_group(self) -> None:
        """Heartbeat, and follow a new generation: revoke what it had, take what the new
        assignment gives (in the assign callback, as librdkafka does), or rejoin if the
        group dropped this member for its silence."""
        if self.group is None or self.member_id is None:
            return
        with self.log.lock:
            group = self.log.groups[self.group]
            found = group.members.get(self.member_id)
            lost = found is None
            if found is None:  # silent past its session: the group went on without it
                self.member_id = self.log.join(
                    self.group,
                    _Member(self, self.topics, self.session_s, self.log.clock.monotonic()),
                )
                found = group.members[self.member_id]
            member = found
            member.seen = self.log.clock.monotonic()
            if member.generation == group.generation:
                return
            held = sorted(self.positions)
            member.generation = group.generation
            given = list(group.assignment.get(self.member_id, []))
        if held:
            callback = self.callbacks.get("lost" if lost else "revoke") or self.callbacks.get(
                "revoke"
            )
            tps = [TopicPartition(t, p) for t, p in held]
            if callback is not None:
                callback(self, tps)
            self.positions.clear()
        tps = [TopicPartition(t, p, OFFSET_INVALID) for t, p in given]
        on_assign = self.callbacks.get("assign")
        self._assigned = False
        if on_assign is not None:
            self._in_callback = True
            try:
                on_assign(self, tps)
            finally:
                self._in_callback = False
        if not self._assigned:  # as confluent-kafka does when the callback did not
            self.incremental_assign(tps)

    def consumer_group_metadata(self) -> GroupMetadata:
        self._check("consumer_group_metadata")
        if self.group is None or self.member_id is None:
            raise _error(KafkaError._STATE, "not a group member")
        with self.log.lock:
            group = self.log.groups[self.group]
            member = group.members.get(self.member_id)
            generation = -1 if member is None else member.generation
        return GroupMetadata(self.group, generation, self.member_id)

    def memberid(self) -> str | None:
        return self.member_id

    # -- positions ----------------------------------------------------------------------
    def assign(self, partitions: list[TopicPartition]) -> None:
        self._check("assign")
        if self._in_callback:
            # The groups' KIP-848 protocol is incremental: librdkafka refuses an eager
            # assign inside a rebalance callback.
            raise _error(KafkaError._STATE, "a group callback must use incremental_assign")
        self._assigned = True
        with self.log.lock:
            self.positions = {}
            for tp in partitions:
                self.positions[(tp.topic, tp.partition)] = self._start(tp)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._check("incremental_assign")
        self._assigned = True
        with self.log.lock:
            for tp in partitions:
                self.positions[(tp.topic, tp.partition)] = self._start(tp)

    def _start(self, tp: TopicPartition) -> int:
        where = (tp.topic, tp.partition)
        end = len(self.log.topics[tp.topic][tp.partition])
        if tp.offset >= 0:
            return tp.offset
        if tp.offset == OFFSET_BEGINNING:
            return 0
        if tp.offset == OFFSET_END:
            return end
        if self.group is not None:
            committed = self.log.groups.setdefault(self.group, _Group()).offsets.get(where)
            if committed is not None:
                return committed
        return end if self.reset_latest else 0

    def assignment(self) -> list[TopicPartition]:
        self._check("assignment")
        return [TopicPartition(t, p) for t, p in sorted(self.positions)]

    def seek(self, tp: TopicPartition) -> None:
        self._check("seek")
        with self.log.lock:
            where = (tp.topic, tp.partition)
            if where not in self.positions:
                raise _error(KafkaError._STATE, f"{where} is not assigned")
            self.positions[where] = self._start(tp)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        self._check("position")
        return [
            TopicPartition(
                tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), OFFSET_INVALID)
            )
            for tp in partitions
        ]

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """The group's committed offsets, waiting while a transaction holds offsets for
        one of them (require_stable, a read_committed consumer's default)."""
        self._check("committed")
        group_id = self.group or "cronlog-unused"
        wanted = [(tp.topic, tp.partition) for tp in partitions]
        with self.log.lock:
            self.log.expire()
            until = self.log.clock.monotonic() + (30.0 if timeout is None else timeout)
            while self.read_committed and self.log.unstable(group_id, wanted):
                left = until - self.log.clock.monotonic()
                if left <= 0:
                    raise _error(
                        KafkaError.UNSTABLE_OFFSET_COMMIT,
                        "a transaction holds offsets for these partitions",
                        retriable=True,
                    )
                self.log.wait(min(left, 0.5))
            offsets = self.log.groups.setdefault(group_id, _Group()).offsets
            return [TopicPartition(t, p, offsets.get((t, p), OFFSET_INVALID)) for t, p in wanted]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        self._check("get_watermark_offsets")
        with self.log.lock:
            return 0, len(self.log.topics[partition.topic][partition.partition])

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        self._check("list_topics")
        return self.log.metadata()

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """Per partition, the first offset stamped at or after `offset` (a time in ms),
        or the end (-1) when none is."""
        self._check("offsets_for_times")
        out = []
        with self.log.lock:
            for tp in partitions:
                log = self.log.topics[tp.topic][tp.partition]
                found = next((i for i, r in enumerate(log) if r.timestamp[1] >= tp.offset), None)
                out.append(
                    TopicPartition(tp.topic, tp.partition, OFFSET_END if found is None else found)
                )
        return out

    # -- reading ------------------------------------------------------------------------
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        self._check("consume")
        with self.log.lock:
            self.log.expire()
        self._serve_group()
        with self.log.lock:
            found = self._take(num_messages)
            if not found and timeout != 0:
                self.log.wait(30.0 if timeout < 0 else timeout)
                found = self._take(num_messages)
        return found

    def poll(self, timeout: float = -1) -> Message | None:
        found = self.consume(1, timeout)
        return found[0] if found else None

    def _take(self, limit: int) -> list[Message]:
        out: list[Message] = []
        owned = sorted(self.positions)
        if not owned:
            return out
        self._turn = (self._turn + 1) % len(owned)
        for topic, p in owned[self._turn :] + owned[: self._turn]:
            log = self.log.topics[topic][p]
            offset = self.positions[(topic, p)]
            while offset < len(log) and len(out) < limit:
                record = log[offset]
                state = "committed" if record.txn is None else record.txn.state
                if self.read_committed and state == "open":
                    break  # the last stable offset
                if not self.read_committed or state == "committed":
                    out.append(_message(topic, p, offset, record))
                offset += 1
            self.positions[(topic, p)] = offset
            if (
                self.eof
                and self._at_end(log, offset)
                and len(out) < limit
                and self.eof_at.get((topic, p)) != offset
            ):
                self.eof_at[(topic, p)] = offset
                out.append(
                    Message(
                        topic=topic,
                        partition=p,
                        offset=offset,
                        error=KafkaError(KafkaError._PARTITION_EOF),
                    )
                )
            if len(out) >= limit:
                break
        return out

    def _at_end(self, log: list[_Record], offset: int) -> bool:
        """Whether `offset` is the end of what this reader can see of `log`."""
        if offset >= len(log):
            return True
        txn = log[offset].txn
        return self.read_committed and txn is not None and txn.state == "open"

    # -- non-transactional commits ------------------------------------------------------
    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        self._check("commit")
        if self.group is None:
            raise _error(KafkaError._INVALID_ARG, "commit needs a group.id")
        with self.log.lock:
            stored = self.log.groups.setdefault(self.group, _Group()).offsets
            if message is not None:
                where = (message.topic() or "", message.partition() or 0)
                stored[where] = (message.offset() or 0) + 1
            elif offsets is not None:
                stored.update({(tp.topic, tp.partition): tp.offset for tp in offsets})
            else:
                stored.update(self.positions)
        return None

    def close(self) -> None:
        self.log.fault("close", self)
        if self.closed:
            return
        self.closed = True
        if self.group is not None and self.member_id is not None:
            with self.log.lock:
                self.log.leave(self.group, self.member_id)
        self.member_id = None


class MemoryProducer:
    """confluent_kafka.Producer's calls the loops make, transactions included."""

    def __init__(self, log: MemoryLog, config: dict[str, Any]):
        self.log = log
        self.txn_id: str | None = config.get("transactional.id")
        self.timeout_s = int(config.get("transaction.timeout.ms", 60_000)) / 1000
        self.epoch: int | None = None
        self.txn: _Txn | None = None
        self.pending: list[tuple[Callable[..., None], Message]] = []

    def _check(self, call: str) -> None:
        self.log.fault(call, self)

    def _fenced(self) -> bool:
        return self.txn_id is not None and self.log.epochs.get(self.txn_id) != self.epoch

    def _require_open(self, call: str) -> _Txn:
        if self._fenced():
            raise _error(
                KafkaError._FENCED,
                f"{call}: producer fenced by a newer epoch",
                fatal=True,
            )
        txn = self.txn
        if txn is None:
            raise _error(KafkaError._STATE, f"{call}: no transaction in progress")
        if txn.state != "open":
            raise _error(
                KafkaError.INVALID_PRODUCER_EPOCH,
                f"{call}: the transaction was aborted (timed out)",
                txn_requires_abort=True,
            )
        return txn

    def init_transactions(self, timeout: float | None = None) -> None:
        self._check("init_transactions")
        if self.txn_id is None:
            raise _error(KafkaError._NOT_CONFIGURED, "no transactional.id")
        with self.log.lock:
            previous = self.log.open.get(self.txn_id)
            if previous is not None:
                self.log.end_transaction(previous, "aborted")
            self.epoch = self.log.epochs.get(self.txn_id, -1) + 1
            self.log.epochs[self.txn_id] = self.epoch

    def begin_transaction(self) -> None:
        self._check("begin_transaction")
        with self.log.lock:
            if self._fenced() or self.epoch is None:
                raise _error(KafkaError._FENCED, "begin_transaction: fenced", fatal=True)
            if self.txn is not None and self.txn.state == "open":
                raise _error(KafkaError._STATE, "a transaction is already in progress")
            assert self.txn_id is not None
            self.txn = _Txn(self.txn_id, self.epoch, self.log.clock.monotonic(), self.timeout_s)
            self.log.open[self.txn_id] = self.txn

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        on_delivery: Callable[..., None] | None = None,
        timestamp: int = 0,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        callback: Callable[..., None] | None = None,
    ) -> None:
        self._check("produce")
        with self.log.lock:
            self.log.expire()
            txn = self._require_open("produce") if self.txn_id is not None else None
            parts = self.log.topics.get(topic)
            if parts is None:
                raise _error(KafkaError._UNKNOWN_TOPIC, f"no topic {topic}")
            if partition < 0:
                partition = partition_for((key or b"").decode(), len(parts))
            now_ms = int(self.log.clock.time() * 1000)
            kind = (
                TIMESTAMP_LOG_APPEND_TIME
                if topic in self.log.log_append_time
                else TIMESTAMP_CREATE_TIME
            )
            stamp = now_ms if kind == TIMESTAMP_LOG_APPEND_TIME or not timestamp else timestamp
            encoded = None
            if headers is not None:
                encoded = [(k, v.encode() if isinstance(v, str) else v) for k, v in headers]
            record = _Record(key, value, encoded, (kind, stamp), txn)
            parts[partition].append(record)
            self.log.changed.notify_all()
            report = on_delivery or callback
            if report is not None:
                self.pending.append(
                    (report, _message(topic, partition, len(parts[partition]) - 1, record))
                )

    def poll(self, timeout: float | None = None) -> int:
        self._check("poll")
        served, self.pending = self.pending, []
        for report, message in served:
            report(None, message)
        return len(served)

    def flush(self, timeout: float | None = None) -> int:
        self.poll(0)
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Drop what is not delivered yet: each delivery report says it was purged."""
        self._check("purge")
        purged, self.pending = self.pending, []
        for report, message in purged:
            report(KafkaError(KafkaError._PURGE_QUEUE), message)

    def __len__(self) -> int:
        return len(self.pending)

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], metadata: GroupMetadata, timeout: float | None = None
    ) -> None:
        self._check("send_offsets_to_transaction")
        with self.log.lock:
            self.log.expire()
            txn = self._require_open("send_offsets_to_transaction")
            group = self.log.groups.get(metadata.group)
            member = None if group is None else group.members.get(metadata.member)
            if group is None or member is None or metadata.generation != group.generation:
                raise _error(
                    KafkaError.ILLEGAL_GENERATION,
                    f"generation {metadata.generation} of {metadata.member} is not current",
                    txn_requires_abort=True,
                )
            offsets = txn.offsets.setdefault(metadata.group, {})
            offsets.update({(tp.topic, tp.partition): tp.offset for tp in positions})

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._check("commit_transaction")
        with self.log.lock:
            self.log.expire()
            txn = self._require_open("commit_transaction")
            self.log.end_transaction(txn, "committed")
        self.poll(0)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._check("abort_transaction")
        with self.log.lock:
            if self._fenced():
                raise _error(KafkaError._FENCED, "abort_transaction: fenced", fatal=True)
            if self.txn is not None:
                self.log.end_transaction(self.txn, "aborted")
        self.pending.clear()


class MemoryAdmin:
    """The admin calls the loops make: the topics there are (and making one)."""

    def __init__(self, log: MemoryLog, config: dict[str, Any]):
        self.log = log

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        self.log.fault("list_topics", self)
        return self.log.metadata()

    def describe_consumer_groups(
        self, group_ids: list[str], request_timeout: float = -1
    ) -> dict[str, Future[GroupDescription]]:
        """Each group's live members (client.id and host), as futures like the real one."""
        self.log.fault("describe_consumer_groups", self)
        out: dict[str, Future[GroupDescription]] = {}
        with self.log.lock:
            self.log.expire()
            for group_id in group_ids:
                group = self.log.groups.get(group_id, _Group())
                members = [
                    MemberDescription(m.consumer.client_id, "memory")
                    for m in group.members.values()
                ]
                future: Future[GroupDescription] = Future()
                future.set_result(GroupDescription(group_id, members))
                out[group_id] = future
        return out


@dataclass(frozen=True, slots=True)
class MemberDescription:
    client_id: str
    host: str


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    members: list[MemberDescription]


class MemoryClients(Clients):
    """`Clients` over one `MemoryLog`: what a loop builds talks to it."""

    __slots__ = ("log",)

    def __init__(self, log: MemoryLog):
        self.log = log

    def consumer(self, config: dict[str, Any]) -> Any:
        return MemoryConsumer(self.log, config)

    def producer(self, config: dict[str, Any]) -> Any:
        return MemoryProducer(self.log, config)

    def admin(self, config: dict[str, Any]) -> Any:
        return MemoryAdmin(self.log, config)
