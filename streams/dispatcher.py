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

Each concern in its module, on one shared state (streams/dispatcher_kernel.py): the
heartbeats read (streams/dispatcher_heartbeats.py), placing and placing again
(streams/dispatcher_placing.py), the failure detector's verdicts and why they are safe
(streams/dispatcher_verdicts.py); the loop and its offsets are here.

Offsets. The dispatcher commits its `dispatch` offsets (group `dispatcher`), so a
restart or a rebalance resumes where it left off instead of re-sending every assignment
of the retained log (phantom reservations, stale claims). A record is handled once the
assignment or the DispatchFailed it led to is delivered (or a newer record for the same
attempt replaced it); the offset committed for a partition, every second and on
revocation and shutdown, is its lowest record not handled yet. A record still waiting
for room holds the point, but not for long: the ledger dispatches an unclaimed attempt
again at its claim deadline, which replaces it. After a crash the records handled since
the last commit are sent again (at least once): about a second's worth.

A broker outage. The loop keeps going: the start waits for the broker to say where to read
heartbeats from, consumer errors are logged (a heartbeat consumer error restarts the
reading clock, so no worker is judged on beats it could not read), and a placement the
full local queue refuses counts as undelivered (the claim deadline re-dispatches it).
"""

from __future__ import annotations

import logging

from confluent_kafka import OFFSET_END, Consumer, KafkaException, Message, TopicPartition

from streams import metrics
from streams.dispatcher_heartbeats import Heartbeats
from streams.dispatcher_placing import Placing
from streams.dispatcher_verdicts import Verdicts
from streams.kafka import abandon_consumer
from streams.lifecycle import run_steps
from streams.placement_key import placement_key

log = logging.getLogger("cronlog.dispatcher")
# How often the handled dispatch offsets are committed.
COMMIT_EVERY_S = 1.0


class Dispatcher(Heartbeats, Placing, Verdicts):
    """One node's dispatcher: its concerns (streams/dispatcher_kernel.py) in one loop."""

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
