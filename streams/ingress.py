"""Ingress: the relay from `commands` to `job-log` (docs/architecture.md, "Ingress").

Untrusted JSON in; validated commands out to `job-log` as Avro keyed by job_id, stamped
with the broker's append time of the command (see `command_time`). A command that fails
validation goes to `commands.dlq` with its original bytes and the reason. Nothing a user
sends can stop the loop.

At-least-once, on purpose: a command delivered twice is harmless, because every command
is idempotent at the ledger (upserts and flags converge, run_now and rerun dedup on
request_id, backfills on (job, time)). The loop is streams/relay.py's: a batch's offsets
are committed only once all of it was delivered, and a batch not delivered is read
again, for as long as the broker stays down. One consumer group (`ingress`) over the
nodes: each node relays the `commands` partitions it is given.

Why a plain confluent-kafka loop and not a Faust agent: a Faust agent that only counts
what it is handed stays below the 10,000 registrations a second the design asks, before
any validation, while validating a command (`route`) and librdkafka's batches cost
microseconds a record. The figures are in docs/performance.md's changelog.

Workers' records reach job-log through the gate (streams/gate.py), not through here.
"""

from __future__ import annotations

import time

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from schemas.codec import JOB_LOG
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
from streams.kafka import KAFKA_CLIENTS, Clients
from streams.relay import DLQ, Outcomes, Relay
from streams.settings import Settings

# Commands per batch: one flush and one offset commit each (~0.3 KB a command).
BATCH = 5000


def to_ledger_input(command: Command, at_ms: int) -> LedgerInput:
    match command:
        case UpsertJob(spec=spec):
            return JobUpserted(spec, at_ms)
        case PauseJob(job_id=job_id):
            return JobPaused(job_id, at_ms)
        case ResumeJob(job_id=job_id, missed=missed):
            return JobResumed(job_id, at_ms, missed)
        case DeleteJob(job_id=job_id):
            return JobDeleted(job_id, at_ms)
        case RunNow(job_id=job_id, request_id=request_id, params=params):
            return RunNowRequested(job_id, request_id, at_ms, params)
        case Backfill(
            job_id=job_id, from_ms=start, to_ms=end, request_id=request_id, params=params
        ):
            return BackfillRequested(job_id, start, end, at_ms, request_id, params)
        case CancelRun(run_id=run_id, job_id=job_id):
            return CancelRequested(job_id, run_id, at_ms)
        case RerunRun(run_id=run_id, job_id=job_id, request_id=request_id):
            return RerunRequested(job_id, run_id, request_id, at_ms)
    raise TypeError(f"unhandled command {command!r}")  # pragma: no cover - exhaustive


def route(raw: bytes | None, at_ms: int) -> tuple[str, bytes, bytes]:
    """Decide where one raw command goes: ("job-log"|DLQ, key, value)."""
    parsed = parse_command(raw)
    if isinstance(parsed, Rejection):
        return DLQ, b"", parsed.reason.encode()
    job_id = command_job_id(parsed)
    return "job-log", job_id.encode(), JOB_LOG.encode(to_ledger_input(parsed, at_ms))


def command_time(msg: Message, fallback_ms: int) -> int:
    """A command's time: the broker's append time of its record on `commands`
    (LogAppendTime), the one clock no producer and no ingress node can skew; the ledger
    applies job changes from it. A topic still on CreateTime gives ingress's own clock."""
    kind, stamp = msg.timestamp()
    return stamp if kind == TIMESTAMP_LOG_APPEND_TIME else fallback_ms


class Ingress(Relay):
    def __init__(self, settings: Settings, clients: Clients = KAFKA_CLIENTS):
        super().__init__(
            settings,
            clients,
            name="ingress",
            source="commands",
            route=_route,
            outcomes=Outcomes(
                metrics.COMMANDS.labels("accepted"),
                metrics.COMMANDS.labels("rejected"),
                metrics.INGRESS_DLQ.labels("ingress"),
            ),
            batch=BATCH,
            warn_refused=False,
        )


def _route(msg: Message) -> tuple[str, bytes, bytes]:
    return route(msg.value(), command_time(msg, int(time.time() * 1000)))
