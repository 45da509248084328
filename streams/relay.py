"""A relay: records read from one topic, each judged by a pure route, forwarded at least once.

Ingress (`commands` -> `job-log`, streams/ingress.py) and the gate (`worker-reports` ->
`job-log`, streams/gate.py) are this one loop with their own route: a consumer group
reads batches of up to `batch` records; `route(msg)` says where each goes, as a logical
topic name (`job-log`, or `commands.dlq` with the reason); a refused record goes to the
dead-letter topic as its original bytes, the reason and where it was read
(`schemas.json.dlq_record`); a route that raises is a bug and sends the record to the
DLQ with it, never drops it, never stops the loop.

At least once: a batch's offsets are committed only after every record of it was
delivered (acks=all, the idempotent producer: in order per partition); a batch not
delivered is read again (the consumer is sought back to its first records), for as long
as the broker stays down. What is relayed twice is harmless downstream: commands are
idempotent at the ledger, and it answers a repeated claim again and ignores a repeated
outcome. A rebalance is served inside `consume`, between batches, so no batch is in
flight when partitions move; a commit refused after one only means the new owner reads
those records again.

A plain confluent-kafka loop: librdkafka consumes and produces a batch for a few
microseconds a record, and the route's own Python is the cost (docs/performance.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import Counter

from schemas.json import dlq_record
from streams.kafka import Clients, consumer_config, producer_config
from streams.lifecycle import run_steps
from streams.metrics import ConsumerLag
from streams.settings import Settings
from streams.topics import DLQ_MAX_BYTES

# A DLQ envelope (a record's bytes in base64, a third larger) must fit in a produce.
RELAY_PRODUCER = {"message.max.bytes": DLQ_MAX_BYTES}

# Where one record goes: (logical topic, key, value). To `commands.dlq` the value is the
# reason (the relay wraps the original bytes around it).
Route = Callable[[Message], tuple[str, bytes, bytes]]
DLQ = "commands.dlq"


@dataclass(frozen=True, slots=True)
class Outcomes:
    """The counters of one relay, counted once a batch is delivered."""

    passed: Counter
    refused: Counter
    dlq: Counter


class Relay:
    def __init__(
        self,
        settings: Settings,
        clients: Clients,
        *,
        name: str,
        source: str,
        route: Route,
        outcomes: Outcomes,
        batch: int,
        warn_refused: bool,
    ) -> None:
        self.settings = settings
        self.log = logging.getLogger(f"cronlog.{name}")
        self.name = name
        self.source = settings.topic(source)
        self.route = route
        self.outcomes = outcomes
        self.batch = batch
        self.warn_refused = warn_refused  # a worker's refused record is news; a user's typo not
        self.consumer = clients.consumer(consumer_config(settings, settings.group(name)))
        self.producer = clients.producer(producer_config(settings, **RELAY_PRODUCER))
        self.lag = ConsumerLag(name, settings.topic_prefix)
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        run_steps(self.open, self.step, self.close, self._stop)

    def open(self) -> bool:
        self.consumer.subscribe([self.source])
        return True

    def step(self) -> None:
        """One batch: read, route, deliver, commit (or read it again)."""
        batch = [m for m in self.consumer.consume(self.batch, timeout=0.05) if self._usable(m)]
        if batch:
            self._relay(batch)
        self.lag.report(self.consumer)

    def close(self) -> None:
        self.producer.flush(10)
        self.consumer.close()

    def _relay(self, batch: list[Message]) -> None:
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(err)

        refused = 0
        for msg in batch:
            try:
                where, key, value = self.route(msg)
            except Exception as exc:  # noqa: BLE001 - a bug must not drop the record
                where, key, value = DLQ, b"", f"internal error: {exc!r}".encode()
            if where != DLQ:
                if not self._produce(self.settings.topic(where), key, value, delivered):
                    return self._seek_back(batch)  # stopping: the next owner reads them
                continue
            refused += 1
            if self.warn_refused:
                self.log.warning("%s refused: %s", self.name, value.decode())
            envelope = dlq_record(
                msg.value() or b"",
                value.decode(),
                msg.topic() or "",
                msg.partition() or 0,
                msg.offset() or 0,
            )
            if not self._produce(self.settings.topic(DLQ), msg.key(), envelope, delivered):
                return self._seek_back(batch)
        left = self.producer.flush(30)
        if failed or left:
            self.log.warning(
                "could not deliver a batch of %d from %s (%s); reading it again, nothing is "
                "committed before it is delivered (the broker may be down)",
                len(batch),
                self.source,
                failed[0] if failed else f"{left} undelivered",
            )
            self._seek_back(batch)
            self._stop.wait(1.0)  # the broker away: no busy loop
            return
        self.outcomes.passed.inc(len(batch) - refused)
        self.outcomes.refused.inc(refused)
        self.outcomes.dlq.inc(refused)
        ends: dict[int, int] = {}
        for msg in batch:
            ends[msg.partition() or 0] = (msg.offset() or 0) + 1
        offsets = [TopicPartition(self.source, p, o) for p, o in ends.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # noqa: BLE001 - read again after a restart: harmless
            self.log.warning("could not commit %s's offsets (%s)", self.name, exc)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        delivered: Callable[[KafkaError | None, Message], None],
    ) -> bool:
        """Queue one record; False if the relay was stopped while the queue was full
        (then nothing of the batch may be committed)."""
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=delivered)
                return True
            except BufferError:  # the local queue is full (the broker is slow or down)
                self.producer.poll(0.5)
                if self._stop.is_set():
                    return False
            except KafkaException as exc:  # refused by the client: the batch is undelivered
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError):
                    error = KafkaError(KafkaError._FAIL, str(exc))
                delivered(error, None)  # type: ignore[arg-type]
                return True

    def _seek_back(self, batch: list[Message]) -> None:
        first: dict[int, int] = {}
        for msg in batch:
            first.setdefault(msg.partition() or 0, msg.offset() or 0)
        for partition, offset in first.items():
            try:
                self.consumer.seek(TopicPartition(self.source, partition, offset))
            except Exception as exc:  # noqa: BLE001 - revoked meanwhile: its next owner reads it
                self.log.warning("could not seek back partition %d (%s)", partition, exc)

    def _usable(self, msg: Message) -> bool:
        err = msg.error()
        if err is None:
            return True
        if err.code() != KafkaError._PARTITION_EOF:
            self.log.warning("%s consumer error: %s", self.source, err)
        return False
