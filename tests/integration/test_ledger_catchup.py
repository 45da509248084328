"""The ledger process at the edges of liveness, on the real broker (streams/ledger.py):

- a backlog of late proposals, each deciding ~1,000 firings (~3,000 records), is worked
  through in transactions bounded by the budget, none near the transaction timeout, and
  the audit of what it wrote is clean;
- a full local producer queue (BufferError) is drained and the produce retried;
- a new owner fetches the committed offsets before it restores state, so a zombie's
  batch whose offsets were still pending is either wholly in its state or not at all;
- a restore fails only when it stops making progress, not after a fixed total time.
"""

from __future__ import annotations

import dataclasses
import io
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from connectors.audit.replay import run_audit
from schemas.codec import JOB_LOG, JOB_STATE, RUN_STATE
from schemas.records import FireProposed, JobState, JobUpserted, LedgerInput, RunState
from streams.kafka import (
    TRANSACTION_TIMEOUT_MS,
    Clients,
    consumer_config,
    producer_config,
    transactional_producer_config,
)
from streams.ledger import Ledger, LedgerStats
from streams.ledger_takeover import TakenOver, range_share
from streams.settings import Settings
from streams.topics import delete_topics, ensure_topics
from tests.support.ledger_thread import running
from tests.support.nodes import EventReader
from tests.support.specs import upsert
from tests.support.waiting import eventually

OUTAGE_S = 990  # each late proposal decides this many firings of an `every: 1s` job


@pytest.fixture
def fresh(settings: Settings) -> Iterator[Settings]:
    """Topics of their own for one test (the ledger's group and state start empty)."""
    own = dataclasses.replace(
        settings, topic_prefix=f"{settings.topic_prefix}{uuid.uuid4().hex[:6]}."
    )
    ensure_topics(own)
    yield own
    delete_topics(own)


def _produce(settings: Settings, inputs: list[tuple[str, LedgerInput]]) -> None:
    producer = Producer(producer_config(settings))
    for job_id, inp in inputs:
        producer.produce(settings.topic("job-log"), key=job_id.encode(), value=JOB_LOG.encode(inp))
    assert producer.flush(30) == 0


def _backlog(settings: Settings, jobs: int, prefix: str) -> tuple[int, list[str]]:
    """`jobs` jobs `every: 1s`, misfire `run_all`, registered OUTAGE_S ago (the command's
    own time: ingress lagged, or every node was down since), then one late proposal each
    for its first firing: each decides every firing since, ~OUTAGE_S of them."""
    registered = (int(time.time()) - OUTAGE_S) * 1000
    ids = [f"{prefix}-{i:03d}" for i in range(jobs)]
    inputs: list[tuple[str, LedgerInput]] = [
        (job_id, JobUpserted(upsert(job_id, misfire="run_all").spec, registered)) for job_id in ids
    ]
    now = int(time.time() * 1000)
    inputs += [(job_id, FireProposed(job_id, registered + 1000, now, "test")) for job_id in ids]
    _produce(settings, inputs)
    return registered, ids


def _committed_to_the_end(settings: Settings) -> bool:
    topic = settings.topic("job-log")
    probe = Consumer(consumer_config(settings, settings.group("ledger")))
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
        committed = {tp.partition: tp.offset for tp in probe.committed(partitions, timeout=10)}
        ends = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[1]
            for p in range(settings.partitions)
        }
    finally:
        probe.close()
    return all(ends[p] == 0 or committed[p] >= ends[p] for p in ends)


def _check_catch_up(settings: Settings, registered: int, ids: list[str], stats: LedgerStats) -> int:
    """Every job's firings since its registration each have exactly one run, nothing
    failed, and the audit of run-events is clean. Returns the firings decided."""
    events = EventReader(settings, f"catchup-check-{uuid.uuid4().hex[:6]}")
    per_job: dict[str, list[int]] = defaultdict(list)
    try:

        def complete() -> bool:
            for event, _ in events.run_events()[sum(len(v) for v in per_job.values()) :]:
                per_job[event.job_id].append(event.scheduled_ms)
            return all(len(per_job[j]) >= OUTAGE_S for j in ids)

        events.wait_until(complete, 60, "every catch-up in run-events")
        # A firing decided twice would be there by the end: the ledger committed job-log
        # to its end and stopped before this reader began, so run-events holds all it wrote.
        events.read_to_end()
        complete()
    finally:
        events.close()
    for job_id in ids:
        times = per_job[job_id]
        assert len(times) == len(set(times)), f"{job_id}: a firing decided twice"
        assert times == list(range(registered + 1000, registered + 1000 * (len(times) + 1), 1000))
        assert OUTAGE_S <= len(times) <= OUTAGE_S + 30
    assert stats.recoveries == 0, "a transaction failed"
    assert stats.longest_txn_s < TRANSACTION_TIMEOUT_MS / 1000 / 2
    out, err = io.StringIO(), io.StringIO()
    assert run_audit(settings, None, None, None, out, err=err) == 0, out.getvalue() + err.getvalue()
    return sum(len(v) for v in per_job.values())


