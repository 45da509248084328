"""A secret referenced by a job's env reaches the job and nothing else: real node, worker,
projector and API; then every topic, every table, the API's answers, the dashboard and
the processes' logs are searched for a canary value. And a secret is an owner's (issue
53 item 2): another owner's job naming it is refused by the API (422), dead-lettered by
the ledger, and, should it get through (a grant revoked after its registration), refused
by the worker, which holds the values."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
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
    env_for,
    job,
    send_commands,
    stop_all,
)
from tests.support.ports import free_port
from tests.support.waiting import eventually

CANARY = "canary-7f3a9c1e-do-not-leak"
A = {"Authorization": "Bearer tok-s-0123456789ab"}
B = {"Authorization": "Bearer tok-b-0123456789ab"}
ADMIN = {"Authorization": "Bearer tok-admin-0123456789"}
# team-s's secrets; `loaned` (team-s's canary too) is lent to team-b, until revoked.
GRANTS = "canary-token: [team-s]\nnope: [team-s]\nloaned: [team-s, team-b]\n"
REVOKED = "canary-token: [team-s]\nnope: [team-s]\nloaned: [team-s]\n"


@pytest.fixture
def stack(topics: Settings, tmp_path: Path) -> Iterator[httpx.Client]:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "canary-token").write_text(CANARY + "\n")
    (secrets / "loaned").write_text(CANARY + "\n")
    grants = tmp_path / "grants.yaml"  # one file for the node, the worker and the API
    grants.write_text(GRANTS)
    granted = {"CRONLOG_SECRETS_GRANTS": str(grants)}
    port = free_port()
    procs: list[CronlogProcess] = [
        Node(topics, "sec-n1", tmp_path, extra_env=granted),
        WorkerProc(
            topics, "sec-w1", tmp_path, extra_env={"CRONLOG_SECRETS_DIR": str(secrets), **granted}
        ),
        ProjectorProc(topics, tmp_path / "projector.log"),
        CronlogProcess(
            topics,
            "api",
            tmp_path,
            ["api", "--port", str(port), "--loglevel", "info"],
            {
                "CRONLOG_API_TOKENS": "tok-s-0123456789ab=team-s,tok-b-0123456789ab=team-b",
                "CRONLOG_API_ADMIN_TOKENS": "tok-admin-0123456789",
                **granted,
            },
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


def _visible(client: httpx.Client, job_id: str, who: dict[str, str] = A) -> bool:
    return client.get(f"/jobs/{job_id}", headers=who).status_code == 200


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


def test_another_owners_secret_is_refused_at_every_step_and_never_leaks(
    topics: Settings, tmp_path: Path, stack: httpx.Client
) -> None:
    """team-b names team-s's secrets: the API answers 422 naming the secret (POST, PUT,
    PATCH), the topic path dead-letters the spec naming it; a secret lent to team-b and
    revoked after its job was registered (the node read the grants at start, the worker
    reads them per run) fails the attempt on the worker, naming the secret, and the
    canary is nowhere: not in team-b's run, its output, nor any record or log."""
    stolen = {"T": {"secret": "canary-token"}}
    body = {"job_id": "sec-b-api", "command": ["true"], "schedule": {"every": "1h"}}
    for method, url in (("POST", "/jobs"), ("PUT", "/jobs/sec-b-api")):
        refused = stack.request(method, url, headers=B, json={**body, "env": stolen})
        assert refused.status_code == 422, refused.text
        assert "secret 'canary-token'" in refused.text, refused.text
        assert "'team-b'" in refused.text
    # The names each may use (never a value); an admin sees every grant.
    assert stack.get("/secrets", headers=B).json() == {"items": [{"name": "loaned"}]}
    names = [i["name"] for i in stack.get("/secrets", headers=A).json()["items"]]
    assert names == ["canary-token", "loaned", "nope"]
    listed = stack.get("/secrets", headers=ADMIN).json()["items"]
    assert {"name": "loaned", "owners": ["team-b", "team-s"]} in listed
    mine = _cli_secrets(topics, stack, "tok-b-0123456789ab", "--json")
    assert json.loads(mine) == [{"name": "loaned"}]
    table = _cli_secrets(topics, stack, "tok-admin-0123456789")
    assert "team-b, team-s" in table, table

    leak = ["sh", "-c", 'echo "[$T]"']
    send_commands(
        topics,
        [
            job("sec-b-topic", leak, owner="team-b", env=stolen),
            job("sec-b-loaned", leak, owner="team-b", env={"T": {"secret": "loaned"}}),
        ],
    )
    eventually(partial(_visible, stack, "sec-b-loaned", B), "team-b's loaned job")
    patched = stack.patch("/jobs/sec-b-loaned", headers=B, json={"env": stolen})
    assert patched.status_code == 422, patched.text
    assert "secret 'canary-token'" in patched.text
    reason = b"names secret 'canary-token', which owner 'team-b' may not use"
    dead = eventually(
        lambda: [r for r in _records_containing(topics, reason) if ".dlq/" in r],
        "the topic path's spec dead-lettered",
    )
    assert dead, dead
    assert stack.get("/jobs/sec-b-topic", headers=B).status_code == 404  # never registered

    # Revoked after registration: the worker is the guarantee.
    revoked = tmp_path / "grants.yaml.new"
    revoked.write_text(REVOKED)
    revoked.replace(tmp_path / "grants.yaml")
    assert stack.post("/jobs/sec-b-loaned/run-now", headers=B).status_code in (200, 202)

    def final() -> dict[str, object] | None:
        items = stack.get("/jobs/sec-b-loaned/runs", headers=B).json()["items"]
        done = [r for r in items if r["state"] in ("succeeded", "failed")]
        return done[0] if done else None

    run = eventually(final, "team-b's run to end", 90)
    assert run["state"] == "failed", run
    assert "secret 'loaned'" in str(run["error"]), run
    assert "'team-b' may not use" in str(run["error"]), run
    shown = stack.get(f"/runs/{run['run_id']}", headers=B).text
    output = stack.get(f"/runs/{run['run_id']}/logs", headers=B).text
    assert CANARY not in shown
    assert CANARY not in output
    assert _records_containing(topics, CANARY.encode()) == []
    for path in tmp_path.glob("*.log"):
        assert CANARY not in path.read_text(errors="replace"), path


def _cli_secrets(topics: Settings, api: httpx.Client, token: str, *args: str) -> str:
    """`cronlog secrets list` over the REST API with `token`: its output."""
    env = {**env_for(topics), "CRONLOG_API_URL": str(api.base_url), "CRONLOG_TOKEN": token}
    done = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "secrets", "list", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


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
