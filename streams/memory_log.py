"""The in-memory Kafka's cluster (streams/memory.py has what it keeps of Kafka and what it
leaves out): topics of partitioned logs, transactions and consumer groups behind one lock,
every timeout read on its clock, and the faults a test injects before each client call.

The clients over it are streams/memory_consumer.py's and streams/memory_producer.py's. The
records, transactions and groups below keep their leading underscore: they are the
in-memory Kafka's own, shared by those modules and used nowhere else.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message

from streams.core.clock import SYSTEM_CLOCK, Clock, ManualClock
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


class _Named(Protocol):
    """What the log keeps of a member's consumer: the client.id an admin describes it by."""

    client_id: str


@dataclass
class _Member:
    consumer: _Named  # a MemoryConsumer (streams/memory_consumer.py)
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
