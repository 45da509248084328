"""Ingress and the gate as relays (streams/relay.py), on the in-memory Kafka: what is valid
reaches job-log stamped with the command's broker time, what is not reaches the DLQ with
its bytes and reason, and a batch the client refuses is committed only once delivered."""

from __future__ import annotations

import orjson
from confluent_kafka import KafkaError, KafkaException

from schemas.codec import JOB_LOG
from schemas.json import read_dlq_record
from schemas.records import JobPaused, JobUpserted
from streams.core.clock import ManualClock
from streams.gate import Gate
from streams.ingress import Ingress
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=3)


def upsert(job_id: str) -> bytes:
    return orjson.dumps(
        {
            "type": "job.upsert",
            "job_id": job_id,
            "owner": "team-a",
            "schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
            "command": ["true"],
        }
    )


def world() -> tuple[MemoryLog, MemoryClients]:
    log = MemoryLog(ManualClock())
    log.create_catalogue(SETTINGS)
    return log, MemoryClients(log)


def send(clients: MemoryClients, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = clients.producer({})
    for key, value in records:
        producer.produce(SETTINGS.topic(topic), key=key, value=value)
    producer.flush()


def run_until(relay: Ingress | Gate, log: MemoryLog, topic: str, steps: int = 50) -> None:
    """Step the relay until its group has committed every record of `topic`."""
    assert relay.open()
    for _ in range(steps):
        relay.step()
        if log.lag(SETTINGS.group(relay.name), SETTINGS.topic(topic)) == 0:
            return
    raise AssertionError(f"{relay.name} did not commit all of {topic} in {steps} steps")


def test_ingress_relays_valid_commands_with_their_broker_time_and_rejects_the_rest() -> None:
    log, clients = world()
    commands = [(f"j{i}".encode(), upsert(f"j{i}")) for i in range(20)]
    bad = b"{not json"
    pause = orjson.dumps({"type": "job.pause", "job_id": "j3"})
    send(clients, "commands", [*commands, (b"x", bad), (b"j3", pause)])
    stamps = {m.key(): m.timestamp()[1] for m in log.records(SETTINGS.topic("commands")) if m.key()}
    ingress = Ingress(SETTINGS, clients)
    run_until(ingress, log, "commands")

    relayed = [JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log"))]
    upserts = {r.spec.job_id: r for r in relayed if isinstance(r, JobUpserted)}
    assert set(upserts) == {f"j{i}" for i in range(20)}
    assert all(r.at_ms == stamps[r.spec.job_id.encode()] for r in upserts.values())
    assert [r.job_id for r in relayed if isinstance(r, JobPaused)] == ["j3"]
    # A job's records keep their order on job-log (one partition per job).
    j3 = [
        type(r).__name__
        for r in relayed
        if (r.spec.job_id if isinstance(r, JobUpserted) else getattr(r, "job_id", "")) == "j3"
    ]
    assert j3 == ["JobUpserted", "JobPaused"]
    dead = [read_dlq_record(m.value() or b"") for m in log.records(SETTINGS.topic("commands.dlq"))]
    assert [(d.original, d.topic) for d in dead] == [(bad, SETTINGS.topic("commands"))]
    assert "JSON" in dead[0].reason


def test_a_batch_the_client_refuses_is_read_again_and_nothing_is_lost() -> None:
    log, clients = world()
    send(clients, "commands", [(f"j{i}".encode(), upsert(f"j{i}")) for i in range(30)])
    refusals = [3]  # the broker away for three produce calls

    def broker_away(call: str, client: object) -> None:
        if call == "produce" and refusals[0] > 0:
            refusals[0] -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    log.faults.append(broker_away)
    ingress = Ingress(SETTINGS, clients)
    assert ingress.open()
    ingress.step()  # a refused batch: nothing of it committed
    assert log.lag(SETTINGS.group("ingress"), SETTINGS.topic("commands")) == 30
    run_until(ingress, log, "commands")
    relayed = [JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log"))]
    ids = [r.spec.job_id for r in relayed if isinstance(r, JobUpserted)]
    # At least once: every command, some twice (those delivered before the refusal).
    assert set(ids) == {f"j{i}" for i in range(30)}
    assert refusals == [0]


def test_the_gate_relays_reports_and_refuses_what_a_worker_may_not_write() -> None:
    log, clients = world()
    forged = JOB_LOG.encode(JobPaused("j1", 5))
    send(clients, "worker-reports", [(b"j1", forged), (b"j1", b"garbage")])
    gate = Gate(SETTINGS, clients)
    run_until(gate, log, "worker-reports")
    assert log.records(SETTINGS.topic("job-log")) == []
    dead = [read_dlq_record(m.value() or b"") for m in log.records(SETTINGS.topic("commands.dlq"))]
    assert [d.original for d in dead] == [forged, b"garbage"]
    assert "may not write JobPaused" in dead[0].reason
    assert "undecodable" in dead[1].reason
