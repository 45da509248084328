"""The scheduler's catch-up on assignment: it rebuilds its timers from the newest value
of each key in `jobs` and `runs` (however many superseded values and tombstones the
compacted topics still hold), then follows new writes record by record."""

from __future__ import annotations

import threading

from confluent_kafka import Producer, TopicPartition

from schemas.codec import JOB_STATE, RUN_STATE
from schemas.records import JobState, RunState
from streams.headers import (
    DEADLINE_HEADER,
    TIMERS_HEADER,
    Deadline,
    Timers,
    encode_deadline,
    encode_timers,
)
from streams.scheduler import CATCH_UP_MAX_S, Scheduler
from streams.settings import Settings
from tests.support.specs import upsert
from tests.support.waiting import eventually

NOW = 1_800_000_000_000  # the scheduler's clock: before every due time below
PARTITION = 1


def state(job_id: str, next_due: int) -> bytes:
    command = upsert(job_id, schedule={"every": "1h"})
    job = JobState(command.spec, False, False, 0, 0, 0, next_due, (), (), (), 1)
    return JOB_STATE.encode(job)


def run(run_id: str, deadline: int) -> bytes:
    record = RunState(
        run_id, "a", NOW, "schedule", "dispatched", 1, "w", 0, 0, deadline, "timeout", None,
        None, None, "", 1,
    )  # fmt: skip
    return RUN_STATE.encode(record)


