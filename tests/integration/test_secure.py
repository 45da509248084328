"""cronlog over SASL_SSL with a user per role and the ACLs of connectors/stack/acls.py, on a
private secured broker (`KafkaStack(secure=True)`, what `cronlog stack up --secure` runs).

- The product's core, every process with its own role's credentials: a scheduler node
  (node), a worker (worker), the projector (projector) and the REST API (api); a job
  registered through the API runs and its succeeded run is served back by the API, and
  `cronlog audit` (admin) finds nothing wrong.
- Least privilege, enforced by the broker: a worker's credentials cannot write
  `commands`, `job-log`, `dispatch` or another worker's inbox, nor read another worker's
  inbox or the shared one; the API's cannot write `run-events`; each denial is a clear
  TOPIC_AUTHORIZATION_FAILED, and nothing of it is on the topic. A worker without its
  own user stops at once, saying how to provision it.
- A registration forged with a worker's credentials, written to the one topic of the
  ledger's path a worker may write (`worker-reports`), is refused by the gate: it is in
  the dead letters and no job exists.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from schemas.codec import JOB_LOG
from schemas.records import JobUpserted
from schemas.spec import EverySchedule, JobSpec
from streams.kafka import consumer_config, producer_config
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.nodes import (
    ROOT,
    CronlogProcess,
    Node,
    ProjectorProc,
    WorkerProc,
    env_for,
    stop_all,
)
from tests.support.ports import free_port
from tests.support.secure import SecureBroker
from tests.support.waiting import eventually

TOKENS = {"CRONLOG_API_TOKENS": "tok-a-0123456789ab=team-a"}
A = {"Authorization": "Bearer tok-a-0123456789ab"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    secured = SecureBroker(tmp_path_factory.mktemp("secure-state"))
    secured.up()
    try:
        yield secured
    finally:
        secured.down()


def _produce_as(settings: Settings, topic: str, key: bytes, value: bytes) -> KafkaError | None:
    """One record produced with `settings`' credentials: its delivery error, if any."""
    producer = Producer(producer_config(settings, **{"message.timeout.ms": 10_000}))
    errors: list[KafkaError | None] = []
    producer.produce(
        settings.topic(topic), key=key, value=value, on_delivery=lambda e, _: errors.append(e)
    )
    producer.flush(20)
    assert len(errors) == 1, "no delivery report"
    return errors[0]


def _read_error(settings: Settings, topic: str) -> KafkaError | None:
    """What the broker answers `settings`' credentials reading partition 0 of `topic`.

    None if a record was read. librdkafka may not surface a fetch refusal on an assigned
    partition as a message error, so the topic's metadata answers too: Read implies
    Describe, and a principal without Describe is told TOPIC_AUTHORIZATION_FAILED.
    """
    reader = Consumer(consumer_config(settings, None))
    name = settings.topic(topic)
    try:
        # A principal without Describe is answered at once by the metadata, where a
        # poll would wait its whole bound for a refusal librdkafka keeps to itself.
        error = reader.list_topics(name, timeout=10).topics[name].error
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return error
        reader.assign([TopicPartition(name, 0, -2)])
        # A Message with an empty value is falsy (len() is its value's): wrapped in a list.
        with contextlib.suppress(AssertionError):
            got = eventually(
                lambda: [m] if (m := reader.poll(1)) is not None else None,
                f"a record or an error reading {name}",
                10,
                interval_s=0,
            )
            return cast(KafkaError | None, got[0].error())
        error = reader.list_topics(name, timeout=10).topics[name].error
        return error if isinstance(error, KafkaError) else None
    finally:
        reader.close()


def _read_all(settings: Settings, topic: str) -> list[tuple[bytes, bytes]]:
    """Every record of `topic` (as admin), read to its end."""
    reader = Consumer(consumer_config(settings, None, **{"enable.partition.eof": True}))
    found: list[tuple[bytes, bytes]] = []
    try:
        reader.assign(
            [TopicPartition(settings.topic(topic), p, -2) for p in range(settings.partitions)]
        )
        left = set(range(settings.partitions))
        while left:
            msg = reader.poll(10)
            assert msg is not None, f"{topic} not read to its end"
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                left.discard(msg.partition() or 0)
                continue
            found.append((msg.key() or b"", msg.value() or b""))
    finally:
        reader.close()
    return found


