"""The audit of `run-events` and of the worker reports on `job-log`: a pure checker of
the exactly-once promises (docs/architecture.md, "The crash-safety argument").

Feed it the events of the audit log in log order (`Auditor.record`, with the partition
and offset each came from; undecodable records through `Auditor.undecodable`), then the
worker reports of `job-log` (`Auditor.report`, after every run-events record: they are
judged against the ledger's whole record), then call `Auditor.finish`. No Kafka here:
`connectors/audit/replay.py` reads the topics.

What is checked, and the kind of violation reported (each names the run or job and the
topic, partition and offset of the offending record):

- ``duplicate_run``: a run created twice. Run ids are deterministic, so a duplicate shows
  as a second creation event (seq 1, or seq 0 for a skip) for a run id already seen, as a
  repeated seq number of a run, or as a second run id for the same (job, scheduled time)
  (manual runs excepted: their scheduled time is the request time).
- ``illegal_transition``: a transition not in `TRANSITIONS`, a wrong attempt number (a
  retry, a rerun or a revival starts attempt + 1, every other transition keeps the
  attempt), a seq gap or an out-of-order seq, a malformed event id, or a run whose first
  event is not a creation.
- ``double_claim`` / ``double_start``: more than one ``dispatched`` / ``running`` event
  for one (run, attempt). These take precedence over ``illegal_transition`` for the
  same event (a second start is also an illegal transition, but it is reported once, by
  its specific kind). A claim released before its start (``dispatched -> due``, the
  same attempt: released by its worker, or its worker declared dead before the run's start) ends
  that claim: the attempt may be claimed once more, and still started only once.
- ``missing_firing``: a fire time of a job's schedule with no run record (see
  `connectors/audit/firings.py`).
- ``not_final``: a run that is not final at the end of the replay although older than
  its job could legitimately take (see `AuditConfig` and `allowance_ms`, in
  `connectors/audit/allowance.py`).
- ``unsanctioned_execution``: a worker executed an attempt the ledger never let it run
  (see `connectors/audit/worker_reports.py`).
- ``overlapping_attempts``: two executions of one run, or of one job whose concurrency
  policy forbids it, at the same time (see `connectors/audit/overlaps.py`).
- ``missing_period``: a period of a DAG step (a job without a schedule that runs once
  per period of its upstreams) dropped without any record (see
  `connectors/audit/periods.py`).
- ``undecodable``: a record that is not a run-events record (counted, never fatal).

The first four are checked event by event (`connectors/audit/run_events.py`), into what
the audit keeps of the replay (`connectors/audit/history.py`, with who held and ran each
attempt in `connectors/audit/grants.py`); the findings and the report are in
`connectors/audit/findings.py`, start lateness in `connectors/audit/lateness.py`, the
text in `connectors/audit/summary.py`. Here: the order of it all (`Auditor`).
"""

from __future__ import annotations

from collections.abc import Iterable

from connectors.audit.allowance import allowance_ms, not_final
from connectors.audit.config import AuditConfig
from connectors.audit.findings import KINDS, AuditReport, Findings, Violation, ViolationKind
from connectors.audit.firings import missing_firings, re_created, rescheduled
from connectors.audit.history import AuditedJob, History
from connectors.audit.lateness import Lateness, lateness
from connectors.audit.overlaps import index_starts
from connectors.audit.periods import missing_periods
from connectors.audit.run_events import RunEvents
from connectors.audit.summary import format_report
from connectors.audit.worker_reports import WorkerReports
from schemas.records import TRANSITIONS, JobEvent, LedgerInput, RunEvent, RunFinished, RunStarted

# The names importers have always taken from this module (tests, the replay, the
# benchmarks), wherever they are defined now.
__all__ = [
    "KINDS",
    "TRANSITIONS",
    "AuditConfig",
    "AuditReport",
    "Auditor",
    "Lateness",
    "Violation",
    "ViolationKind",
    "allowance_ms",
    "audit",
    "format_report",
]


