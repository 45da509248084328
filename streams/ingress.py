"""Ingress: the Faust agent on `commands` (docs/architecture.md, "Ingress").

Untrusted JSON in; validated commands out to `job-log` as Avro keyed by job_id, stamped
with the broker's append time of the command (see `command_time`). A command that fails
validation goes to `commands.dlq` with its original bytes and the reason. Nothing a user
sends can stop the agent.

At-least-once, on purpose: a command delivered twice is harmless, because every command
is idempotent at the ledger (upserts and flags converge, run_now and rerun dedup on
request_id, backfills on (job, time)). The agent awaits the delivery of each batch
before Faust may commit its offsets (Faust commits an event's offset once the agent has
taken it, so a send not awaited could be lost with a crash), and sends a batch it could
not deliver again, for as long as the broker stays down, rather than ack it or exit.

Workers' records reach job-log through the gate (streams/gate.py), not through here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable
from typing import Any

import faust

from schemas.codec import JOB_LOG
from schemas.json import dlq_record
from schemas.records import (
    BackfillRequested,
    CancelRequested,
    JobDeleted,
    JobPaused,
    JobResumed,
    JobUpserted,
    LedgerInput,
    RerunRequested,
    RunNowRequested,
)
from streams import metrics
from streams.core.commands import (
    Backfill,
    CancelRun,
    Command,
    DeleteJob,
    PauseJob,
    Rejection,
    RerunRun,
    ResumeJob,
    RunNow,
    UpsertJob,
    command_job_id,
    parse_command,
)
from streams.settings import Settings

log = logging.getLogger("cronlog.ingress")
BATCH = 1000


_ACCEPTED = metrics.COMMANDS.labels("accepted")
_REJECTED = metrics.COMMANDS.labels("rejected")
_DLQ = metrics.INGRESS_DLQ.labels("ingress")
_LAG = metrics.CONSUMER_LAG["ingress"].labels("ingress", "commands")


def to_ledger_input(command: Command, at_ms: int) -> LedgerInput:
    match command:
        case UpsertJob(spec=spec):
            return JobUpserted(spec, at_ms)
        case PauseJob(job_id=job_id):
            return JobPaused(job_id, at_ms)
        case ResumeJob(job_id=job_id):
            return JobResumed(job_id, at_ms)
        case DeleteJob(job_id=job_id):
            return JobDeleted(job_id, at_ms)
        case RunNow(job_id=job_id, request_id=request_id):
            return RunNowRequested(job_id, request_id, at_ms)
        case Backfill(job_id=job_id, from_ms=start, to_ms=end, request_id=request_id):
            return BackfillRequested(job_id, start, end, at_ms, request_id)
        case CancelRun(run_id=run_id, job_id=job_id):
            return CancelRequested(job_id, run_id, at_ms)
        case RerunRun(run_id=run_id, job_id=job_id, request_id=request_id):
            return RerunRequested(job_id, run_id, request_id, at_ms)
    raise TypeError(f"unhandled command {command!r}")  # pragma: no cover - exhaustive


class UnsupportedClientConfig(ValueError):
    """A CRONLOG_KAFKA_CONFIG setting Faust's client (aiokafka) cannot be given."""


def faust_credentials(props: dict[str, str]) -> Any:
    """The CRONLOG_KAFKA_CONFIG properties (librdkafka's names) as Faust's credentials
    (aiokafka's): TLS from `ssl.*` (CA, client certificate and key), SASL PLAIN or SCRAM
    from `sasl.*`. None for PLAINTEXT. Raises UnsupportedClientConfig for what aiokafka
    cannot do the same way, rather than connect with less security than configured."""
    import ssl

    from faust.auth import SASLCredentials, SSLCredentials

    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol not in ("SSL", "SASL_SSL", "SASL_PLAINTEXT"):
        raise UnsupportedClientConfig(f"security.protocol={protocol} is not supported")
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=props.get("ssl.ca.location"))
        if props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            context.check_hostname = False
        if "ssl.certificate.location" in props:
            context.load_cert_chain(
                props["ssl.certificate.location"],
                props.get("ssl.key.location"),
                props.get("ssl.key.password"),
            )
    if protocol == "SSL":
        return SSLCredentials(context)
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "PLAIN")).upper()
    if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise UnsupportedClientConfig(f"sasl.mechanism={mechanism} is not supported by ingress")
    return SASLCredentials(
        username=props.get("sasl.username"),
        password=props.get("sasl.password"),
        ssl_context=context,
        mechanism=mechanism,
    )