def write(settings: Settings, records: list[tuple[str, bytes, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka})
    for topic, key, value in records:
        producer.produce(settings.topic(topic), key=key, value=value, partition=PARTITION)
    assert producer.flush(30) == 0


def test_catch_up_keeps_the_newest_value_then_follows(topics: Settings) -> None:
    due = NOW + 3_600_000
    write(
        topics,
        [
            *[("jobs", b"a", state("a", due - 1000 * k)) for k in (5, 4, 3, 2, 1)],
            ("jobs", b"a", state("a", due)),  # the newest value of a
            ("jobs", b"gone", state("gone", due)),
            ("jobs", b"gone", None),  # deleted since
            ("runs", b"a@x", run("a@x", due + 5)),
            ("runs", b"a@x", run("a@x", due + 9)),
            ("runs", b"a@y", run("a@y", due)),
            ("runs", b"a@y", None),  # forgotten since
        ],
    )
    node = Scheduler(topics, "catchup-test", propose_at=lambda: NOW)
    thread = threading.Thread(target=node.run, daemon=True)
    thread.start()
    try:

        def caught_up() -> bool:
            timers = node.timers.get(PARTITION)
            return timers is not None and not timers.backlog and bool(timers.fires.due)

        eventually(caught_up, "the catch-up of partition 1", 30)
        timers = node.timers[PARTITION]
        assert timers.fires.due == {"a": due}
        assert set(timers.runs) == {"a@x"}
        assert timers.deadlines.get("a@x") == due + 9
        # From now on record by record: a new value is learned as it comes.
        write(topics, [("jobs", b"a", state("a", due + 60_000))])
        eventually(lambda: timers.fires.due.get("a") == due + 60_000, "the new value of a", 30)
    finally:
        node.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_a_catch_up_that_never_sees_the_end_goes_on_record_by_record(topics: Settings) -> None:
    """Should the end of a partition never be reported, the catch-up still ends after
    CATCH_UP_MAX_S: what it kept is learned, and later records are followed one by one."""
    node = Scheduler(topics, "catchup-cap", propose_at=lambda: NOW)
    try:
        timers = node.fresh_timers()
        node.timers[PARTITION] = timers
        due = NOW + 3_600_000
        timers.backlog[node.jobs_topic]["a"] = state("a", due)
        timers.backlog[node.runs_topic]["a@x"] = run("a@x", due)
        node.cap_catch_ups()
        assert timers.backlog, "ended before its time"
        timers.since -= CATCH_UP_MAX_S + 1
        node.cap_catch_ups()
        assert not timers.backlog
        assert timers.fires.due == {"a": due}
        assert timers.deadlines.get("a@x") == due
    finally:
        node.consumer.close()
        node.beats.close()


def test_the_state_headers_are_read_instead_of_the_values(topics: Settings) -> None:
    """The ledger writes each job state with its timers and each run state with its
    deadline in a header, and the scheduler reads the header alone; a record without one
    is decoded (older records). The values here are not even Avro: a scheduler that
    decoded them would log them as undecodable and learn nothing."""
    due = NOW + 7_200_000
    header = encode_timers(Timers(due, 5, True, True))
    producer = Producer({"bootstrap.servers": topics.kafka})
    producer.produce(
        topics.topic("jobs"),
        key=b"h",
        value=b"not avro",
        partition=PARTITION,
        headers=[(TIMERS_HEADER, header)],
    )
    producer.produce(  # no header: decoded
        topics.topic("jobs"), key=b"plain", value=state("plain", due), partition=PARTITION
    )
    producer.produce(
        topics.topic("runs"),
        key=b"h@x",
        value=b"not avro either",
        partition=PARTITION,
        headers=[(DEADLINE_HEADER, encode_deadline(Deadline(due + 7, 3, "timeout")))],
    )
    assert producer.flush(30) == 0
    node = Scheduler(topics, "header-test", propose_at=lambda: NOW)
    thread = threading.Thread(target=node.run, daemon=True)
    thread.start()
    try:
        eventually(
            lambda: (
                (t := node.timers.get(PARTITION)) is not None
                and not t.backlog
                and {"h", "plain"} <= set(t.fires.due)
            ),
            "both jobs learnt",
            30,
        )
        assert node.timers[PARTITION].fires.due["h"] == due
        assert node.timers[PARTITION].fires.due["plain"] == due
        assert node.timers[PARTITION].runs["h@x"] == ("h", 3, "timeout")
        assert node.timers[PARTITION].deadlines.get("h@x") == due + 7
        # Followed record by record, the header is read too.
        newer = encode_timers(Timers(due + 1, 5, True, True))
        producer.produce(
            topics.topic("jobs"),
            key=b"h",
            value=b"still not avro",
            partition=PARTITION,
            headers=[(TIMERS_HEADER, newer)],
        )
        assert producer.flush(30) == 0
        eventually(lambda: node.timers[PARTITION].fires.due["h"] == due + 1, "the newer h", 30)
    finally:
        node.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_what_is_read_ahead_before_the_assignment_is_kept_and_read_on_from(
    topics: Settings,
) -> None:
    """A starting node reads every partition while its group decides (a takeover waits
    out the dead member's session first). On the assignment it keeps what it read and
    goes on from where the read-ahead stopped: the records written meanwhile are learnt,
    none is missed or read twice out of order."""
    due = NOW + 9_000_000
    write(topics, [("jobs", b"ra", state("ra", due)), ("jobs", b"ra-old", state("ra-old", due))])
    node = Scheduler(topics, "read-ahead", propose_at=lambda: NOW)
    try:
        node.start_warm_up()
        warm = node.warm_timers[PARTITION]

        def read_ahead() -> bool:
            node.warm_up()
            return {"ra", "ra-old"} <= set(warm.fires.due) and not warm.backlog

        eventually(read_ahead, "the read-ahead of partition 1", 30)
        assert not node.timers, "read ahead, not owned"
        write(
            topics,
            [
                ("jobs", b"ra", state("ra", due + 1)),  # newer than what was read ahead
                ("jobs", b"ra-old", None),  # deleted since
                ("jobs", b"ra-new", state("ra-new", due + 2)),
            ],
        )
        partitions = [
            TopicPartition(node.jobs_topic, PARTITION),
            TopicPartition(node.runs_topic, PARTITION),
        ]
        node.on_assign(node.consumer, partitions)
        assert node.timers[PARTITION] is warm  # kept, not read again
        assert not node.warming  # the read-ahead ends with the first assignment

        def followed() -> bool:
            node.read_into(node.consumer.consume(500, timeout=0.2), node.timers)
            return warm.fires.due.get("ra-new") == due + 2

        eventually(followed, "the records written after the read-ahead", 30)
        assert warm.fires.due.get("ra") == due + 1
        assert "ra-old" not in warm.fires.due
    finally:
        node.end_warm_up()
        node.consumer.close()
        node.beats.close()