def _work_through(settings: Settings, ledger: Ledger, timeout_s: float) -> float:
    started = time.monotonic()
    with running(ledger):
        eventually(
            lambda: _committed_to_the_end(settings),
            "the backlog decided (the ledger's offsets at job-log's end)",
            timeout_s,
            interval_s=0.5,
        )
    return time.monotonic() - started


def test_a_catch_up_backlog_is_decided_in_bounded_transactions(fresh: Settings) -> None:
    """40 late proposals of ~990 firings each (~120,000 records, all in one consumed
    batch): one transaction would run far past the 7 s timeout and be redone for ever.
    With the budget, several transactions of at most ~20,000 records commit in turn."""
    registered, ids = _backlog(fresh, 40, "bulk")
    ledger = Ledger(fresh, node_id=f"catchup-{uuid.uuid4().hex[:6]}")
    took = _work_through(fresh, ledger, 240)
    stats = ledger.stats()
    firings = _check_catch_up(fresh, registered, ids, stats)
    print(
        f"catch-up: {firings} firings, {stats.produced} records in {stats.transactions} "
        f"transactions ({stats.cut} cut by the budget), longest {stats.longest_txn_s:.2f} s, "
        f"{took:.1f} s in all"
    )
    assert stats.cut >= 1
    assert stats.produced > 100_000
    assert stats.produced / stats.transactions <= ledger.txn_max_records + 4_000


def test_a_full_producer_queue_is_drained_not_fatal(fresh: Settings) -> None:
    """A local queue smaller than what one input produces: produce() meets BufferError
    again and again, and the ledger polls, retries and carries on."""
    registered, ids = _backlog(fresh, 8, "small")
    overrides: dict[str, Any] = {"queue.buffering.max.messages": 500}
    ledger = Ledger(
        fresh,
        node_id=f"queue-{uuid.uuid4().hex[:6]}",
        txn_max_records=5_000,
        producer_overrides=overrides,
    )
    _work_through(fresh, ledger, 180)
    stats = ledger.stats()
    _check_catch_up(fresh, registered, ids, stats)
    assert stats.queue_full > 0, "the queue never filled: the test proves nothing"
    assert stats.cut >= 1


def _job_state(job_id: str, fired_ms: int) -> JobState:
    spec = upsert(job_id).spec
    return JobState(
        spec=spec,
        paused=False,
        deleted=False,
        created_ms=0,
        updated_ms=0,
        fired_ms=fired_ms,
        next_due_ms=None,
        live_runs=(),
        final_runs=(),
        recent_requests=(),
        version=7,
    )


def test_offsets_are_fetched_before_state_is_restored(fresh: Settings) -> None:
    """A zombie's transaction sent its offsets (pending) but has not written its state
    yet. The new owner must not read state first: it would miss that state, then find
    the offsets committed (the zombie commits meanwhile) and skip the batch - its job's
    watermark left behind, so a repeated proposal is decided twice. It waits for the
    pending offsets, then reads the state the committed batch wrote."""
    group, job_log = fresh.group("ledger"), fresh.topic("job-log")
    plain = Producer(producer_config(fresh))
    plain.produce(job_log, key=b"job-a", value=b"the zombie's input", partition=0)
    assert plain.flush(30) == 0
    zombie = Producer(transactional_producer_config(fresh, f"{group}-zombie"))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    member = Consumer(consumer_config(fresh, group))
    try:
        zombie.send_offsets_to_transaction(
            [TopicPartition(job_log, 0, 1)], member.consumer_group_metadata(), 30
        )
    finally:
        member.close()

    ledger = Ledger(fresh, node_id=f"order-{uuid.uuid4().hex[:6]}")
    taken: list[TakenOver] = []
    thread = threading.Thread(
        target=lambda: taken.append(
            ledger.takeover.take_over(ledger.consumer, [TopicPartition(job_log, 0)])
        ),
        daemon=True,
    )
    thread.start()
    thread.join(2.5)
    assert thread.is_alive(), "took over while the zombie's offsets were pending"
    zombie.produce(
        fresh.topic("jobs"),
        key=b"job-a",
        value=JOB_STATE.encode(_job_state("job-a", 123_000)),
        partition=0,
    )
    zombie.commit_transaction(30)
    thread.join(60)
    assert not thread.is_alive()
    assert [(tp.partition, tp.offset) for tp in taken[0].positions] == [(0, 1)]
    assert taken[0].states[0].jobs["job-a"].fired_ms == 123_000