def route(raw: bytes | None, at_ms: int) -> tuple[str, bytes, bytes]:
    """Decide where one raw command goes: ("job-log"|"commands.dlq", key, value)."""
    parsed = parse_command(raw)
    if isinstance(parsed, Rejection):
        return "commands.dlq", b"", parsed.reason.encode()
    job_id = command_job_id(parsed)
    return "job-log", job_id.encode(), JOB_LOG.encode(to_ledger_input(parsed, at_ms))


def command_time(message: Any, fallback_ms: int) -> int:
    """A command's time: the broker's append time of its record on `commands`
    (LogAppendTime), the one clock no producer and no ingress node can skew; the ledger
    applies job changes from it. A topic still on CreateTime gives ingress's own clock."""
    # aiokafka's record attribute: 0 CreateTime, 1 LogAppendTime; Faust gives seconds.
    if getattr(message, "timestamp_type", None) == 1 and message.timestamp is not None:
        return round(float(message.timestamp) * 1000)
    return fallback_ms


def build_app(settings: Settings) -> faust.App:
    app = faust.App(
        settings.group("ingress"),
        broker=f"kafka://{settings.kafka}",
        broker_credentials=faust_credentials(dict(settings.kafka_config)),
        store="memory://",
        web_enabled=False,
        topic_partitions=settings.partitions,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.5,
        producer_linger=0.005,
        # acks=all (Faust's default, said explicitly): an acknowledged command is on every
        # in-sync replica. Not idempotent outside transactions (aiokafka), so a retry after
        # a leader change may write a command twice: commands are idempotent for the ledger.
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",  # a new group must not skip commands
        datadir=os.path.join("/tmp", f"{settings.group('ingress')}-{os.getpid()}"),
    )

    def raw_topic(name: str) -> faust.TopicT:
        # Bytes in, bytes out: ingress decodes and encodes itself (streams/core, schemas).
        return app.topic(
            settings.topic(name),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )

    commands = raw_topic("commands")
    job_log = settings.topic("job-log")
    dlq = settings.topic("commands.dlq")

    behind: dict[int, int] = {}  # records not read yet per partition, at the last batch

    def lag(events: list[faust.EventT[bytes]]) -> None:
        """Ingress's lag: each partition's high watermark of the last fetch (what
        aiokafka knows, no broker call) minus the next offset; set once a batch is in."""
        last = {event.message.tp: event.message.offset for event in events}
        for tp, offset in last.items():
            high = app.consumer.highwater(tp)
            if high is not None:
                behind[tp.partition] = max(0, high - offset - 1)
        _LAG.set(sum(behind.values()))

    @app.agent(commands, concurrency=1)
    async def ingress(stream: faust.StreamT[bytes]) -> None:
        async for events in stream.take_events(BATCH, within=0.05):  # type: ignore[attr-defined]
            outputs: list[tuple[str, bytes | None, bytes]] = []
            now = int(time.time() * 1000)
            for event in events:
                raw = event.value
                try:
                    where, key, value = route(raw, command_time(event.message, now))
                except Exception as exc:  # noqa: BLE001 - a bug must not drop the command
                    where, key, value = "commands.dlq", b"", f"internal error: {exc!r}".encode()
                if where == "job-log":
                    outputs.append((job_log, key, value))
                else:
                    message = event.message
                    record = dlq_record(
                        raw or b"", value.decode(), message.topic, message.partition, message.offset
                    )
                    outputs.append((dlq, event.key, record))
            await deliver(outputs)
            rejected = sum(1 for topic, _, _ in outputs if topic == dlq)
            _ACCEPTED.inc(len(outputs) - rejected)  # counted once delivered
            _REJECTED.inc(rejected)
            _DLQ.inc(rejected)
            lag(events)

    async def deliver(outputs: list[tuple[str, bytes | None, bytes]]) -> None:
        """Send the batch and await every delivery; until all are delivered, send the
        whole batch again (the broker down: retried for as long as it takes). Resending
        in order keeps each job's last command last, and duplicates are harmless.

        Straight to the app's producer (the one Faust's topics use, with its default
        partitioner), not through `Topic.send`: the topic layer's per-message work
        (channels, FutureMessage, callbacks) cost more than the validation itself."""
        producer = app.producer
        tries = 0
        while True:
            try:
                pending: list[Awaitable[Any]] = [
                    await producer.send(topic, key, value, None, None, None)
                    for topic, key, value in outputs
                ]
                for future in pending:
                    await future
                return
            except Exception as exc:  # noqa: BLE001 - retried, never acked undelivered
                tries += 1
                if tries == 1 or tries % 10 == 0:
                    log.warning(
                        "could not deliver a batch of %d (%r); retrying, nothing is acked "
                        "before it is delivered (the broker may be down)",
                        len(outputs),
                        exc,
                    )
                await asyncio.sleep(1.0)

    return app
