"""A secret referenced by a job's env reaches the job and nothing else: real node, worker,
projector and API; then every topic, every table, the API's answers, the dashboard and
the processes' logs are searched for a canary value."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from connectors.api.ui import COOKIE
from streams.settings import Settings
from tests.support.nodes import (
    CronlogProcess,
    EventReader,
    Node,
    ProjectorProc,
    WorkerProc,
    job,
    send_commands,
    stop_all,
)
from tests.support.ports import free_port
from tests.support.waiting import eventually

CANARY = "canary-7f3a9c1e-do-not-leak"
A = {"Authorization": "Bearer tok-s-0123456789ab"}


@pytest.fixture
def stack(topics: Settings, tmp_path: Path) -> Iterator[httpx.Client]:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "canary-token").write_text(CANARY + "\n")
    port = free_port()
    procs: list[CronlogProcess] = [
        Node(topics, "sec-n1", tmp_path),
        WorkerProc(topics, "sec-w1", tmp_path, extra_env={"CRONLOG_SECRETS_DIR": str(secrets)}),
        ProjectorProc(topics, tmp_path / "projector.log"),
        CronlogProcess(
            topics,
            "api",
            tmp_path,
            ["api", "--port", str(port), "--loglevel", "info"],
            {"CRONLOG_API_TOKENS": "tok-s-0123456789ab=team-s"},
        ),
    ]
    for proc in procs:
        proc.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            eventually(lambda: _ready(client), "the API")
            yield client
    finally:
        stop_all(reversed(procs))


def _visible(client: httpx.Client, job_id: str) -> bool:
    return client.get(f"/jobs/{job_id}", headers=A).status_code == 200


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def test_a_secret_reaches_the_job_and_nothing_else(
    topics: Settings, tmp_path: Path, stack: httpx.Client
) -> None:
    digest = hashlib.sha256(CANARY.encode()).hexdigest()
    env = {"TOKEN": {"secret": "canary-token"}, "PLAIN": "not secret"}
    send_commands(
        topics,
        [
            job(
                "sec-job",
                ["sh", "-c", 'printf %s "$TOKEN" | sha256sum; echo "$PLAIN"'],
                owner="team-s",
                env=env,
            ),
            job("sec-missing", ["true"], owner="team-s", env={"X": {"secret": "nope"}}),
        ],
    )
    events = EventReader(topics, "sec-events")
    try:
        for job_id in ("sec-job", "sec-missing"):
            eventually(partial(_visible, stack, job_id), job_id)
            assert stack.post(f"/jobs/{job_id}/run-now", headers=A).status_code in (200, 202)

        def final(job_id: str) -> dict[str, object] | None:
            items = stack.get(f"/jobs/{job_id}/runs", headers=A).json()["items"]
            done = [r for r in items if r["state"] in ("succeeded", "failed")]
            return done[0] if done else None

        ran = eventually(lambda: final("sec-job"), "the secret job to finish", 90)
        missing = eventually(lambda: final("sec-missing"), "the missing secret to fail", 90)
        events.settle()  # every record those runs cause is written before the search below
    finally:
        events.close()
    assert ran["state"] == "succeeded", ran
    log = eventually(
        lambda: stack.get(f"/runs/{ran['run_id']}/logs", headers=A).text, "the job's log"
    )
    assert log == f"{digest}  -\nnot secret\n"  # the job saw the secret's value
    assert missing["state"] == "failed"
    assert "secret 'nope' is not available" in str(missing["error"])
    spec = stack.get("/jobs/sec-job", headers=A).json()["spec"]
    assert spec["secret_env"] == {"TOKEN": "canary-token"}  # the name, never the value
    assert spec["env"] == {"PLAIN": "not secret"}

    # Nowhere else: the API's answers and the dashboard...
    answers = [
        stack.get("/jobs/sec-job", headers=A).text,
        stack.get("/jobs", headers=A).text,
        stack.get("/jobs/sec-job/runs", headers=A).text,
        stack.get(f"/runs/{ran['run_id']}", headers=A).text,
        log,
        stack.get("/ui/jobs/sec-job", cookies={COOKIE: "tok-s-0123456789ab"}).text,
        stack.get(f"/ui/runs/{ran['run_id']}", cookies={COOKIE: "tok-s-0123456789ab"}).text,
    ]
    assert all(CANARY not in text for text in answers)
    # ...every record of every topic (aborted transactions too)...
    assert _records_containing(topics, CANARY.encode()) == []
    # ...every row of every table...
    with psycopg.connect(topics.database_url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            )
        ]
        assert "runs" in tables
        for table in tables:
            found = conn.execute(
                f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', (f"%{CANARY}%",)
            ).fetchone()
            assert found == (0,), table
    # ...and every process's log.
    for path in tmp_path.glob("*.log"):
        assert CANARY not in path.read_text(errors="replace"), path


def _records_containing(settings: Settings, needle: bytes) -> list[str]:
    admin = AdminClient({"bootstrap.servers": settings.kafka})
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(settings.topic(""))]
    assert settings.topic("run-events") in names
    reader = Consumer(
        {
            "bootstrap.servers": settings.kafka,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    found: list[str] = []
    try:
        meta = reader.list_topics(timeout=10)
        wanted = [
            TopicPartition(name, p, 0) for name in names for p in meta.topics[name].partitions
        ]
        reader.assign(wanted)
        left = {(tp.topic, tp.partition) for tp in wanted}
        while left:
            msg = reader.poll(5)
            assert msg is not None, f"no end of {sorted(left)[:3]}"
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                left.discard((msg.topic() or "", msg.partition() or 0))
                continue
            blob = (msg.key() or b"") + (msg.value() or b"")
            for header in msg.headers() or []:
                value = header[1]
                blob += value if isinstance(value, bytes) else str(value or "").encode()
            if needle in blob:
                found.append(f"{msg.topic()}/{msg.partition()}/{msg.offset()}")
    finally:
        reader.close()
    return found
