"""No input can stop a partition (issue 53 item 1), on the real broker through the real
ledger (streams/ledger.py, `refusal` and `_one_by_one`): an input whose output the
producer or the broker refuses for good is refused itself (its dead letter names why),
and another owner's run-now behind it on the same partition is dispatched within seconds.

The domain refuses a command too large as written (`params.written`), so each test
lowers a limit below what it allows, the seam for an output the domain cannot foresee:
- librdkafka's: the ledger producer's message.max.bytes, so produce() raises
  MSG_SIZE_TOO_LARGE for the dispatch request;
- the broker's: the dispatch topic's max.message.bytes (and no compression: the limit
  is on the batch as sent), so the delivery report says MSG_SIZE_TOO_LARGE and the
  commit fails with it;
- the broker's, on the ledger's own state: the jobs topic's max.message.bytes lowered
  below a job's state once it is registered, so any change of it is refused;
- INVALID_RECORD: commands.dlq made compacted, and a keyless record the ledger
  dead-letters (a compacted topic takes no record without a key): the dead letter is
  refused, then the one without the record's bytes, and the input is only passed.
Before the fix, each of these failed the same transaction for ever.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from schemas.codec import DISPATCH, JOB_LOG
from schemas.json import read_dlq_record
from schemas.records import DispatchRequest, JobUpserted, LedgerInput, RunNowRequested
from schemas.spec import JobSpec
from streams.core.commands import UpsertJob, parse_command
from streams.core.ids import manual_run_id
from streams.core.params import parse_values
from streams.kafka import admin_config, consumer_config, producer_config
from streams.ledger import Ledger
from streams.settings import Settings
from streams.topics import delete_topics, ensure_topics
from tests.support.ledger_thread import running
from tests.support.waiting import eventually

LIMIT = 20_000  # bytes: what the lowered limit lets through
PARTITION = 0  # every input on one partition: the refused one is ahead of the other's
DISPATCHED_WITHIN_S = 20.0  # from the inputs' append to the other owner's dispatch


@pytest.fixture
def fresh(settings: Settings) -> Iterator[Settings]:
    """Topics of their own for one test (the ledger's group and state start empty)."""
    own = dataclasses.replace(
        settings, topic_prefix=f"{settings.topic_prefix}{uuid.uuid4().hex[:6]}."
    )
    ensure_topics(own)
    yield own
    delete_topics(own)


def _spec(job_id: str, owner: str, argv: list[str]) -> JobSpec:
    doc = {
        "type": "job.upsert",
        "job_id": job_id,
        "owner": owner,
        "schedule": {"every": "1d"},
        "command": argv,
        "params": {"v": {"type": "string", "default": "x"}},
        "params_in_command": True,
    }
    parsed = parse_command(orjson.dumps(doc))
    assert isinstance(parsed, UpsertJob), parsed
    return parsed.spec


# A job of owner a whose run-now with a 12-character value is a ~24 KB dispatch request
# (its registration, state and events ~6 KB: within the lowered limit), and one of owner b.
BIG = _spec("big-job", "team-a", ["echo", "{v}" * 2000])
OTHER = _spec("other-job", "team-b", ["echo", "{v}"])
BIG_VALUE = parse_values({"v": "y" * 12})


def _set_topic_config(settings: Settings, topic: str, key: str, value: str) -> None:
    admin = AdminClient(admin_config(settings))
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(
        ResourceType.TOPIC, settings.topic(topic), incremental_configs=[entry]
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _append(settings: Settings, records: list[tuple[bytes | None, bytes]]) -> None:
    producer = Producer(producer_config(settings))
    for key, value in records:
        producer.produce(settings.topic("job-log"), key=key, value=value, partition=PARTITION)
    assert producer.flush(30) == 0


def _input(job_id: str, inp: LedgerInput) -> tuple[bytes | None, bytes]:
    return job_id.encode(), JOB_LOG.encode(inp)


class _Reader:
    """A read_committed reader of one topic from its start."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.consumer = Consumer(consumer_config(settings, None))
        name = settings.topic(topic)
        self.consumer.assign(
            [TopicPartition(name, p, -2) for p in range(settings.partitions)]  # beginning
        )
        self.values: list[bytes] = []

    def read(self) -> list[bytes]:
        for msg in self.consumer.consume(500, timeout=0.2):
            value = msg.value()
            if msg.error() is None and value is not None:
                self.values.append(value)
        return self.values

    def close(self) -> None:
        self.consumer.close()


def _scenario(
    settings: Settings,
    ledger: Ledger,
    refused: list[tuple[bytes | None, bytes]],
    check_dead_letter: Callable[[str, bytes], bool] | None,
    before: Callable[[], None] | None = None,
) -> None:
    """Both jobs registered; then the refused input and, behind it on the same partition,
    the other owner's run-now: that run is dispatched within seconds, the refused input
    has its dead letter (`check_dead_letter(reason, original)`; None: no dead letter
    could be written), and nothing of it was dispatched."""
    now = int(time.time() * 1000)
    dispatch, dlq = _Reader(settings, "dispatch"), _Reader(settings, "commands.dlq")
    try:
        with running(ledger):
            _append(
                settings,
                [
                    _input("big-job", JobUpserted(BIG, now)),
                    _input("other-job", JobUpserted(OTHER, now)),
                ],
            )
            eventually(lambda: ledger.assigned, "the ledger assigned", 60)
            first = RunNowRequested("other-job", "warm", now + 1)
            _append(settings, [_input("other-job", first)])
            warm = manual_run_id("other-job", "warm")

            def dispatched(run_id: str) -> list[DispatchRequest]:
                return [r for r in map(DISPATCH.decode, dispatch.read()) if r.run_id == run_id]

            eventually(
                lambda: dispatched(warm), "a first run-now dispatched (the ledger is up)", 60
            )
            if before is not None:
                before()
            behind = RunNowRequested("other-job", "behind", now + 3)
            appended = time.monotonic()
            _append(settings, [*refused, _input("other-job", behind)])
            run_id = manual_run_id("other-job", "behind")
            (request,) = eventually(
                lambda: dispatched(run_id),
                "the other owner's run-now behind the refused input dispatched",
                DISPATCHED_WITHIN_S,
                interval_s=0.1,
            )
            took = time.monotonic() - appended
            assert request.owner == "team-b"
            assert request.command == ("echo", "x")
            if check_dead_letter is not None:
                letters = eventually(
                    lambda: [
                        d
                        for d in map(read_dlq_record, dlq.read())
                        if d.partition == PARTITION and check_dead_letter(d.reason, d.original)
                    ],
                    "the refused input's dead letter",
                    30,
                )
                assert len(letters) == 1, letters
            assert not [r for r in map(DISPATCH.decode, dispatch.read()) if r.job_id == "big-job"]
            stats = ledger.stats()
            print(f"dispatched {took:.1f} s after the refused input; {stats}")
            assert stats.recoveries >= 1, "nothing was refused: the test proves nothing"
    finally:
        dispatch.close()
        dlq.close()


def _big_run_now() -> list[tuple[bytes | None, bytes]]:
    return [
        _input(
            "big-job", RunNowRequested("big-job", "huge", int(time.time() * 1000) + 2, BIG_VALUE)
        )
    ]


def _names_the_run_now(code: str) -> Callable[[str, bytes], bool]:
    def check(reason: str, original: bytes) -> bool:
        if code not in reason:
            return False
        inp = JOB_LOG.decode(original)
        return isinstance(inp, RunNowRequested) and inp.request_id == "huge"

    return check


def test_a_record_librdkafka_refuses_at_produce_refuses_its_input(fresh: Settings) -> None:
    overrides: dict[str, Any] = {"message.max.bytes": LIMIT}
    ledger = Ledger(
        fresh, node_id=f"refuse-local-{uuid.uuid4().hex[:6]}", producer_overrides=overrides
    )
    _scenario(fresh, ledger, _big_run_now(), _names_the_run_now("MSG_SIZE_TOO_LARGE"))


def test_a_record_the_broker_refuses_refuses_its_input(fresh: Settings) -> None:
    _set_topic_config(fresh, "dispatch", "max.message.bytes", str(LIMIT))
    # The broker's limit is on the batch as sent, compressed: lz4 makes the repeated
    # value a few hundred bytes, so it is sent as it is.
    overrides: dict[str, Any] = {"compression.type": "none"}
    ledger = Ledger(
        fresh, node_id=f"refuse-broker-{uuid.uuid4().hex[:6]}", producer_overrides=overrides
    )
    _scenario(fresh, ledger, _big_run_now(), _names_the_run_now("MSG_SIZE_TOO_LARGE"))


def test_an_invalid_record_even_as_its_dead_letter_only_passes_its_input(fresh: Settings) -> None:
    """The dead letter itself refused (INVALID_RECORD: no key on a compacted topic): with
    its bytes, then without; the input is passed, and what is behind it goes on."""
    _set_topic_config(fresh, "commands.dlq", "cleanup.policy", "compact")
    ledger = Ledger(fresh, node_id=f"refuse-invalid-{uuid.uuid4().hex[:6]}")
    keyless: list[tuple[bytes | None, bytes]] = [(None, b"\x00not a job-log record")]
    _scenario(fresh, ledger, keyless, None)
    # The batch, the input alone, its dead letter, the one without its bytes: refused.
    assert ledger.stats().recoveries >= 4


def test_a_job_state_the_broker_refuses_refuses_its_input(fresh: Settings) -> None:
    """The job's own state record grown past what the broker takes (here: the jobs
    topic's limit lowered below big-job's ~6 KB state once both jobs are registered).
    The refused record puts the producer in an abortable state, so the call that fails
    next often says only that (_STATE) or times out: the delivery report's code is what
    tells a refusal (`Ledger._delivered`). Any input changing big-job's state is refused
    and dead-lettered; the other owner's run-now behind it is dispatched."""

    def lower() -> None:
        _set_topic_config(fresh, "jobs", "max.message.bytes", "3000")
        time.sleep(2)  # the brokers apply a topic's new configuration within a second

    overrides: dict[str, Any] = {"compression.type": "none"}
    ledger = Ledger(
        fresh, node_id=f"refuse-state-{uuid.uuid4().hex[:6]}", producer_overrides=overrides
    )
    grow = [
        _input(
            "big-job",
            RunNowRequested(
                "big-job", "grow", int(time.time() * 1000) + 2, parse_values({"v": "z"})
            ),
        )
    ]

    def names_grow(reason: str, original: bytes) -> bool:
        inp = JOB_LOG.decode(original)
        return (
            "MSG_SIZE_TOO_LARGE" in reason
            and isinstance(inp, RunNowRequested)
            and inp.request_id == "grow"
        )

    _scenario(fresh, ledger, grow, names_grow, before=lower)
