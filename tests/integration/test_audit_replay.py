"""`cronlog audit` on the real broker: a clean history audits clean (exit 0); injected
violations are reported with their partition and offset (exit 1); a worker report the
ledger rejected is read from job-log and judged once the ledger has decided it; a
missing topic or broker is a usage/connection error (exit 2).

The histories come from the real ledger (tests/unit/test_audit.py drives it), produced
to run-events as the ledger process does: keyed by job id, Avro via schemas.codec, with
the event time as the record timestamp; the worker reports it was sent go to job-log,
keyed by job id, as the workers send them.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from connectors.audit.checker import AuditReport
from connectors.audit.replay import replay, run_audit
from schemas.codec import JOB_LOG, RUN_EVENTS
from schemas.records import (
    JobEvent,
    LedgerInput,
    RunEvent,
    RunStarted,
    RunStateName,
)
from streams.core.ledger import input_job
from streams.kafka import producer_config
from streams.settings import Settings
from streams.topics import CATALOGUE, ensure_topics
from tests.unit.test_audit import clean_history, clean_ledger, rid

MIN = 60_000
# The history ends ~2 h 10 min after its base, before now: timestamps in the past.
BASE = (int(time.time() * 1000) // (10 * MIN)) * 10 * MIN - 3 * 60 * MIN

Event = RunEvent | JobEvent
Record = tuple[bytes, bytes, int]  # key, value, timestamp


def record(event: Event) -> Record:
    return event.job_id.encode(), RUN_EVENTS.encode(event), event.at_ms


def report_record(inp: LedgerInput) -> Record:
    job_id = input_job(inp)
    return job_id.encode(), JOB_LOG.encode(inp), inp.at_ms


def produce(
    settings: Settings, records: list[Record], topic_name: str = "run-events"
) -> list[tuple[int, int]]:
    """Produce in order; returns the (partition, offset) of each record."""
    producer = Producer(producer_config(settings))
    topic = settings.topic(topic_name)
    where: list[tuple[int, int]] = [(-1, -1)] * len(records)

    def delivered(index: int) -> Callable[[KafkaError | None, Message], None]:
        def callback(err: KafkaError | None, msg: Message) -> None:
            assert err is None, err
            where[index] = (msg.partition() or 0, msg.offset() or 0)

        return callback

    for index, (key, value, stamp) in enumerate(records):
        producer.produce(topic, key=key, value=value, timestamp=stamp, on_delivery=delivered(index))
    assert producer.flush(30) == 0
    assert all(p >= 0 for p, _ in where)
    return where


@pytest.fixture(scope="module")
def clean(topics: Settings) -> list[tuple[int, int]]:
    return produce(topics, [record(e) for e in clean_history(BASE)])


@pytest.fixture(scope="module")
def bad_settings(topics: Settings) -> Settings:
    """A second prefix with run-events but no job-log (deleted with the module's prefix,
    which it extends). `commands` too: ensure_topics fails when no topic it is given
    takes broker time."""
    bad = topics.with_(topic_prefix=f"{topics.topic_prefix}bad.")
    ensure_topics(bad, [spec for spec in CATALOGUE if spec.name in ("run-events", "commands")])
    return bad


def audited(settings: Settings, **kw: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_audit(
        settings,
        kw.get("from_ms"),  # type: ignore[arg-type]
        kw.get("to_ms"),  # type: ignore[arg-type]
        kw.get("job"),  # type: ignore[arg-type]
        out,
        err=err,
    )
    return code, out.getvalue(), err.getvalue()


def test_a_clean_history_audits_clean(topics: Settings, clean: list[tuple[int, int]]) -> None:
    code, out, err = audited(topics)
    assert code == 0, out + err
    assert "violations 0 (clean)" in out
    assert "jobs     2\n" in out
    assert f"read     {len(clean):,} run-events and 0 job-log records" in out
    assert "p50 0.30 s" in out


def test_a_job_and_a_time_window(topics: Settings, clean: list[tuple[int, int]]) -> None:
    code, out, err = audited(topics, job="k")
    assert code == 0, out + err
    assert "jobs     1\n" in out
    assert "runs     26 " in out
    # Minutes 45 to 90 of the history: runs begin mid-life, registrations are outside.
    window_from, window_to = BASE + 45 * MIN, BASE + 90 * MIN
    report, stats = replay(topics, window_from, window_to)
    assert report.clean, report.violations[:3]
    assert 0 < stats.records < len(clean)
    assert report.now_ms is not None
    assert report.now_ms <= window_to
    code, out, err = audited(topics, from_ms=window_from, to_ms=window_to)
    assert code == 0, out + err


def test_a_later_now_catches_an_installation_that_stopped(
    topics: Settings, clean: list[tuple[int, int]]
) -> None:
    out, err = io.StringIO(), io.StringIO()
    later = BASE + 150 * MIN  # job k (every 5 min) is not deleted: 3 firings overdue
    assert run_audit(topics, None, None, None, out, err=err, now_ms=later) == 1
    assert "missing_firing         3" in out.getvalue()


def test_injected_violations_are_reported_with_their_offsets(bad_settings: Settings) -> None:
    history = clean_history(BASE)
    missing = rid(BASE + 33 * MIN)
    events = [e for e in history if not (isinstance(e, RunEvent) and e.run_id == missing)]
    last = max(e.at_ms for e in events)

    def first_event(run_id: str) -> RunEvent:
        return next(e for e in events if isinstance(e, RunEvent) and e.run_id == run_id)

    def next_event(run_id: str, state: RunStateName, seq: int) -> Record:
        base = first_event(run_id)
        return record(
            RunEvent(
                f"{run_id}#{seq}",
                "j",
                run_id,
                base.scheduled_ms,
                "schedule",
                1,
                state,
                last,
                "w2",
                "",
            )
        )

    injected: list[tuple[str, Record]] = [
        ("duplicate_run", record(first_event(rid(BASE + 3 * MIN)))),  # created again
        ("illegal_transition", next_event(rid(BASE + 34 * MIN), "failed", 5)),  # after succeeded
        ("double_start", next_event(rid(BASE + 35 * MIN), "running", 5)),
        ("", next_event(rid(BASE + 35 * MIN), "succeeded", 6)),  # legal: ends the run again
        ("double_claim", next_event(rid(BASE + 36 * MIN), "dispatched", 5)),
        ("", next_event(rid(BASE + 36 * MIN), "succeeded", 6)),
        ("undecodable", (b"j", b"\x00not an avro record", last)),
    ]
    records = [record(e) for e in events] + [r for _, r in injected]
    where = produce(bad_settings, records)
    expected = {
        kind: position
        for (kind, _), position in zip(injected, where[len(events) :], strict=True)
        if kind
    }
    # The missing firing points at the next decision: minute 34's creation.
    expected["missing_firing"] = where[events.index(first_event(rid(BASE + 34 * MIN)))]

    report, stats = replay(bad_settings)
    assert_reported(report, expected)
    assert report.undecodable == 1
    # Without job-log the audit goes on with run-events alone, and says so.
    assert stats.decided_by == ""
    assert "job-log is not available" in report.reports_note

    code, out, err = audited(bad_settings)
    assert code == 1, out + err
    assert "reports  worker reports not checked: " in out
    topic = bad_settings.topic("run-events")
    for kind, (partition, offset) in expected.items():
        assert f"{kind:<22} {topic}[{partition}]@{offset}" in out, out


def assert_reported(report: AuditReport, expected: dict[str, tuple[int, int]]) -> None:
    found = {kind: n for kind, n in report.counts.items() if n}
    assert found == dict.fromkeys(expected, 1), report.violations
    for violation in report.violations:
        assert (violation.partition, violation.offset) == expected[violation.kind], violation


@pytest.fixture(scope="module")
def reports_settings(topics: Settings) -> Settings:
    """A third prefix with run-events and job-log (deleted with the module's prefix)."""
    with_reports = topics.with_(topic_prefix=f"{topics.topic_prefix}reports.")
    ensure_topics(with_reports, [s for s in CATALOGUE if s.name in ("run-events", "job-log")])
    return with_reports


def commit_as_the_ledger(settings: Settings, ends: dict[int, int]) -> None:
    """Commit job-log offsets for the ledger's consumer group, as a ledger that decided
    everything below them would have (no group is joined)."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka,
            "group.id": settings.group("ledger"),
            "enable.auto.commit": False,
        }
    )
    try:
        topic = settings.topic("job-log")
        offsets = [TopicPartition(topic, p, end) for p, end in ends.items()]
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def test_a_worker_report_the_ledger_rejected_is_read_from_job_log(
    reports_settings: Settings,
) -> None:
    led = clean_ledger(BASE)
    produce(reports_settings, [record(e) for e in led.events()])
    # A worker that never held it starts the run of minute 3, which w1 ran: the ledger
    # rejects it, so only job-log shows it.
    run_id = rid(BASE + 3 * MIN)
    assert led.report(RunStarted("j", run_id, 1, "zombie", BASE + 3 * MIN + 500))
    where = produce(reports_settings, [report_record(r) for r in led.reports], "job-log")
    injected = where[-1]

    # No ledger has committed offsets on job-log: whether it decided these reports is
    # told by time, and run-events' records are hours older than job-log's broker
    # timestamps. So none is judged yet.
    report, stats = replay(reports_settings)
    assert stats.decided_by == "time"
    assert stats.job_log_records == len(led.reports)
    assert report.clean, report.violations
    assert report.reports == 0
    assert report.unjudged_reports > 100

    # A ledger that decided everything: every report is judged, the rejected one flagged.
    ends: dict[int, int] = {}
    for partition, offset in where:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    commit_as_the_ledger(reports_settings, ends)
    report, stats = replay(reports_settings)
    assert stats.decided_by == "offsets"
    assert {k: n for k, n in report.counts.items() if n} == {"unsanctioned_execution": 1}
    (v,) = report.violations
    assert (v.source, v.partition, v.offset, v.run_id) == ("job-log", *injected, run_id)
    assert "never held the attempt (held by w1)" in v.detail
    assert report.unjudged_reports == 0
    assert report.reports > 100

    code, out, err = audited(reports_settings)
    assert code == 1, out + err
    topic = reports_settings.topic("job-log")
    assert f"unsanctioned_execution {topic}[{injected[0]}]@{injected[1]}" in out, out
    assert "below the ledger's committed offsets" in out


def test_a_missing_topic_is_an_error(topics: Settings) -> None:
    nowhere = topics.with_(topic_prefix=f"{topics.topic_prefix}absent.")
    code, out, err = audited(nowhere)
    assert code == 2
    assert "absent.run-events is not available" in err
    assert out == ""


def test_an_unreachable_broker_is_an_error() -> None:
    out, err = io.StringIO(), io.StringIO()
    settings = Settings(kafka="127.0.0.1:1", topic_prefix="audit-nowhere.")
    began = time.monotonic()
    assert run_audit(settings, None, None, None, out, err=err, timeout_s=1.0) == 2
    assert time.monotonic() - began < 5
    assert "cannot reach Kafka" in err.getvalue()


def test_from_after_to_is_a_usage_error(topics: Settings) -> None:
    code, _, err = audited(topics, from_ms=BASE + MIN, to_ms=BASE)
    assert code == 2
    assert "is after --to" in err