def test_the_core_over_sasl_ssl_with_least_privilege_per_role(
    broker: SecureBroker, settings: Settings, tmp_path: Path
) -> None:
    admin = broker.settings("admin", settings)
    assert broker.grant(settings.topic_prefix) > 0
    ensure_topics(admin)
    role = {
        name: broker.settings(name, settings) for name in ("node", "worker", "api", "projector")
    }
    # Each native worker its own user, as `cronlog stack add-worker` provisions it.
    role["sec-w1"], w1_env = broker.worker("sec-w1", settings)
    role["sec-w2"], _ = broker.worker("sec-w2", settings)
    port = free_port()
    procs: list[CronlogProcess] = [
        Node(role["node"], "sec-n1", tmp_path, broker.env("node")),
        WorkerProc(role["sec-w1"], "sec-w1", tmp_path, cpu=2, extra_env=w1_env),
        ProjectorProc(broker.settings("projector", settings), tmp_path / "projector.log"),
        CronlogProcess(
            role["api"],
            "api",
            tmp_path,
            ["api", "--port", str(port), "--loglevel", "warning"],
            {**TOKENS, **broker.env("api")},
        ),
    ]
    procs[2].extra_env.update(broker.env("projector"))
    for proc in procs:
        proc.start()
    try:
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

        def ready() -> bool:
            try:
                return api.get("/readyz").status_code == 200
            except httpx.TransportError:
                return False

        eventually(ready, "the API ready over SASL_SSL", timeout_s=90)
        job = {"job_id": "sec-hello", "schedule": {"every": "2s"}, "command": ["echo", "hi"]}
        assert api.post("/jobs", json=job, headers=A).status_code in (201, 202)

        def succeeded() -> list[dict[str, Any]]:
            answer = api.get("/jobs/sec-hello/runs", headers=A)
            items = answer.json()["items"] if answer.status_code == 200 else []
            return [r for r in items if r["state"] == "succeeded"]

        runs = eventually(succeeded, "a succeeded run served by the API", timeout_s=90)
        logs = api.get(f"/runs/{runs[0]['run_id']}/logs", headers=A)
        assert logs.status_code == 200
        assert "hi" in logs.text

        # What each role may not write, the broker refuses.
        forged = JOB_LOG.encode(
            JobUpserted(JobSpec("sec-forged", "team-a", EverySchedule(1000), ("id",)), 1)
        )
        denied = [
            ("sec-w1", "commands", orjson.dumps({"type": "job.upsert", "job_id": "sec-forged"})),
            ("sec-w1", "job-log", forged),
            ("sec-w1", "dispatch", b"any command for any worker"),
            ("sec-w2", "worker-inbox.sec-w1", b"a forged assignment"),
            ("api", "run-events", b"a forged outcome"),
        ]
        for who, topic, value in denied:
            error = _produce_as(role[who], topic, b"sec-forged", value)
            assert error is not None, f"{who} wrote {topic}"
            assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (who, topic, error)
        # Only nodes read the placement key: a worker cannot seal a placement for itself.
        assert _read_all(admin, "node-keys"), "the node wrote no placement key"
        for who in ("sec-w1", "api", "projector"):
            error = _read_error(role[who], "node-keys")
            assert error is not None, f"{who} read the placement key"
            assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (who, error)
        # A worker reads its own inbox (the seals of its placements) and no other's, nor
        # the shared one of HTTP workers: it cannot claim or report what is not its own.
        assert _read_error(role["sec-w1"], "worker-inbox.sec-w1") is None
        for who, inbox in (("sec-w2", "worker-inbox.sec-w1"), ("sec-w2", "worker-inbox")):
            error = _read_error(role[who], inbox)
            assert error is not None, f"{who} read {inbox}"
            assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (who, inbox, error)
        # A worker nobody provisioned (the shared worker user) cannot make an inbox: it
        # stops at once with what to do, rather than heartbeat and never hear anything.
        unknown = subprocess.run(
            [sys.executable, "-m", "connectors.cli", "worker", "--id", "sec-w3", "--cpu", "1"],
            cwd=ROOT,
            env={**env_for(role["worker"]), **broker.env("worker")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert unknown.returncode == 1, unknown.stdout + unknown.stderr
        assert "provision the worker first (cronlog stack add-worker sec-w3" in unknown.stderr
        # The topic a worker may write: the gate refuses what is not a claim or outcome.
        assert _produce_as(role["sec-w2"], "worker-reports", b"sec-forged", forged) is None

        def refused() -> list[dict[str, Any]]:
            letters = [orjson.loads(v) for _, v in _read_all(admin, "commands.dlq")]
            return [d for d in letters if d["topic"] == admin.topic("worker-reports")]

        (letter,) = eventually(refused, "the forged registration in the dead letters")
        assert letter["reason"] == "a worker may not write JobUpserted (only claims and outcomes)"
        for topic in ("commands", "job-log", "dispatch", "run-events"):
            assert not [k for k, _ in _read_all(admin, topic) if k == b"sec-forged"], topic
        assert api.get("/jobs/sec-forged", headers=A).status_code == 404

        audit = subprocess.run(
            [sys.executable, "-m", "connectors.cli", "audit"],
            cwd=ROOT,
            env={**env_for(admin), **broker.env("admin")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert audit.returncode == 0, audit.stdout + audit.stderr
    finally:
        stop_all(reversed(procs))
    for proc in procs:
        log = proc.log.read_text(errors="replace")
        assert "AUTHORIZATION_FAILED" not in log, f"{proc.name} was denied something it needs"
