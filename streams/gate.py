"""The gate: workers' records from `worker-reports` to `job-log`, and nothing else.

Workers do not write `job-log` (where registrations are): their claims, starts, outcomes
and releases go to `worker-reports`, and this loop, one per scheduler node in its own
consumer group, relays them. What is relayed is decided by `report_route`: the four
kinds a worker writes pass as they are, keyed by the job they name (so on that job's
partition whatever key they were sent with); anything else (a forged registration, a
firing, garbage) goes to `commands.dlq` with the reason.

At least once: a batch's offsets are committed only after every record of it was
delivered; a batch not delivered is read again (the consumer is sought back), for as
long as the broker stays down. A report relayed twice is harmless: the ledger answers a
repeated claim again and ignores a repeated outcome.

A plain confluent-kafka loop, not a Faust agent like command ingress: each run costs
three reports, and Faust's per-event path with aiokafka's producer cost ~0.5 ms of CPU
per run at 500 runs/s, enough to saturate this two-core machine (measured by
`bench.costs`, docs/performance.md); librdkafka relays a batch for a few microseconds a
record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, TopicPartition

from schemas.codec import JOB_LOG, CodecError
from schemas.json import dlq_record
from schemas.records import ClaimRequested, RunFinished, RunReleased, RunStarted
from streams import metrics
from streams.kafka import KAFKA_CLIENTS, Clients, consumer_config, producer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.gate")
BATCH = 2000
_RELAYED = metrics.GATE_RECORDS.labels("relayed")
_REFUSED = metrics.GATE_RECORDS.labels("refused")
_DLQ = metrics.INGRESS_DLQ.labels("gate")


def report_route(raw: bytes | None) -> tuple[str, bytes, bytes]:
    """Where one record from `worker-reports` goes: ("job-log", its job id, its own
    bytes) for a worker's claim or outcome; ("commands.dlq", b"", the reason) else. A
    worker's credentials reach no further: they cannot register, change or fire a job."""
    try:
        record = JOB_LOG.decode(raw or b"")
    except CodecError as exc:
        return "commands.dlq", b"", f"undecodable worker report: {exc}".encode()
    if not isinstance(record, ClaimRequested | RunStarted | RunFinished | RunReleased):
        kind = type(record).__name__
        return (
            "commands.dlq",
            b"",
            f"a worker may not write {kind} (only claims and outcomes)".encode(),
        )
    return "job-log", record.job_id.encode(), raw or b""


class Gate:
    def __init__(self, settings: Settings, clients: Clients = KAFKA_CLIENTS):
        self.settings = settings
        self.clients = clients
        self.source = settings.topic("worker-reports")
        self.job_log = settings.topic("job-log")
        self.dlq = settings.topic("commands.dlq")
        self.consumer = self.clients.consumer(consumer_config(settings, settings.group("gate")))
        self.producer = self.clients.producer(producer_config(settings))
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.consumer.subscribe([self.source])
        try:
            while not self._stop.is_set():
                batch = [m for m in self.consumer.consume(BATCH, timeout=0.05) if _usable(m)]
                if batch:
                    self._relay(batch)
        finally:
            self.producer.flush(10)
            self.consumer.close()

    def _relay(self, batch: list[Message]) -> None:
        failed: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failed.append(err)

        refused = 0
        for msg in batch:
            raw = msg.value()
            try:
                where, key, value = report_route(raw)
            except Exception as exc:  # noqa: BLE001 - a bug must not drop the report
                where, key, value = "commands.dlq", b"", f"internal error: {exc!r}".encode()
            if where == "job-log":
                self._produce(self.job_log, key, value, delivered)
                continue
            refused += 1
            log.warning("worker report refused: %s", value.decode())
            envelope = dlq_record(
                raw or b"",
                value.decode(),
                msg.topic() or "",
                msg.partition() or 0,
                msg.offset() or 0,
            )
            self._produce(self.dlq, msg.key(), envelope, delivered)
        left = self.producer.flush(30)
        if failed or left:
            log.warning(
                "could not relay a batch of %d worker reports (%s); reading it again",
                len(batch),
                failed[0] if failed else f"{left} undelivered",
            )
            self._seek_back(batch)
            return
        _RELAYED.inc(len(batch) - refused)
        _REFUSED.inc(refused)
        _DLQ.inc(refused)
        ends: dict[int, int] = {}
        for msg in batch:
            ends[msg.partition() or 0] = (msg.offset() or 0) + 1
        offsets = [TopicPartition(self.source, p, o) for p, o in ends.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # noqa: BLE001 - read again after a restart: harmless
            log.warning("could not commit the gate's offsets (%s)", exc)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        delivered: Callable[[KafkaError | None, Message], None],
    ) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=delivered)
                return
            except BufferError:  # the local queue is full (the broker is slow or down)
                self.producer.poll(0.5)
                if self._stop.is_set():
                    return

    def _seek_back(self, batch: list[Message]) -> None:
        first: dict[int, int] = {}
        for msg in batch:
            first.setdefault(msg.partition() or 0, msg.offset() or 0)
        for partition, offset in first.items():
            try:
                self.consumer.seek(TopicPartition(self.source, partition, offset))
            except Exception as exc:  # noqa: BLE001 - revoked meanwhile: its next owner reads it
                log.warning("could not seek back partition %d (%s)", partition, exc)


def _usable(msg: Message) -> bool:
    err = msg.error()
    if err is None:
        return True
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("worker-reports consumer error: %s", err)
    return False
