"""`cronlog audit`: replay `run-events` and the worker reports of `job-log` from Kafka and
verify them (connectors/audit/checker.py).

The reader assigns every partition of the topics (no consumer group is joined and no
offsets are committed), reads ``read_committed`` from a start offset to an end offset
fixed when it begins, decodes each record with `schemas.codec.RUN_EVENTS` /
`schemas.codec.JOB_LOG` (the only knowledge it needs: it works on topics it did not
write) and hands it to the pure `Auditor`: all of run-events first, then job-log.

- ``from_ms`` / ``to_ms`` select by record timestamp, per partition, through
  ``offsets_for_times``: the range starts at the first offset whose timestamp is >=
  from_ms and ends before the first offset whose timestamp is > to_ms (the ledger stamps
  its records when it writes them). A range that starts inside the log is audited in
  partial mode: a run first seen mid-life is not a violation.
- ``job`` keeps the records whose key is that job id (both topics are keyed by job id)
  without decoding the others; their timestamps still advance "now", so a job that
  stopped firing is caught.
- A partition is finished at the end offset or at end-of-partition (with
  ``read_committed`` that is the last stable offset: records of a transaction still
  open are in flight, not history).
- Progress goes to `err` every `progress_every` records.

Worker reports. Only ``RunStarted`` and ``RunFinished`` are decoded (the union branch of
a job-log record is its first body byte: the others are skipped unread). A report is
judged only once the ledger has decided it. Before the end offsets of run-events are
fixed, the reader takes the ledger consumer group's committed offsets on job-log (read
only, through the admin API): every report below them was decided, and its outputs were
committed with those offsets, so they are in the range read. job-log is read up to them.
Without them (no ledger group, e.g. topics copied elsewhere), job-log is read to its end
and a report counts as decided when it is older, by `AuditConfig.safety_margin_ms`, than
the newest run-events record of its partition (the same partition number: the topics
are co-partitioned). With ``to_ms``, job-log is read up to ``to_ms - safety_margin_ms``:
the ledger's records about later reports may lie beyond the range. Without job-log (a
topic missing) the audit goes on with run-events alone and says so.

Exit codes of `run_audit`: 0 clean, 1 violations, 2 usage or connection errors.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from connectors.audit.checker import AuditConfig, Auditor, AuditReport, format_report
from schemas.codec import JOB_LOG, RUN_EVENTS, CodecError
from schemas.registry import HEADER_LENGTH
from streams.core.ids import iso_utc
from streams.kafka import admin_config, connection_config
from streams.settings import Settings

__all__ = ["AuditError", "ReplayStats", "parse_time", "replay", "run_audit"]

EXIT_CLEAN: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_ERROR: Final = 2

_BATCH: Final = 10_000
_FATAL_CODES: Final = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    }
)


class AuditError(RuntimeError):
    """The audit cannot run: bad arguments, no broker, no topic. Exit code 2."""


@dataclass(frozen=True, slots=True)
class ReplayStats:
    records: int  # run-events records read in the range (decoded, skipped, undecodable)
    seconds: float
    partitions: int
    job_log_records: int = 0  # job-log records read (most skipped unread)
    job_log_undecodable: int = 0  # worker reports that could not be decoded
    # How the ledger's decided reports were told: "offsets" (its committed offsets),
    # "time" (older than run-events), "" (job-log not read).
    decided_by: str = ""

    @property
    def rate(self) -> float:
        total = self.records + self.job_log_records
        return total / self.seconds if self.seconds > 0 else 0.0


def parse_time(text: str) -> int:
    """A --from/--to value: epoch milliseconds, or ISO-8601 with an offset or Z
    (a date alone is midnight UTC). Raises AuditError."""
    raw = text.strip()
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise AuditError(
            f"invalid time {text!r}: use ISO-8601 such as 2026-05-01T00:00:00Z, "
            "or epoch milliseconds"
        ) from None
    if moment.tzinfo is None:
        if "T" in raw or " " in raw:
            raise AuditError(f"invalid time {text!r}: add Z or an offset such as +02:00")
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _consumer(settings: Settings) -> Any:
    return Consumer(
        {
            **connection_config(settings),
            # assign() needs a group id, but no group is joined and nothing is committed.
            "group.id": f"{settings.group('audit')}-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "queued.max.messages.kbytes": 256 * 1024,
            "socket.timeout.ms": 10_000,
            # Only critical client logs: the audit reports connection failures itself
            # (exit 2) instead of a stream of librdkafka retries on stderr.
            "log_level": 2,
        }
    )


def _ranges(
    consumer: Any,
    topic: str,
    from_ms: int | None,
    to_ms: int | None,
    timeout_s: float,
) -> dict[int, tuple[int, int]]:
    """partition -> [start, end) offsets to read."""
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise AuditError(f"cannot reach Kafka: {exc}") from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        why = found.error if found is not None and found.error is not None else "not found"
        raise AuditError(f"topic {topic} is not available ({why})")
    partitions = sorted(found.partitions)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _offsets(consumer, topic, partitions, from_ms, to_ms, timeout_s)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            moving = isinstance(error, KafkaError) and error.code() in _LEADERS_MOVING
            if not moving or time.monotonic() >= deadline:
                raise AuditError(f"cannot read the offsets of {topic}: {exc}") from exc
            # A partition's leader is moving (a broker restarted, a topic just made): the
            # metadata is asked again by the next try.
            time.sleep(0.5)


# Errors of a partition whose leader is being elected or moved: asked again until the
# audit's timeout rather than failing the audit.
_LEADERS_MOVING: Final = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REPLICA_NOT_AVAILABLE,
    }
)


def _offsets(
    consumer: Any,
    topic: str,
    partitions: list[int],
    from_ms: int | None,
    to_ms: int | None,
    timeout_s: float,
) -> dict[int, tuple[int, int]]:
    """partition -> [start, end) offsets of `partitions`, from their watermarks and the
    time bounds."""
    bounds = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)
        for p in partitions
    }
    starts = {p: low for p, (low, _) in bounds.items()}
    ends = {p: high for p, (_, high) in bounds.items()}
    if from_ms is not None:
        for tp in consumer.offsets_for_times(
            [TopicPartition(topic, p, from_ms) for p in partitions], timeout=timeout_s
        ):
            # -1 (OFFSET_END): no record at or after from_ms.
            starts[tp.partition] = ends[tp.partition] if tp.offset < 0 else tp.offset
    if to_ms is not None:
        for tp in consumer.offsets_for_times(
            [TopicPartition(topic, p, to_ms + 1) for p in partitions], timeout=timeout_s
        ):
            if tp.offset >= 0:
                ends[tp.partition] = min(ends[tp.partition], tp.offset)
    return {p: (max(starts[p], bounds[p][0]), ends[p]) for p in partitions}


def _ledger_offsets(
    settings: Settings, topic: str, partitions: list[int], timeout_s: float
) -> dict[int, int] | None:
    """The ledger consumer group's committed offsets on job-log (stable ones: not those
    of a transaction still open), or None when it has none or they cannot be read."""
    group = settings.group("ledger")
    try:
        admin = AdminClient(admin_config(settings, log_level=2))
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic, p) for p in partitions]
        )
        futures = admin.list_consumer_group_offsets(
            [request], require_stable=True, request_timeout=timeout_s
        )
        found = futures[group].result(timeout=timeout_s)
    except (KafkaException, TimeoutError, KeyError, ValueError, TypeError):
        return None
    offsets = {
        tp.partition: tp.offset
        for tp in found.topic_partitions or ()
        if tp.error is None and tp.offset >= 0
    }
    return offsets or None


def _report_branches() -> dict[bytes, frozenset[int]]:
    """Per job-log schema version (its single-object header), the first body bytes of
    `RunStarted` and `RunFinished` records: job-log values are a record whose one field
    is a union, so the body begins with the branch index (a zigzag varint, one byte for
    the first 64 branches). A version of another shape is left out (decoded fully)."""
    wanted = ("RunStarted", "RunFinished")
    out: dict[bytes, frozenset[int]] = {}
    for version in JOB_LOG.schema.by_fingerprint().values():
        fields = version.parsed.get("fields") if isinstance(version.parsed, dict) else None
        branches = fields[0].get("type") if fields and len(fields) == 1 else None
        if not isinstance(branches, list) or len(branches) > 64:
            continue
        names = [b.get("name", "") if isinstance(b, dict) else str(b) for b in branches]
        out[version.header] = frozenset(
            2 * i for i, name in enumerate(names) if name.rsplit(".", 1)[-1] in wanted
        )
    return out


def _read(
    consumer: Any,
    topic: str,
    ranges: dict[int, tuple[int, int]],
    handle: Callable[[Message, int, int], None],
    *,
    progress: TextIO | None,
    progress_every: int,
    stall_s: float,
) -> int:
    """Read [start, end) of each partition, handing each record to `handle(msg,
    partition, offset)`; returns the number of records read."""
    pending = {p: r for p, r in ranges.items() if r[0] < r[1]}
    total = sum(end - start for start, end in pending.values())
    if not pending:
        return 0
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in pending.items()])
    began = last_progress = time.monotonic()
    records, next_report = 0, progress_every

    def done(partition: int) -> None:
        if pending.pop(partition, None) is not None:
            consumer.pause([TopicPartition(topic, partition)])

    while pending:
        try:
            batch = consumer.consume(_BATCH, timeout=0.2)
        except KafkaException as exc:
            raise AuditError(f"cannot read {topic}: {exc}") from exc
        if not batch:
            if time.monotonic() - last_progress > stall_s:
                raise AuditError(
                    f"no progress on {topic} for {stall_s:.0f} s; "
                    f"partitions {sorted(pending)} unfinished"
                )
            positions = consumer.position([TopicPartition(topic, p) for p in list(pending)])
            for tp in positions:
                if tp.offset >= 0 and tp.offset >= pending[tp.partition][1]:
                    done(tp.partition)
            continue
        last_progress = time.monotonic()
        for msg in batch:
            partition = msg.partition()
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    done(partition)
                    continue
                if error.fatal() or error.code() in _FATAL_CODES:
                    raise AuditError(f"cannot read {topic}: {error.str()}")
                continue  # transient (the client retries); the stall guard bounds it
            span = pending.get(partition)
            if span is None:
                continue  # already finished
            offset = msg.offset()
            if offset >= span[1]:
                done(partition)
                continue
            records += 1
            handle(msg, partition, offset)
            if offset >= span[1] - 1:
                done(partition)
        if progress is not None and records >= next_report:
            elapsed = time.monotonic() - began
            share = f" ({100 * records / total:.0f}%)" if total else ""
            progress.write(
                f"audit: {topic}: {records:,} records{share}, "
                f"{records / max(elapsed, 1e-9):,.0f}/s\n"
            )
            progress.flush()
            next_report += progress_every
    return records


def replay(
    settings: Settings,
    from_ms: int | None = None,
    to_ms: int | None = None,
    job: str | None = None,
    *,
    config: AuditConfig | None = None,
    progress: TextIO | None = None,
    progress_every: int = 100_000,
    timeout_s: float = 10.0,
    stall_s: float = 60.0,
    now_ms: int | None = None,
    reports: bool = True,
) -> tuple[AuditReport, ReplayStats]:
    """Read the range of run-events, then the worker reports of job-log (`reports`), and
    audit them. Raises AuditError.

    `now_ms`: "now" for the missing-firing and not-final checks when later than the
    newest record read (e.g. the wall clock, to catch an installation that stopped
    writing altogether); by default the newest record read."""
    if from_ms is not None and to_ms is not None and from_ms > to_ms:
        raise AuditError(f"--from ({iso_utc(from_ms)}) is after --to ({iso_utc(to_ms)})")
    if config is None:
        config = AuditConfig(partial=from_ms is not None)
    topic = settings.topic("run-events")
    log_topic = settings.topic("job-log")
    auditor = Auditor(config)
    job_key = job.encode() if job is not None else None
    skipped_ms: int | None = None  # the newest timestamp of records skipped by --job
    newest: dict[int, int] = {}  # run-events partition -> its newest record timestamp
    try:
        consumer = _consumer(settings)
    except KafkaException as exc:
        raise AuditError(f"cannot create a Kafka consumer for {settings.kafka}: {exc}") from exc
    began = time.monotonic()
    log_records = log_undecodable = 0
    decided_by = ""
    try:
        # Where the ledger has decided job-log up to, taken before run-events' range is
        # fixed: the outputs of every decision below it are then inside that range.
        log_ranges: dict[int, tuple[int, int]] | None = None
        horizon: dict[int, int] | None = None
        if reports:
            log_to = None if to_ms is None else to_ms - config.safety_margin_ms
            try:
                if from_ms is not None and log_to is not None and log_to < from_ms:
                    raise AuditError("the window is shorter than the safety margin")
                log_ranges = _ranges(consumer, log_topic, from_ms, log_to, timeout_s)
            except AuditError as exc:
                auditor.no_reports(f"{log_topic}: {exc}")
            else:
                horizon = _ledger_offsets(settings, log_topic, sorted(log_ranges), timeout_s)
                if horizon is not None:
                    decided_by = "offsets"
                    log_ranges = {
                        p: (start, min(end, horizon.get(p, start)))
                        for p, (start, end) in log_ranges.items()
                    }
                else:
                    decided_by = "time"
        ranges = _ranges(consumer, topic, from_ms, to_ms, timeout_s)
        track = decided_by == "time"

        def run_event(msg: Message, partition: int, offset: int) -> None:
            nonlocal skipped_ms
            key = msg.key()
            skip = job_key is not None and key != job_key
            if track or skip:
                kind, stamp = msg.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE:
                    if track and stamp > newest.get(partition, stamp - 1):
                        newest[partition] = stamp
                    if skip and (skipped_ms is None or stamp > skipped_ms):
                        skipped_ms = stamp
                if skip:
                    return
            try:
                event = RUN_EVENTS.decode(msg.value() or b"")
            except CodecError as exc:
                auditor.undecodable(partition, offset, str(exc), key)
            else:
                if job is None or event.job_id == job:
                    auditor.record(event, partition, offset)

        records = _read(
            consumer,
            topic,
            ranges,
            run_event,
            progress=progress,
            progress_every=progress_every,
            stall_s=stall_s,
        )
        if log_ranges is not None:
            branches = _report_branches()
            margin = config.safety_margin_ms

            def report(msg: Message, partition: int, offset: int) -> None:
                nonlocal log_undecodable
                if job_key is not None and msg.key() != job_key:
                    return
                value = msg.value() or b""
                wanted = branches.get(value[:HEADER_LENGTH])
                if wanted is not None and (
                    len(value) <= HEADER_LENGTH or value[HEADER_LENGTH] not in wanted
                ):
                    return  # not a start or a finish: skipped unread
                try:
                    inp = JOB_LOG.decode(value)
                except CodecError:
                    log_undecodable += 1  # the ledger dead-letters it: no decision
                    return
                decided = True
                if track:
                    kind, stamp = msg.timestamp()
                    ledger = newest.get(partition)
                    decided = (
                        kind != TIMESTAMP_NOT_AVAILABLE
                        and ledger is not None
                        and stamp <= ledger - margin
                    )
                auditor.report(inp, partition, offset, decided=decided)

            log_records = _read(
                consumer,
                log_topic,
                log_ranges,
                report,
                progress=progress,
                progress_every=progress_every,
                stall_s=stall_s,
            )
    finally:
        consumer.close()
    stats = ReplayStats(
        records,
        time.monotonic() - began,
        len(ranges),
        log_records,
        log_undecodable,
        decided_by,
    )
    newest_ms = max((t for t in (skipped_ms, now_ms) if t is not None), default=None)
    return auditor.finish(newest_ms), stats


def run_audit(
    settings: Settings,
    from_ms: int | None,
    to_ms: int | None,
    job: str | None,
    out: TextIO,
    *,
    err: TextIO | None = None,
    config: AuditConfig | None = None,
    limit: int = 20,
    timeout_s: float = 10.0,
    now_ms: int | None = None,
) -> int:
    """`cronlog audit`: replay, print the summary and the first `limit` violations to
    `out`; progress and errors to `err` (stderr). Returns the process exit code: 0 clean,
    1 violations, 2 usage or connection errors."""
    err = sys.stderr if err is None else err
    topic = settings.topic("run-events")
    log_topic = settings.topic("job-log")
    try:
        report, stats = replay(
            settings,
            from_ms,
            to_ms,
            job,
            config=config,
            progress=err,
            timeout_s=timeout_s,
            now_ms=now_ms,
        )
    except AuditError as exc:
        err.write(f"cronlog audit: {exc}\n")
        return EXIT_ERROR
    scope = [f"topics {topic} and {log_topic} ({stats.partitions} partitions)"]
    if from_ms is not None or to_ms is not None:
        low = iso_utc(from_ms) if from_ms is not None else "the beginning"
        high = iso_utc(to_ms) if to_ms is not None else "the end"
        scope.append(f"records from {low} to {high}")
    if job is not None:
        scope.append(f"job {job}")
    out.write(f"cronlog audit: {', '.join(scope)}\n")
    out.write(
        f"read     {stats.records:,} run-events and {stats.job_log_records:,} job-log records "
        f"in {stats.seconds:.2f} s ({stats.rate:,.0f} records/s)\n"
    )
    if stats.decided_by:
        how = (
            "below the ledger's committed offsets"
            if stats.decided_by == "offsets"
            else f"older than run-events by {_margin_s(config)} s (no ledger offsets)"
        )
        undecodable = (
            f", {stats.job_log_undecodable:,} undecodable" if stats.job_log_undecodable else ""
        )
        out.write(f"job-log  worker reports judged when decided: {how}{undecodable}\n")
    format_report(report, out, topic=topic, limit=limit, job_log_topic=log_topic)
    return EXIT_CLEAN if report.clean else EXIT_VIOLATIONS


def _margin_s(config: AuditConfig | None) -> int:
    return (config or AuditConfig()).safety_margin_ms // 1000


if __name__ == "__main__":  # a stop-gap entry point until the CLI calls run_audit
    import argparse

    parser = argparse.ArgumentParser(prog="python -m connectors.audit.replay")
    parser.add_argument("--from", dest="from_", default=None)
    parser.add_argument("--to", default=None)
    parser.add_argument("--job", default=None)
    args = parser.parse_args()
    try:
        start = None if args.from_ is None else parse_time(args.from_)
        stop = None if args.to is None else parse_time(args.to)
    except AuditError as exc:
        sys.stderr.write(f"cronlog audit: {exc}\n")
        raise SystemExit(EXIT_ERROR) from None
    raise SystemExit(run_audit(Settings.from_env(), start, stop, args.job, sys.stdout))
