"""Fuzzing the topics the system reads (issue 34, part 6): generated bad records on
commands, worker-reports, heartbeats, worker-handbacks and run-logs, valid records among
them, against a real scheduler node and the projector.

What must hold: no process dies; every bad record on commands and worker-reports is in
commands.dlq (found by its topic, partition and offset) with a reason, every bad record
on heartbeats and run-logs in the projector's dead letters; every valid record around
them arrives (the jobs registered, the worker's beats and the log chunks projected).

`CRONLOG_FUZZ_N` bad records per topic: 200 in `make test`, 10,000 in `make fuzz`.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import psycopg
from confluent_kafka import Producer

from projections.migrate import migrate
from schemas.codec import HEARTBEAT, JOB_LOG, RUN_LOG
from schemas.records import (
    Heartbeat,
    JobUpserted,
    RunLogChunk,
    RunReleased,
    WorkerCapacity,
)
from schemas.spec import JobSpec
from streams.kafka import producer_config
from streams.settings import Settings
from tests.support.kafka import consumer
from tests.support.nodes import Node, ProjectorProc
from tests.support.waiting import eventually

N = int(os.environ.get("CRONLOG_FUZZ_N", "200"))
VALID_EVERY = 10
SEED = 34
T0 = 1_796_000_000_000

Where = tuple[str, int, int]  # topic, partition, offset


def _binary_junk(rng: random.Random, valid: bytes, i: int) -> bytes:
    """Bytes no codec can decode: random, a valid record cut short, another schema's
    fingerprint, nothing, or (rarely) half a megabyte."""
    kind = i % 5 if i % 500 else 5
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 300))
    if kind == 1:
        return valid[: rng.randrange(0, len(valid) - 1)]
    if kind == 2:
        flipped = bytearray(valid)
        flipped[2 + rng.randrange(8)] ^= 1 + rng.randrange(255)
        return bytes(flipped)
    if kind == 3:
        return b""
    if kind == 4:
        return b"\xc3\x01" + rng.randbytes(rng.randrange(8, 40))
    return rng.randbytes(500_000)


def _command_junk(rng: random.Random, i: int) -> bytes:
    """Commands ingress must refuse: not JSON, not UTF-8, cut short, an unknown type,
    an invalid cron or time zone, hostile values, deep nesting, (rarely) 500 KB."""
    job = {"type": "job.upsert", "job_id": f"fz-bad-{i}", "owner": "fz", "command": ["true"]}
    kind = i % 9 if i % 500 else 9
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))
    if kind == 1:
        return b"\xff\xfe" + orjson.dumps(job)
    if kind == 2:
        text = orjson.dumps(job)
        return text[: rng.randrange(1, len(text) - 1)]
    if kind == 3:
        return orjson.dumps({**job, "type": f"job.{rng.randrange(10**6)}"})
    if kind == 4:
        return orjson.dumps({**job, "schedule": {"cron": f"{rng.randrange(60, 999)} * * * *"}})
    if kind == 5:
        return orjson.dumps({**job, "schedule": {"cron": "* * * * *", "timezone": "Mars/Base"}})
    if kind == 6:
        hostile: dict[str, object] = rng.choice(
            [
                {"job_id": "x" * 100_000},
                {"timeout_s": -1},
                {"command": []},
                {"retries": 10**12},
                {"resources": {"cpu": "all"}},
                {"env": {"A": 5}},
                {"schedule": {"every": "0s"}},
            ]
        )
        return orjson.dumps({**job, **hostile})
    if kind == 7:
        return b"[" * 5000 + b"]" * 5000
    if kind == 8:
        return b""
    return b'{"type": "job.upsert", "pad": "' + b"a" * 500_000 + b'"}'


def _valid_command(i: int) -> bytes:
    return orjson.dumps(
        {
            "type": "job.upsert",
            "job_id": f"fz-ok-{i}",
            "owner": "fz",
            "command": ["true"],
            "schedule": {"at": "2099-01-01T00:00:00Z"},
        }
    )


class Sender:
    """Produces and remembers where each record landed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = Producer(
            producer_config(settings, **{"linger.ms": 20, "message.max.bytes": 2_000_000})
        )
        self.landed: dict[str, list[Where]] = {"bad": [], "ok": []}

    def send(self, topic: str, key: bytes, value: bytes, kind: str) -> None:
        def done(err: object, msg: object) -> None:
            assert err is None, err
            self.landed[kind].append((msg.topic(), msg.partition(), msg.offset()))  # type: ignore[attr-defined]

        while True:
            try:
                self.producer.produce(
                    self.settings.topic(topic), key=key, value=value, on_delivery=done
                )
                break
            except BufferError:
                self.producer.poll(0.1)
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(60) == 0


