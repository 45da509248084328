"""The ledger as a member of its consumer group: its consumer (named by its client.id,
watched, replaced when stuck out of the group) and the errors it reports; assignments taken
over (streams/ledger_takeover.py) and revocations dropped; readiness; and the check that no
newer live process runs under its node id (streams/identity.py).
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from streams import metrics
from streams.core.clock import Clock
from streams.identity import NodeIdTaken, ledger_client_id, newer_twins
from streams.kafka import Clients, GroupWatch, abandon_consumer, consumer_config
from streams.ledger_takeover import PartitionState, TakenOver, Takeover
from streams.lifecycle import trim_malloc_once
from streams.settings import Settings
from streams.state_store import DiskStore

log = logging.getLogger("cronlog.ledger")


class Membership:
    """Joins the group, takes over what it is given and lets go of what it loses."""

    # What this concern uses of the ledger (set by Ledger.__init__, streams/ledger.py).
    admin: AdminClient
    assigned: bool
    clients: Clients
    clock: Clock
    consumer: Consumer
    incarnation: str
    node_id: str
    settings: Settings
    share: tuple[int, int]
    state: dict[int, PartitionState]
    store: DiskStore | None
    takeover: Takeover
    topics: dict[str, str]
    watch: GroupWatch
    _brokers_were_down: bool
    _identity_due: bool
    _stop: threading.Event

    def _new_consumer(self) -> Consumer:
        return self.clients.consumer(
            consumer_config(
                self.settings,
                self.settings.group("ledger"),
                **{
                    "enable.partition.eof": False,
                    # Names the process in the broker's view of the group. Which
                    # partitions a node's ledger processes get is the broker's choice
                    # (its range assignor orders members by their random ids): the share
                    # `range_share` reads ahead is a guess, and a partition it did not
                    # read ahead is restored from the start.
                    "client.id": ledger_client_id(self.share[0], self.incarnation, self.node_id),
                    "error_cb": self._client_error,
                    **self.watch.config(),
                },
            )
        )

    def _subscribe(self) -> None:
        self.consumer.subscribe(
            [self.topics["job-log"]],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )

    def _replace_consumer(self) -> None:
        """A consumer stuck out of its group (GroupWatch): a new member in its place,
        between transactions (none is open). The state goes with the old member and is
        restored on the new assignment; the old member's group generation is stale, so
        nothing it could still send commits (module docstring, Fencing)."""
        abandon_consumer(self.consumer, "ledger")
        for partition in list(self.state):
            self._drop(partition)
        self.consumer = self._new_consumer()
        self._subscribe()

    def _client_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_were_down = True

    def _usable(self, msg: Message) -> bool:
        error = msg.error()
        if error is None:
            return True
        if error.fatal():
            raise KafkaException(error)
        log.warning("consumer error: %s", error)
        return False

    # -- assignment ---------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:  # a replaced consumer, closing late
            return
        started = self.clock.monotonic()
        taken = self._take_over(partitions)
        positions = taken.positions
        # Assigned here, with the offsets the state was restored for: librdkafka must
        # not look the committed offsets up again after the restore (see
        # `Takeover.take_over`).
        consumer.incremental_assign(positions)
        self.watch.reset()  # in the group (the statistics said otherwise while it restored)
        self.assigned = True
        self._identity_due = True
        metrics.LEDGER_PARTITIONS.set(len(self.state))
        if self._stop.is_set():
            return  # stopping: nothing is decided any more
        log.info(
            "ledger %s owns job-log partitions %s: restored from %d state records in %.2f s",
            self.node_id,
            sorted(tp.partition for tp in positions),
            taken.records,
            self.clock.monotonic() - started,
        )
        trim_malloc_once(f"ledger {self.node_id} restored", log.info)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:  # a replaced consumer, closing late
            return
        for tp in partitions:
            self._drop(tp.partition)

    def ready(self) -> str | None:
        """None once its partitions are assigned and restored, else why not."""
        return None if self.assigned else "ledger: no partitions assigned and restored yet"

    def _drop(self, partition: int) -> None:
        self.state.pop(partition, None)
        metrics.LEDGER_PARTITIONS.set(len(self.state))
        if self.store is not None:
            self.store.drop(partition)

    def _take_over(self, partitions: list[TopicPartition]) -> TakenOver:
        """Committed offsets first, then the state (held from here on), then the
        positions to resume from (returned; the caller assigns or seeks them). Used on
        assignment and recovery. `Takeover.take_over` (streams/ledger_takeover.py) says
        why in that order."""
        taken = self.takeover.take_over(self.consumer, partitions)
        self.state.update(taken.states)  # none when stop() cut the restore short
        return taken

    def _check_node_id(self) -> None:
        """A newer live process under this node id (streams/identity.py): this one goes.
        Else a fence came from this process's own replaced producer or a transaction
        timeout, and it recovers."""
        self._identity_due = False
        newer = newer_twins(
            self.admin, self.settings.group("ledger"), self.node_id, self.incarnation
        )
        if newer:
            raise NodeIdTaken(
                f"ledger {self.node_id} (incarnation {self.incarnation}) was replaced by a "
                f"live ledger under its node id ({', '.join(newer)}); this one stops"
            )
