"""The ledger's foundation: a confluent-kafka consume-process-produce transaction with
the consumed offsets sent into it (KIP-447, consumer_group_metadata()). Committed outputs
and offsets become visible together; aborted ones never do; a zombie is fenced."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from schemas.codec import JOB_STATE, RUN_STATE
from schemas.records import JobState, RunState
from streams.ledger import Ledger
from streams.ledger_takeover import PartitionState
from streams.settings import Settings
from tests.support.kafka import consumer, drain
from tests.support.specs import upsert


def _transactional(settings: Settings, txn_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": settings.kafka,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 30000,
        }
    )
    producer.init_transactions(30)
    return producer


def _seed_input(settings: Settings, n: int) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka})
    for i in range(n):
        # One key: one partition, so "the first five" is well defined.
        producer.produce(settings.topic("job-log"), key=b"job-a", value=f"in-{i}".encode())
    assert producer.flush(30) == 0


def _process(c: Consumer, producer: Producer, settings: Settings, n: int) -> None:
    """Consume n inputs, produce one output each, and send the offsets into the txn."""
    producer.begin_transaction()
    for msg in drain(c, n):
        producer.produce(
            settings.topic("run-events"), key=msg.key(), value=b"out-" + (msg.value() or b"")[3:]
        )
    producer.send_offsets_to_transaction(
        c.position(c.assignment()), c.consumer_group_metadata(), 30
    )


def test_committed_outputs_are_seen_and_aborted_ones_are_not(topics: Settings) -> None:
    _seed_input(topics, 10)
    group = topics.group(f"ledger-{uuid.uuid4().hex[:6]}")
    c = consumer(topics, "job-log", group=group)
    producer = _transactional(topics, f"{group}-txn")
    try:
        _process(c, producer, topics, 5)
        producer.commit_transaction(30)
        _process(c, producer, topics, 5)
        # Sent first: abort_transaction purges what is still queued in the client, and
        # the point is that the broker hides records it did receive.
        assert producer.flush(30) == 0
        producer.abort_transaction(30)
        committed = c.committed(c.assignment(), timeout=10)
    finally:
        c.close()

    # The group's committed offset moved with the committed transaction only.
    by_partition = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
    assert list(by_partition.values()) == [5]

    reader = consumer(topics, "run-events", isolation="read_committed")
    try:
        visible = drain(reader, 5, to_end=True)
    finally:
        reader.close()
    assert [m.value() for m in visible] == [f"out-{i}".encode() for i in range(5)]

    # The aborted records were written (read_uncommitted shows them): the broker hid them.
    raw = consumer(topics, "run-events", isolation="read_uncommitted")
    try:
        everything = drain(raw, 10, to_end=True)
    finally:
        raw.close()
    assert sorted(m.value() or b"" for m in everything) == sorted(
        f"out-{i}".encode() for i in range(10)
    )

    # A restarted processor resumes at the committed offset: it redoes the aborted five.
    again = consumer(topics, "job-log", group=group)
    try:
        redo = drain(again, 5, to_end=True)
    finally:
        again.close()
    assert [m.value() for m in redo] == [f"in-{i}".encode() for i in range(5, 10)]


def test_a_zombie_producer_is_fenced(topics: Settings) -> None:
    txn_id = topics.group(f"zombie-{uuid.uuid4().hex[:6]}")
    zombie = _transactional(topics, txn_id)
    zombie.begin_transaction()
    zombie.produce(topics.topic("runs"), key=b"r", value=b"from-zombie", partition=2)
    zombie.flush(10)

    successor = _transactional(topics, txn_id)  # bumps the epoch, aborts the zombie's txn
    successor.begin_transaction()
    successor.produce(topics.topic("runs"), key=b"r", value=b"from-successor", partition=2)
    successor.commit_transaction(30)

    with pytest.raises(KafkaException) as caught:
        zombie.commit_transaction(30)
    error = caught.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )

    reader = consumer(topics, "runs")
    try:
        seen = [m.value() for m in drain(reader, 1, to_end=True)]
    finally:
        reader.close()
    assert seen == [b"from-successor"]


def test_ledger_restore_waits_for_a_transaction_still_open(topics: Settings) -> None:
    """Regression: a restore once stopped at the last stable offset, so a previous
    owner's transaction whose markers were still being written was left out while its
    offsets committed: the new owner re-created that batch's runs. The restore must
    include every transaction that began before it, once resolved."""
    spec = upsert("job-a")
    state = JobState(spec.spec, False, False, 0, 0, 123_000, None, (), (), (), 7)
    producer = _transactional(topics, f"restore-{uuid.uuid4().hex[:6]}")
    producer.begin_transaction()
    producer.produce(topics.topic("jobs"), key=b"job-a", value=JOB_STATE.encode(state), partition=0)
    assert producer.flush(30) == 0
    ledger = Ledger(topics, node_id="restore-test")
    restored: list[PartitionState] = []
    thread = threading.Thread(target=lambda: restored.append(ledger.takeover.restore(0)))
    thread.start()
    thread.join(3)
    assert thread.is_alive(), "the restore returned while a transaction was still open"
    producer.commit_transaction(30)
    thread.join(60)
    assert not thread.is_alive()
    assert restored[0].jobs["job-a"].fired_ms == 123_000


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_restore_holds_the_newest_value_of_each_key(
    topics: Settings, store: str, tmp_path: Path
) -> None:
    """The compacted topics still hold superseded values and tombstones (the active
    segment is never compacted): a restore must end with each key's newest value,
    without a key whose newest record is a tombstone, whether the states it holds
    encoded are on the heap or in the RocksDB store on disk."""
    spec = upsert("job-v")
    mine = 1  # the zombie test leaves raw (non-Avro) records in 2, the open-transaction test uses 0
    producer = Producer({"bootstrap.servers": topics.kafka})
    jobs, runs = topics.topic("jobs"), topics.topic("runs")
    for fired in (1_000, 2_000, 3_000):  # the newest last
        state = JobState(spec.spec, False, False, 0, 0, fired, None, (), (), (), fired)
        producer.produce(jobs, key=b"job-v", value=JOB_STATE.encode(state), partition=mine)
    gone = JobState(spec.spec, False, False, 0, 0, 5, None, (), (), (), 5)
    producer.produce(jobs, key=b"job-gone", value=JOB_STATE.encode(gone), partition=mine)
    producer.produce(jobs, key=b"job-gone", value=None, partition=mine)  # then deleted
    back = JobState(spec.spec, False, False, 0, 0, 9, None, (), (), (), 9)
    producer.produce(jobs, key=b"job-back", value=None, partition=mine)  # deleted, re-created
    producer.produce(jobs, key=b"job-back", value=JOB_STATE.encode(back), partition=mine)
    for attempt in (1, 2):
        run = RunState(
            "job-v@x", "job-v", 1, "schedule", "due", attempt, "", 1, 1, None, None, None,
            None, None, "", attempt,
        )  # fmt: skip
        producer.produce(runs, key=b"job-v@x", value=RUN_STATE.encode(run), partition=mine)
    assert producer.flush(30) == 0
    ledger = Ledger(
        topics, node_id="restore-newest", store_dir=tmp_path if store == "disk" else None
    )
    try:
        _assert_newest(ledger.takeover.restore(mine))
        older = ledger.takeover.restore(mine)
        newer = ledger.takeover.restore(mine)  # a recovery's restore: a new table
        _assert_newest(newer)
        # On disk the older table's range is deleted with it: nothing stale is read.
        assert len(older.jobs) == (2 if ledger.store is None else 0)
    finally:
        ledger.consumer.close()
        if ledger.store is not None:
            ledger.store.close()


def _assert_newest(restored: PartitionState) -> None:
    assert (len(restored.jobs), len(restored.runs)) == (2, 1)
    assert "job-gone" not in restored.jobs
    assert restored.jobs.decoded == restored.runs.decoded == 0  # decoded when first needed
    assert restored.jobs["job-v"].fired_ms == 3_000
    assert restored.jobs["job-back"].fired_ms == 9
    assert restored.runs["job-v@x"].attempt == 2
    assert restored.jobs.decoded == 2
