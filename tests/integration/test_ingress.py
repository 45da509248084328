"""Ingress on the real broker: a batch mixing valid commands with every kind of bad input.
Every bad one lands in commands.dlq with its original bytes and a reason; every good one
takes effect (the ledger emits its job event); the agent keeps going."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from schemas.codec import JOB_LOG
from schemas.records import ClaimRequested, FireProposed, JobUpserted
from schemas.spec import EverySchedule, JobSpec
from streams.kafka import producer_config
from streams.settings import Settings
from tests.support.kafka import consumer, drain
from tests.support.nodes import EventReader, Node, committed_past, end_offsets, send_commands
from tests.support.waiting import eventually, until_passes


def upsert(job_id: str, **extra: object) -> dict[str, object]:
    return {
        "type": "job.upsert",
        "job_id": job_id,
        "owner": "team-a",
        "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
        "command": ["true"],
        **extra,
    }


BAD: list[tuple[bytes, str]] = [
    (b"{this is not json", "not valid JSON"),
    (orjson.dumps({"type": "job.explode", "job_id": "x"}), "unknown command type"),
    (orjson.dumps(upsert("bad-cron", schedule={"cron": "61 * * * *"})), "schedule"),
    (
        orjson.dumps(upsert("bad-tz", schedule={"cron": "0 3 * * *", "timezone": "Mars/Base"})),
        "Mars/Base",
    ),
    (orjson.dumps(upsert("neg", resources={"cpu": -1})), "resources.cpu"),
    (orjson.dumps(upsert("big", env={"PAD": "x" * 70_000})), "bytes"),
    (orjson.dumps(upsert("has space")), "job_id"),
    (orjson.dumps(upsert("no-argv", command=[])), "command"),
    (
        orjson.dumps(upsert("bad-hook", notify={"url": "ftp://h/x", "on": ["failed"]})),
        "notify.url must be an http:// or https:// URL",
    ),
    (
        orjson.dumps(upsert("late-no-sla", notify={"url": "https://h/x", "on": ["late"]})),
        "no sla_s",
    ),
    (orjson.dumps(upsert("neg-sla", sla_s=-3)), "sla_s must be > 0"),
]


@pytest.fixture(scope="module")
def node(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    started = Node(topics, "ingress-n1", tmp_path_factory.mktemp("nodes")).start()
    yield started
    started.stop()


def test_bad_commands_go_to_the_dlq_and_good_ones_take_effect(topics: Settings, node: Node) -> None:
    good = [upsert(f"good-{i}") for i in range(5)]
    batch: list[bytes | dict[str, object]] = []
    for i, (raw, _) in enumerate(BAD):
        batch.append(good[i % len(good)] if i < len(good) else upsert(f"good-extra-{i}"))
        batch.append(raw)
    batch.append({"type": "job.pause", "job_id": "good-0"})
    send_commands(topics, batch)

    # Extras would come from ingress: once it committed past the batch, every dead letter
    # it will write is in the DLQ, and reading that to its end finds them.
    ends = end_offsets(topics, "commands")
    until_passes(partial(committed_past, topics, "ingress", "commands", ends), 120)
    dlq = consumer(topics, "commands.dlq")
    try:
        letters = drain(dlq, len(BAD), 120, to_end=True)
        dead = [orjson.loads(m.value() or b"") for m in letters]
    finally:
        dlq.close()
    assert len(dead) == len(BAD)
    by_original = {base64.b64decode(d["original_base64"]): d for d in dead}
    for raw, reason in BAD:
        assert raw in by_original, raw[:60]
        assert reason in by_original[raw]["reason"], by_original[raw]["reason"]
        assert by_original[raw]["topic"] == topics.topic("commands")

    events = EventReader(topics, "ingress-check")
    try:
        expected = {c["job_id"] for c in batch if isinstance(c, dict) and c["type"] == "job.upsert"}
        events.wait_until(
            lambda: (
                {e.job_id for e in events.job_events() if e.kind == "upserted"} >= expected
                and any(e.kind == "paused" for e in events.job_events())
            ),
            90,
            "job events of every valid command",
        )
        kinds = [(e.job_id, e.kind) for e in events.job_events()]
    finally:
        events.close()
    assert ("good-0", "paused") in kinds
    assert node.alive
    # Exactly the valid commands took effect (ingress is at-least-once: a command it
    # delivered twice shows as a repeated pair, never as another job).
    assert set(kinds) == {(job_id, "upserted") for job_id in expected} | {("good-0", "paused")}
    assert Path(node.log).exists()


def test_another_owner_cannot_take_a_job_id_the_ledger_refuses_it(
    topics: Settings, node: Node
) -> None:
    """Valid for ingress (it knows no job's owner), refused by the ledger, which does:
    the job keeps its owner and command, deleted or not, and the refusal is in the DLQ."""
    events = EventReader(topics, "owner-check")
    try:
        send_commands(topics, [upsert("owned", owner="team-a")])
        events.wait_until(
            lambda: any(e.job_id == "owned" for e in events.job_events()), 60, "registered"
        )
        thief = upsert("owned", owner="team-b", command=["cat", "/etc/shadow"])
        send_commands(topics, [thief, {"type": "job.delete", "job_id": "owned"}, thief])
        events.wait_until(
            lambda: any(e.kind == "deleted" for e in events.job_events() if e.job_id == "owned"),
            60,
            "the delete",
        )
        dlq = consumer(topics, "commands.dlq")
        refused: list[dict[str, object]] = []
        try:

            def both_refused() -> bool:
                for m in drain(dlq, 1, timeout_s=1):
                    letter = orjson.loads(m.value() or b"")
                    if "belongs to owner" in letter["reason"]:
                        refused.append(letter)
                return len(refused) >= 2

            eventually(both_refused, "the two refusals in the DLQ", 60)
            both_refused()  # one more read: a third refusal would be counted
        finally:
            dlq.close()
        events.settle()  # the ledger decided every command sent, its events read
        upserts = [e for e in events.job_events() if e.job_id == "owned" and e.kind == "upserted"]
    finally:
        events.close()
    assert len(refused) == 2  # before and after the delete
    for letter in refused:
        assert "owner 'team-b' cannot" in str(letter["reason"])
        assert letter["topic"] == topics.topic("job-log")
    assert {e.spec.owner for e in upserts if e.spec is not None} == {"team-a"}


def test_a_registration_forged_with_a_workers_access_registers_nothing(
    topics: Settings, node: Node
) -> None:
    """Workers write worker-reports, not job-log: a job.upsert (or a firing) a worker's
    credentials put there is refused by the gate, with the record and the reason in the
    DLQ, and never reaches the ledger; a real claim still does (the ledger answers it)."""
    forged = JOB_LOG.encode(
        JobUpserted(JobSpec("forged", "team-a", EverySchedule(1000), ("sh", "-c", "evil")), 1)
    )
    fire = JOB_LOG.encode(FireProposed("good-1", 1000, 1, "w-evil"))
    claim = JOB_LOG.encode(ClaimRequested("good-1", "good-1@1000", 1, "w-evil", 1))
    producer = Producer(producer_config(topics))
    for key, value in ((b"forged", forged), (b"good-1", fire), (b"good-1", claim)):
        producer.produce(topics.topic("worker-reports"), key=key, value=value)
    assert producer.flush(30) == 0

    dlq = consumer(topics, "commands.dlq")
    refused: dict[bytes, str] = {}
    try:

        def both_refused() -> bool:
            for m in drain(dlq, 1, timeout_s=1):
                letter = orjson.loads(m.value() or b"")
                if letter["topic"] == topics.topic("worker-reports"):
                    refused[base64.b64decode(letter["original_base64"])] = letter["reason"]
            return len(refused) >= 2

        eventually(both_refused, "the forged records in the DLQ", 60)
    finally:
        dlq.close()
    assert refused == {
        forged: "a worker may not write JobUpserted (only claims and outcomes)",
        fire: "a worker may not write FireProposed (only claims and outcomes)",
    }
    # The claim passed the gate, as it was, onto job-log; nothing forged did.
    log = consumer(topics, "job-log")
    relayed: list[bytes | None] = []
    try:

        def claim_relayed() -> bool:
            relayed.extend(m.value() for m in drain(log, 1, timeout_s=1) if m.key() == b"good-1")
            return claim in relayed

        eventually(claim_relayed, "the claim on job-log", 60)
        relayed.extend(m.value() for m in drain(log, 10_000, timeout_s=1) if m.key() == b"good-1")
    finally:
        log.close()
    assert fire not in relayed
    events = EventReader(topics, "forged-check")
    try:
        events.settle()  # the gate and the ledger past every record written, events read
        assert not [e for e in events.job_events() if e.job_id == "forged"]
    finally:
        events.close()


def test_a_command_as_large_as_its_topic_allows_is_kept_whole_in_the_dlq(
    topics: Settings, node: Node
) -> None:
    """A rejected record's envelope (its bytes in base64) is a third larger than the
    record: for a record near the commands topic's 1 MB limit it must still fit in the
    DLQ, or the record would be read again for ever and hold back every command behind
    it on its partition. The next command on the same partition takes effect."""
    huge = orjson.dumps(upsert("huge", env={"PAD": "x" * 900_000}))
    producer = Producer(producer_config(topics))
    producer.produce(topics.topic("commands"), key=b"huge", value=huge)
    assert producer.flush(30) == 0
    send_commands(topics, [upsert("huge")])  # the same key: the same partition, after it

    dlq = consumer(topics, "commands.dlq")
    letters: list[dict[str, object]] = []
    try:

        def kept() -> bool:
            for m in drain(dlq, 1, timeout_s=1):
                letter = orjson.loads(m.value() or b"")
                if base64.b64decode(str(letter["original_base64"])) == huge:
                    letters.append(letter)
            return bool(letters)

        eventually(kept, "the large command in the DLQ", 90)
    finally:
        dlq.close()
    assert "bytes" in str(letters[0]["reason"])
    events = EventReader(topics, "huge-check")
    try:
        events.wait_until(
            lambda: any(e.job_id == "huge" and e.kind == "upserted" for e in events.job_events()),
            90,
            "the command behind it",
        )
    finally:
        events.close()
    assert node.alive