class _SlowConsumer(Consumer):
    """A consumer that hands over at most 50 records a call, ~1 ms each: a slow read."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        messages = super().consume(min(num_messages, 50), timeout)
        time.sleep(0.001 * len(messages))
        return messages


class _SlowClients(Clients):
    """The ledger's clients, its consumers slow (`_SlowConsumer`)."""

    def consumer(self, config: dict[str, Any]) -> Consumer:
        return _SlowConsumer(config)


def test_a_long_restore_that_progresses_is_not_cut_off(fresh: Settings) -> None:
    """4,000 run states read at ~1 ms each (~4 s) with a 1 s stall limit: a fixed limit
    on the total would fail (and on every rebalance again); progress keeps it."""
    run = RunState(
        run_id="job-a@1000",
        job_id="job-a",
        scheduled_ms=1000,
        trigger="schedule",
        state="due",
        attempt=1,
        worker_id="",
        created_ms=1000,
        updated_ms=1000,
        deadline_ms=None,
        deadline_kind=None,
        started_ms=None,
        finished_ms=None,
        exit_code=None,
        reason="",
        seq=1,
    )
    producer = Producer(producer_config(fresh, **{"linger.ms": 20}))
    for i in range(4000):
        producer.produce(
            fresh.topic("runs"),
            key=f"job-a@{i}".encode(),
            value=RUN_STATE.encode(dataclasses.replace(run, run_id=f"job-a@{i}")),
            partition=0,
        )
    assert producer.flush(30) == 0
    ledger = Ledger(
        fresh,
        node_id=f"slow-{uuid.uuid4().hex[:6]}",
        restore_stall_s=1.0,
        clients=_SlowClients(),
    )
    started = time.monotonic()
    state = ledger.takeover.restore(0)
    assert len(state.runs) == 4000
    assert time.monotonic() - started > 2.0  # longer than the stall limit, by far


def test_a_restore_that_stops_progressing_fails(fresh: Settings) -> None:
    """An open transaction that is never resolved (here: kept open by the test) holds
    the restore at it: no record, no position moves, and after the stall limit it
    fails rather than hang."""
    holder = Producer(transactional_producer_config(fresh, f"holder-{uuid.uuid4().hex[:6]}"))
    holder.init_transactions(30)
    holder.begin_transaction()
    holder.produce(
        fresh.topic("jobs"),
        key=b"job-a",
        value=JOB_STATE.encode(_job_state("job-a", 1)),
        partition=0,
    )
    assert holder.flush(30) == 0
    ledger = Ledger(fresh, node_id=f"stall-{uuid.uuid4().hex[:6]}", restore_stall_s=1.5)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaException, match="no progress"):
            ledger.takeover.restore(0)
        assert time.monotonic() - started < 6.0  # before the broker's 7 s abort
    finally:
        holder.abort_transaction(30)


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_takeover_goes_on_from_what_was_read_ahead(
    fresh: Settings, store: str, tmp_path: Path
) -> None:
    """From its start to its first assignment a ledger reads every partition's state
    (`Takeover.start_read_ahead`, the one ledger process of its node); the takeover's restore,
    after the offset fetch, goes on from where that stopped to the real end. The records
    written in between - newer values, a tombstone, a transaction whose commit marker is
    all that is left after the read-ahead's position - are all in the state, and the
    partitions not taken are dropped."""
    plain = Producer({"bootstrap.servers": fresh.kafka})
    jobs = fresh.topic("jobs")
    for job_id, fired in (("job-a", 1), ("job-b", 1), ("job-gone", 1)):
        plain.produce(
            jobs,
            key=job_id.encode(),
            value=JOB_STATE.encode(_job_state(job_id, fired)),
            partition=0,
        )
    plain.produce(
        jobs, key=b"job-other", value=JOB_STATE.encode(_job_state("job-other", 1)), partition=1
    )
    assert plain.flush(30) == 0
    ledger = Ledger(
        fresh,
        node_id=f"ahead-{uuid.uuid4().hex[:6]}",
        restore_stall_s=3.0,
        store_dir=tmp_path if store == "disk" else None,
    )
    takeover = ledger.takeover
    try:
        takeover.start_read_ahead()
        assert takeover.ahead is not None

        def read(records: int) -> Callable[[], bool]:
            def step() -> bool:
                takeover.read_ahead()
                ahead = takeover.ahead
                assert ahead is not None
                return ahead.read >= records

            return step

        eventually(read(4), "the read-ahead of what was written", 30)
        plain.produce(
            jobs, key=b"job-a", value=JOB_STATE.encode(_job_state("job-a", 2)), partition=0
        )
        plain.produce(jobs, key=b"job-gone", value=None, partition=0)
        assert plain.flush(30) == 0
        txn = Producer(transactional_producer_config(fresh, f"ahead-{uuid.uuid4().hex[:6]}"))
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce(jobs, key=b"job-c", value=JOB_STATE.encode(_job_state("job-c", 3)), partition=0)
        txn.commit_transaction(30)
        eventually(read(7), "the new records", 30)
        # Read ahead past job-c: only its commit marker is left after the position.
        state = takeover.restore_all([0], takeover.take_ahead([0]))[0]
        assert takeover.ahead is None
        assert {k: state.jobs[k].fired_ms for k in ("job-a", "job-b", "job-c")} == {
            "job-a": 2,
            "job-b": 1,
            "job-c": 3,
        }
        assert "job-gone" not in state.jobs
        assert len(state.jobs) == 3
        # Written after the read-ahead ended, read by the restore's own reader.
        plain.produce(
            jobs, key=b"job-d", value=JOB_STATE.encode(_job_state("job-d", 4)), partition=0
        )
        assert plain.flush(30) == 0
        again = takeover.restore_all([0])[0]
        assert again.jobs["job-d"].fired_ms == 4
        assert again.jobs["job-a"].fired_ms == 2
    finally:
        takeover.end_read_ahead()
        ledger.consumer.close()
        if ledger.store is not None:
            ledger.store.close()


