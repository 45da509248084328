"""The gate: workers' records from `worker-reports` to `job-log`, and nothing else.

Workers do not write `job-log` (where registrations are): their claims, starts, outcomes
and releases go to `worker-reports`, and this loop, one per node in its own
consumer group, relays them. What is relayed is decided by `report_route`: the four
kinds a worker writes pass as they are, keyed by the job they name (so on that job's
partition whatever key they were sent with); anything else (a forged registration, a
firing, garbage) goes to `commands.dlq` with the reason.

The loop is streams/relay.py's (at least once: a batch's offsets are committed only
after all of it was delivered; a report relayed twice is harmless, the ledger answers a
repeated claim again and ignores a repeated outcome).
"""

from __future__ import annotations

from confluent_kafka import Message

from schemas.codec import JOB_LOG, CodecError
from schemas.records import ClaimRequested, RunFinished, RunReleased, RunStarted
from streams import metrics
from streams.kafka import KAFKA_CLIENTS, Clients
from streams.relay import Outcomes, Relay
from streams.settings import Settings

BATCH = 2000


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


class Gate(Relay):
    def __init__(self, settings: Settings, clients: Clients = KAFKA_CLIENTS):
        super().__init__(
            settings,
            clients,
            name="gate",
            source="worker-reports",
            route=_route,
            outcomes=Outcomes(
                metrics.GATE_RECORDS.labels("relayed"),
                metrics.GATE_RECORDS.labels("refused"),
                metrics.INGRESS_DLQ.labels("gate"),
            ),
            batch=BATCH,
            warn_refused=True,
        )


def _route(msg: Message) -> tuple[str, bytes, bytes]:
    return report_route(msg.value())
