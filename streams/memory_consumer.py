"""The in-memory Kafka's consumer (streams/memory.py): confluent_kafka.Consumer's calls
the loops make, over a `MemoryLog` (streams/memory_log.py): group membership and its
rebalance callbacks, positions and committed offsets, read_committed reading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    Message,
    TopicPartition,
)

from streams.core.timing import TIMING
from streams.memory_log import (
    ClusterMetadata,
    GroupMetadata,
    MemoryLog,
    Where,
    _error,
    _Group,
    _Member,
    _message,
    _Record,
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