def test_a_second_ledger_process_reads_ahead_only_its_share(fresh: Settings) -> None:
    """With two ledger processes on a node, the second reads ahead the range the range
    assignor gives the second member (`range_share`), not the first's; a partition it
    gets beyond its share (another node holds the first's range, say) is restored from
    the start all the same. And two ledgers of one node get the two shares between them
    (which one each is the broker's choice)."""
    plain = Producer({"bootstrap.servers": fresh.kafka})
    jobs = fresh.topic("jobs")
    last = fresh.partitions - 1
    for job_id, partition in (("job-first", 0), ("job-last", last)):
        plain.produce(
            jobs,
            key=job_id.encode(),
            value=JOB_STATE.encode(_job_state(job_id, 1)),
            partition=partition,
        )
    assert plain.flush(30) == 0
    second = Ledger(fresh, node_id=f"share-{uuid.uuid4().hex[:6]}", share=(1, 2))
    takeover = second.takeover
    try:
        takeover.start_read_ahead()
        ahead = takeover.ahead
        assert ahead is not None
        assert {p for _, p in ahead.topic_partitions} == set(range_share(fresh.partitions, 1, 2))
        assert 0 not in {p for _, p in ahead.topic_partitions}
        assert last in {p for _, p in ahead.topic_partitions}

        def read() -> int:
            takeover.read_ahead()
            ahead = takeover.ahead
            assert ahead is not None
            return ahead.read

        eventually(lambda: read() >= 1, "the read-ahead of the last partition", 30)
        # A newer job-last, written once the first was read, comes in a later fetch. The
        # reader asks the one broker for all its partitions, from their start, in each
        # fetch: had it partition 0 too, job-first (there before the read-ahead began)
        # would have come no later than the first job-last, so before this one.
        plain.produce(
            jobs,
            key=b"job-last",
            value=JOB_STATE.encode(_job_state("job-last", 2)),
            partition=last,
        )
        assert plain.flush(30) == 0
        eventually(lambda: read() >= 2, "the read-ahead of the newer job-last", 30)
        assert read() == 2  # job-first's partition is not its share
        states = takeover.restore_all([0, last], takeover.take_ahead([0, last]))
        # Restored from the start, and from the read-ahead.
        assert states[0].jobs["job-first"].fired_ms == 1
        assert len(states[0].jobs) == 1
        assert states[last].jobs["job-last"].fired_ms == 2
        assert len(states[last].jobs) == 1
    finally:
        takeover.end_read_ahead()
        second.consumer.close()
    # In the group, the two processes get the two ranges, but which gets which is the
    # broker's choice (the KIP-848 range assignor orders members by their random ids):
    # the read-ahead's share is a guess, right half the time with two processes.
    node = f"share-{uuid.uuid4().hex[:6]}"
    ledgers = [Ledger(fresh, node_id=f"{node}-{i}", share=(i, 2)) for i in range(2)]
    with running(ledgers[0]), running(ledgers[1]):

        def assigned() -> dict[int, set[int]]:
            return {i: set(ledger.state) for i, ledger in enumerate(ledgers)}

        def both() -> bool:  # the first to join holds all until the second is in
            now = assigned()
            return all(now.values()) and sum(map(len, now.values())) == fresh.partitions

        eventually(both, "both ledgers assigned", 60)
        shares = {frozenset(range_share(fresh.partitions, i, 2)) for i in range(2)}
        assert {frozenset(held) for held in assigned().values()} == shares