class Auditor:
    """Accumulates the audit of one replay. Not thread-safe; one per replay."""

    def __init__(
        self,
        config: AuditConfig = AuditConfig(),
    ) -> None:
        self.config = config
        self._history = History()
        self._findings = Findings(config.keep_violations)
        self._run_events = RunEvents(config, self._history, self._findings)
        self._worker_reports = WorkerReports(config, self._history, self._findings)
        self._jobs = self._history.jobs
        self._events = 0
        self._job_events = 0
        self._undecodable = 0
        self._last_ms: int | None = None
        self._sealed = False  # reports began: run-events are complete
        self._finished = False

    # -- input ------------------------------------------------------------------------------
    def record(self, event: RunEvent | JobEvent, partition: int, offset: int) -> None:
        """One decoded event, in log order, with where it came from."""
        self._events += 1
        if self._last_ms is None or event.at_ms > self._last_ms:
            self._last_ms = event.at_ms
        job = self._jobs.get(event.job_id)
        if job is None:
            job = self._jobs[event.job_id] = AuditedJob(event.job_id, partition, offset)
        else:
            job.partition, job.offset = partition, offset
        if isinstance(event, JobEvent):
            self._job_events += 1
            job.timeline.append((event.kind, event.at_ms, event.spec))
            job.marks.append(len(job.counted))
            if event.kind == "upserted" and event.spec is not None:
                if job.deleted_ms is not None:
                    re_created(job, len(job.timeline) - 1, event.at_ms)
                elif job.spec is not None and (job.spec.schedule, job.spec.dst) != (
                    event.spec.schedule,
                    event.spec.dst,
                ):
                    rescheduled(job, len(job.timeline) - 1, event.at_ms)
                job.spec = event.spec
                job.forbid = event.spec.concurrency == "forbid"
            elif event.kind == "deleted" and job.spec is not None and job.deleted_ms is None:
                job.deleted_ms = event.at_ms
            return
        self._run_events.check(job, event, partition, offset)

    def _record_after_seal(self, event: RunEvent | JobEvent, partition: int, offset: int) -> None:
        raise RuntimeError("Auditor.record after Auditor.report: run-events come first")

    def undecodable(self, partition: int, offset: int, error: str, key: bytes | None) -> None:
        """A record that is not a run-events record: counted and reported, never fatal."""
        self._undecodable += 1
        job_id = key.decode("utf-8", "replace") if key else ""
        self._findings.violate("undecodable", job_id, "", partition, offset, error)

    def report(
        self, inp: LedgerInput, partition: int, offset: int, *, decided: bool = True
    ) -> None:
        """One job-log record, in log order, after every run-events record. Only worker
        reports of executions (`RunStarted`, `RunFinished`) are judged; `decided=False`:
        the ledger may not have decided it yet (counted, not judged)."""
        if not isinstance(inp, RunStarted | RunFinished):
            return
        if not self._sealed:
            self._seal()
        self._worker_reports.judge(inp, partition, offset, decided=decided)

    def no_reports(self, why: str) -> None:
        """The worker reports could not be read (said in the report)."""
        self._worker_reports.note = why

    def _seal(self) -> None:
        """Run-events are complete: index what the reports are judged against."""
        self._sealed = True
        self.record = self._record_after_seal  # type: ignore[method-assign]
        index_starts(self._jobs.values())

    # -- the end --------------------------------------------------------------------------
    def finish(self, now_ms: int | None = None) -> AuditReport:
        """The checks that need the whole replay, and the report.

        `now_ms`: the newest time the reader saw (e.g. timestamps of records it skipped);
        the newest event time is used when later."""
        if self._finished:
            raise RuntimeError("Auditor.finish may be called once")
        self._finished = True
        config, history, findings = self.config, self._history, self._findings
        now = self._last_ms
        if now_ms is not None and (now is None or now_ms > now):
            now = now_ms
        expected = excused = unchecked = steps = periods = 0
        if now is not None:
            until = now - config.safety_margin_ms
            for job in self._jobs.values():
                if job.spec is None:
                    unchecked += 1 if job.fires else 0
                    continue
                if any(s is not None and s.depends_on for _, _, s in job.timeline):
                    found = missing_periods(history, job, until, config, findings)
                    if found is not None:
                        steps += 1
                        periods += found
                try:
                    e, x = missing_firings(job, until, config, findings)
                except ValueError:  # a schedule this code cannot evaluate (ScheduleError)
                    unchecked += 1
                    continue
                expected += e
                excused += x
        live = not_final(history, now, config, findings)
        reports = self._worker_reports
        return AuditReport(
            jobs=len(self._jobs),
            runs=len(history.runs),
            events=self._events,
            job_events=self._job_events,
            undecodable=self._undecodable,
            live_runs=live,
            unchecked_jobs=unchecked,
            expected_firings=expected,
            excused_firings=excused,
            counts=dict(findings.counts),
            violations=tuple(findings.violations),
            lateness=lateness(history.lateness),
            now_ms=now,
            reports=reports.judged,
            unjudged_reports=reports.unjudged,
            reports_note=reports.note,
            dag_steps=steps,
            dag_periods=periods,
        )


def audit(
    records: Iterable[tuple[RunEvent | JobEvent, int, int]],
    config: AuditConfig = AuditConfig(),
    now_ms: int | None = None,
    reports: Iterable[tuple[LedgerInput, int, int]] = (),
) -> AuditReport:
    """Audit (event, partition, offset) triples in log order, then (job-log record,
    partition, offset) triples of worker reports, all taken as decided by the ledger."""
    auditor = Auditor(config)
    for event, partition, offset in records:
        auditor.record(event, partition, offset)
    for inp, partition, offset in reports:
        auditor.report(inp, partition, offset)
    return auditor.finish(now_ms)