def _feed(
    sender: Sender, topic: str, bad: Callable[[int], bytes], ok: Callable[[int], bytes]
) -> int:
    valid = 0
    for i in range(N):
        if i % VALID_EVERY == 0:
            sender.send(topic, f"fz-ok-{i}".encode(), ok(i), "ok")
            valid += 1
        sender.send(topic, f"fz-{i}".encode(), bad(i), "bad")
    return valid


def test_generated_bad_records_are_dead_lettered_and_valid_ones_arrive(
    topics: Settings, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    capacity = WorkerCapacity(1.0, 512, 0)
    beat = HEARTBEAT.encode(Heartbeat("fz-w", T0, capacity, capacity, (), ()))
    chunk = RUN_LOG.encode(RunLogChunk("fz-ok-0@manual:r", 1, "stdout", 0, "x", False, "fz-w", T0))
    report = JOB_LOG.encode(RunReleased("fz-none", "fz-none@manual:r", 1, "fz-w", "fuzz", T0))
    forbidden = JOB_LOG.encode(
        JobUpserted(JobSpec(job_id="fz-w-job", owner="fz", schedule=None, command=("true",)), T0)
    )
    migrate(topics.database_url)
    node = Node(topics, "fz-n1", tmp_path).start()
    projector = ProjectorProc(topics, tmp_path / "projector.log").start()
    sender = Sender(topics)
    try:
        started = time.monotonic()
        jobs = _feed(sender, "commands", lambda i: _command_junk(rng, i), _valid_command)
        _feed(
            sender,
            "worker-reports",
            lambda i: forbidden if i % 7 == 6 else _binary_junk(rng, report, i),
            lambda i: report,
        )
        beats = _feed(
            sender,
            "heartbeats",
            lambda i: _binary_junk(rng, beat, i),
            lambda i: HEARTBEAT.encode(Heartbeat("fz-w", T0 + i, capacity, capacity, (), ())),
        )
        chunks = _feed(
            sender,
            "run-logs",
            lambda i: _binary_junk(rng, chunk, i),
            lambda i: RUN_LOG.encode(
                RunLogChunk(f"fz-ok-{i}@manual:r", 1, "stdout", 0, "ok", False, "fz-w", T0)
            ),
        )
        _feed(sender, "worker-handbacks", lambda i: _binary_junk(rng, report, i), lambda i: report)
        sender.flush()
        sent_s = time.monotonic() - started
        bad = sender.landed["bad"]
        by_topic = {
            t: {w for w in bad if w[0] == topics.topic(t)}
            for t in ("commands", "worker-reports", "heartbeats", "run-logs")
        }
        dlq = consumer(topics, "commands.dlq")
        dead: set[Where] = set()
        reasons: list[str] = []

        def relayed() -> bool:
            for message in dlq.consume(1000, timeout=0.5):
                letter = orjson.loads(message.value() or b"{}")
                dead.add((letter["topic"], letter["partition"], letter["offset"]))
                reasons.append(letter["reason"])
            return by_topic["commands"] <= dead and by_topic["worker-reports"] <= dead

        eventually(relayed, "every bad command and worker report in commands.dlq", timeout_s=300)
        dlq.close()

        def projected() -> bool:
            with psycopg.connect(topics.database_url) as conn:
                letters = conn.execute(
                    'SELECT topic, partition, "offset" FROM projector_dead_letters'
                ).fetchall()
                registered = conn.execute(
                    "SELECT count(*) FROM jobs WHERE job_id LIKE 'fz-ok-%'"
                ).fetchone()
                logged = conn.execute(
                    "SELECT count(*) FROM run_logs WHERE run_id LIKE 'fz-ok-%@manual:r'"
                ).fetchone()
                worker = conn.execute(
                    "SELECT count(*) FROM workers WHERE worker_id = 'fz-w'"
                ).fetchone()
            projected_dead = {(t, p, o) for t, p, o in letters}
            return (
                by_topic["heartbeats"] <= projected_dead
                and by_topic["run-logs"] <= projected_dead
                and registered is not None
                and registered[0] == jobs
                and logged is not None
                and logged[0] == chunks
                and worker is not None
                and worker[0] == 1
            )

        eventually(projected, "the projector's dead letters and the valid records", timeout_s=300)
        assert node.alive, "the scheduler node died"
        assert projector.alive, "the projector died"
        assert all(reasons), "a dead letter without its reason"
        print(
            f"fuzz: {len(bad)} bad records ({N} per topic on 5 topics) and "
            f"{len(sender.landed['ok'])} valid ones sent in {sent_s:.1f} s; "
            f"{len(by_topic['commands']) + len(by_topic['worker-reports'])} in commands.dlq, "
            f"{len(by_topic['heartbeats']) + len(by_topic['run-logs'])} in the projector's "
            f"dead letters; {jobs} valid jobs registered, {beats} beats, {chunks} log chunks "
            "projected; 0 processes died"
        )
    finally:
        node.stop()
        projector.stop()
