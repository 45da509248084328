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
  its specific kind). A claim given back before its start (``dispatched -> due``, the
  same attempt: released by its worker, or its worker lost before the run's start) ends
  that claim: the attempt may be claimed once more, and still started only once.
- ``missing_firing``: a fire time of a job's schedule with no run record (see below).
- ``not_final``: a run that is not final at the end of the replay although older than
  its job could legitimately take (see `AuditConfig` and `allowance_ms`).
- ``unsanctioned_execution``: a worker executed an attempt the ledger never let it run
  (see "Worker reports" below).
- ``overlapping_attempts``: two executions of one run, or of one job whose concurrency
  policy forbids it, at the same time (see "Overlaps" below).
- ``missing_period``: a period of a DAG step (a job without a schedule that runs once
  per period of its upstreams) dropped without any record (see "DAG steps" below).
- ``undecodable``: a record that is not a run-events record (counted, never fatal).

Missing firings. A job is *active* over intervals derived from its job events: from an
``upserted`` that registers it (or re-registers it after a deletion) until ``paused`` or
``deleted``, and again from ``resumed``; the fire times due are those strictly after the
start of an interval and at or before its end (the ledger's fired watermark moves to the
registration/resume time, and a pause or deletion stops firing). A second ``upserted``
with another schedule or DST policy ends the interval of the old schedule at its at_ms
and starts one of the new schedule there (a schedule change is never retroactive). The
last interval ends at ``now - safety_margin`` (120 s), where ``now`` is the newest event
time read (or a later time the reader passes), so firings in flight are not flagged.

A fire time in an active interval without any run record (created or skipped) is a
violation unless the ledger may legitimately have decided it without a record:

- the decision that moved past it (the earliest-made creation of a run of the job
  scheduled later) was made 24 h (the ledger's catch-up window) or more after it: a late
  proposal records only the firings of the last 24 h; or
- that decision recorded `max_catchup_runs` (1000) firings at once: the ledger caps one
  catch-up at that many records.

With no later decision at all, every overdue fire time is flagged: the job has stopped
firing. Only jobs whose ``upserted`` event is in the replay are checked (a ``--from``
window may start after it). Runs created ahead (pre-dispatch) for times after a pause
are cancelled by the ledger ("job paused ..."); their times are not in an active
interval, so they are neither expected nor flagged.

Not final. A run is given `allowance_ms(spec)`: max_attempts x (timeout + the ledger's
timeout grace + a claim timeout), twice the nominal retry backoffs, 24 h more when the
job has dependencies (a run may wait that long for its upstreams), and 10 minutes of
slack, counted from the later of its scheduled time and its creation (or its rerun);
one more attempt's share for each claim given back before its start.
A job whose spec is not in the replay gets `unknown_spec_allowance_ms`.

Transitions follow the ledger (`streams/core/ledger/`), including ``skipped -> due``:
the ledger's rerun accepts every final state, a skipped firing included; and
``dispatched -> due`` with the same attempt: a claimed attempt that never started is
dispatched again.

Worker reports. A worker reports on `job-log` (its claims, ``RunStarted``,
``RunFinished``, ``RunReleased``); the ledger accepts a start only from the worker
holding the current attempt of a live, claimed run, and records it as ``running``. A
report the ledger rejected leaves no trace on run-events, so the audit reads the reports
too. Run-events sanctions, per (run, attempt, worker), an execution by that worker if it
has a ``running`` event of the attempt by it, or if the ledger accepted its outcome
while it held the claim (a transition out of ``dispatched`` with an exit code: its start
report was lost or came late). Evidence of an execution is a ``RunStarted``, or a
``RunFinished`` with an exit code (a process ran and exited). An execution without a
sanction is an ``unsanctioned_execution``, reported once per (run, attempt, worker) at
its first report, saying why:

- the worker never held the attempt: it ran something nobody granted it (a run id
  run-events never had, for a registered job, included);
- it held the attempt, and the ledger had given the claim back (released by the worker,
  or the worker declared lost before the run's start time): the ledger relied on the
  attempt never having started and dispatched it again;
- it held the attempt, and by the report's own time (the worker's clock, give or take
  `clock_tolerance_ms`) it started after the ledger cancelled the claim or ended it
  without a start (a lost verdict, the timeout backstop, its own report without an exit
  code), or, but for a cancel (whose run is stopped after it), was still running then:
  it ran beside whatever the ledger did next.

Not findings, by construction: a duplicate or late report of a sanctioned execution
(same worker, same attempt), whatever the run's state when it came; claims (a refused
claim is not an execution), releases, a ``RunFinished`` without an exit code from a
worker that never ran the attempt; an execution under way before the ledger cancelled
the claim or declared it lost, whose report came after (the ledger's record covers it:
cancelled; lost, whether it did its work unknown); reports the ledger has not decided
yet (the reader passes only reports below the ledger group's committed offsets, or, when
those are unknown, older than the partition's newest run-event by `safety_margin_ms`;
and the start of the holder of a claim still open at the end is in flight); reports on
runs the replay cannot judge (a run whose events begin before a ``--from`` window, for
its attempts up to the first seen; a job whose registration is not in the replay). A run
the ledger forgot is still on run-events: its late reports are judged like any other.
The check is per execution, not per moment: a start rejected as premature by a worker
granted the attempt just after is not told apart from its granted start.

Overlaps. On the ledger's own view two attempts of one run never overlap: a run's
events are one sequence and a new attempt begins only from ``retrying`` or a final
state, so anything else is an ``illegal_transition`` already. What is checkable:

- from run-events: a run of a job with concurrency ``forbid`` or ``replace`` created by
  its schedule while another run of the job is live (not final) on the ledger's view
  (the ledger skips such a firing, or cancels the live runs first). Counted from the runs
  seen, so a ``--from`` window misses runs live before it but flags nothing wrongly.
  Revivals and reruns are not checked (the ledger does not apply the policy to reruns,
  and run-events does not tell the two apart), nor manual, backfill and dependency runs
  (the ledger does not apply it to them);
- with the reports: a sanctioned execution whose worker's ``RunFinished`` says it ended
  (its ``at_ms``, the end on the worker's clock) more than `clock_tolerance_ms` after the
  ledger recorded the start of a later attempt of the same run, or, for a ``forbid`` job,
  of a run of its schedule scheduled after it (a rerun of an earlier time, the
  operator's, may run beside it: ``forbid`` governs the schedule's firings only). Not
  from a report of a ``lost`` outcome (its time is the report's: the end is unknown).
  ``replace`` is not checked here: the ledger starts the new run while the old one is
  being stopped.

DAG steps. A job without a schedule and with upstreams runs once per period: when an
upstream's (non-manual, not withdrawn ahead of its time) run ends, the step's ledger
records a run for that scheduled time (trigger ``dependency``) if every upstream's
latest outcome since the step's last record (its watermark) succeeded, records it as
skipped if that run did not succeed, and otherwise waits; a record at t stands for
every outcome up to t. The checks follow the watermark through each life of the step
(from its registration or resume to its pause, deletion, a change of its upstreams, or
``now - safety_margin``), and consider
the outcomes whose final event lies more than `notice_lag_ms` inside the life (the
notice was surely decided while the step was active). ``missing_period``, for an
outcome with no record at its time:

- it was decided while the step's watermark was below it, and no record at or after
  its time was made before it: with one upstream, whose notices are decided in the order
  of its final events, "before" is told exactly; with several, a record made more than
  `notice_lag_ms` plus the dependency wait after it (a failure waits behind an earlier
  period still open on another upstream until that wait runs out). A failed outcome then
  owed a skip record; with one upstream, a succeeded one owed a run;
- with several upstreams, a succeeded outcome after the last record, when every other
  upstream had a succeeded outcome since that record, not after it, decided surely
  before it (a final event `notice_lag_ms` earlier): the step should have run. Checked
  while fewer than `keep_upstream_outcomes` outcomes wait (the ledger keeps no more).

A period of several upstreams covered by a later record cannot be told from one the
ledger folded into it, and is not checked. Jobs with a schedule and upstreams have one
run per fire time (``missing_firing``), ``waiting`` until its upstreams are done
(``not_final`` past the dependency wait).

Start lateness is ``running.happened_ms - scheduled_ms`` of first attempts (retries and
reruns start late on purpose), backfill runs excluded (created long after their time):
the start the worker reported, as the ledger vouched for it (no earlier than the grant
and the start time, no later than the record ``at_ms``), else the record itself.

Memory: per run, one small object with bit sets (seq numbers, attempts claimed and
started, who held and who ran each attempt: one shared worker id string and a bit set in
the common case); per job its timeline, its firings, 16 bytes per final event of a
non-manual run (the outcomes it notifies) and, for a ``forbid`` job, 16 bytes per start
of a run of its schedule; entries only for runs started more than once or whose claims
ended without a start. Reports are judged as they come and not kept (but the findings'
keys, to report each execution once, up to 100,000).
"""

from __future__ import annotations

import bisect
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, Literal, TextIO, TypeAlias

from schemas.records import (
    FINAL_STATES,
    TRANSITIONS,
    JobEvent,
    LedgerInput,
    RunEvent,
    RunFinished,
    RunStarted,
)
from schemas.spec import DstPolicy, JobSpec, Schedule
from streams.core.ids import iso_utc, scheduled_run_id
from streams.core.ledger.decision import WITHDRAWN
from streams.core.percentile import nearest_rank_sorted
from streams.core.schedule import fires_between

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

ViolationKind: TypeAlias = Literal[
    "duplicate_run",
    "missing_firing",
    "illegal_transition",
    "double_claim",
    "double_start",
    "not_final",
    "unsanctioned_execution",
    "overlapping_attempts",
    "missing_period",
    "undecodable",
]
KINDS: Final[tuple[ViolationKind, ...]] = (
    "duplicate_run",
    "missing_firing",
    "illegal_transition",
    "double_claim",
    "double_start",
    "not_final",
    "unsanctioned_execution",
    "overlapping_attempts",
    "missing_period",
    "undecodable",
)
Source: TypeAlias = Literal["run-events", "job-log"]

# Transitions into `due` or `waiting` from these begin a new attempt (a retry, a rerun,
# a revival of a firing withdrawn ahead of its time).
_NEW_ATTEMPT_FROM: Final = frozenset({"retrying", *FINAL_STATES})
_NEW_ATTEMPT_INTO: Final = frozenset({"due", "waiting"})
_LIVE_AT_CREATION: Final = frozenset({"due", "waiting"})
_FIRST_STATES: Final = TRANSITIONS[None]
# Concurrency policies under which a firing is not created beside a live run.
_EXCLUSIVE: Final = frozenset({"forbid", "replace"})

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 60 * MINUTE_MS


@dataclass(frozen=True, slots=True)
class AuditConfig:
    # Firings due less than this before the newest event are not checked (in flight).
    safety_margin_ms: int = 2 * MINUTE_MS
    # The ledger's catch-up window: older misfires may be decided without a record.
    catchup_window_ms: int = 24 * HOUR_MS
    # The ledger's cap on the firings one late proposal records.
    max_catchup_runs: int = 1000
    # not_final: the ledger's grace after a timeout, one claim round, slack on top.
    timeout_grace_ms: int = 30_000
    claim_timeout_ms: int = 30_000
    dependency_wait_ms: int = 24 * HOUR_MS
    final_slack_ms: int = 10 * MINUTE_MS
    unknown_spec_allowance_ms: int = 24 * HOUR_MS + 10 * MINUTE_MS
    # The replay starts inside the log (--from): a run first seen mid-life is accepted.
    partial: bool = False
    # overlapping_attempts: how far a worker's clock (a RunFinished's at_ms) may be ahead
    # of the time the ledger recorded another attempt's start.
    clock_tolerance_ms: int = 1_000
    # missing_period: the most an upstream's final event may precede the step's ledger
    # deciding its notice (the upstream's ledger lag, the link of a new step).
    notice_lag_ms: int = 2 * MINUTE_MS
    # The ledger keeps this many upstream outcomes per job.
    keep_upstream_outcomes: int = 256
    # Violations kept with their details (all are counted).
    keep_violations: int = 10_000


@dataclass(frozen=True, slots=True)
class Violation:
    kind: ViolationKind
    job_id: str
    run_id: str  # "" when the violation concerns the job (or an undecodable record)
    partition: int
    offset: int
    detail: str
    source: Source = "run-events"  # the topic of partition/offset


@dataclass(frozen=True, slots=True)
class Lateness:
    """Start lateness of first attempts, in ms."""

    count: int
    p50_ms: int | None
    p99_ms: int | None
    max_ms: int | None
    # (bucket label, count), buckets in seconds
    histogram: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class AuditReport:
    jobs: int
    runs: int
    events: int  # decoded records (run and job events)
    job_events: int
    undecodable: int
    live_runs: int  # not final at the end
    # jobs with runs but no `upserted` in the replay, or a schedule that cannot be evaluated
    unchecked_jobs: int
    expected_firings: int  # fire times checked for a record
    excused_firings: int  # missing, but older than the catch-up window of their decision
    counts: dict[ViolationKind, int]
    violations: tuple[Violation, ...]  # the first `keep_violations`, in the order found
    lateness: Lateness
    now_ms: int | None  # the newest event time
    reports: int = 0  # worker reports (starts, finishes) judged against run-events
    unjudged_reports: int = 0  # undecided yet, or about runs the replay cannot judge
    reports_note: str = ""  # why no worker reports were read, if none were
    dag_steps: int = 0  # DAG steps whose periods were checked
    dag_periods: int = 0  # their records (runs and skips) in the replay

    @property
    def total_violations(self) -> int:
        return sum(self.counts.values())

    @property
    def clean(self) -> bool:
        return self.total_violations == 0

    def of_kind(self, kind: ViolationKind) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]


def allowance_ms(spec: JobSpec, config: AuditConfig = AuditConfig(), released: int = 0) -> int:
    """How long a run of this job may legitimately stay not final (`released`: claims
    given back before their start, each dispatched again)."""
    retry = spec.retry
    attempts = max(1, retry.max_attempts)
    per_attempt = int(spec.timeout_s * 1000) + config.timeout_grace_ms + config.claim_timeout_ms
    backoff_s, total_backoff_s = retry.backoff_s, 0.0
    for _ in range(attempts - 1):
        total_backoff_s += min(backoff_s, retry.max_backoff_s)
        backoff_s = min(backoff_s * retry.backoff_multiplier, retry.max_backoff_s)
    allowance = (
        (attempts + max(0, released)) * per_attempt
        + int(2 * total_backoff_s * 1000)
        + config.final_slack_ms
    )
    if spec.depends_on:
        allowance += config.dependency_wait_ms
    return allowance


# Seq numbers and attempts are tracked as bits of an int; beyond this (never in practice)
# they are not tracked, so a forged huge number cannot make an enormous int.
_MAX_TRACKED: Final = 4096


def _bit(n: int) -> int:
    return 1 << n if 0 <= n < _MAX_TRACKED else 0


# Per (attempt, worker): the worker held the attempt (a `dispatched` event by it) / ran it
# (a `running` event by it, or its outcome accepted while it held the claim).
_HELD: Final = 1
_RAN: Final = 2
# A run's grants: None (no claim yet); one worker id (every claim of the run went to
# it), its flags per attempt in `gbits` (2 bits per attempt); or, once a second worker
# appears, a tuple of (attempt, worker, flags), the latest holder of an attempt last.
_Grants: TypeAlias = str | tuple[tuple[int, str, int], ...] | None
# Worker reports whose at_ms is the report's time, not the execution's end.
_END_UNKNOWN: Final = ("lost",)
# Findings about executions remembered to report each one once.
_MAX_FLAGGED: Final = 100_000
# How the ledger ended a claim without a start: given back (the ledger relies on the
# attempt never having started: dispatched again), cancelled, or lost (a verdict, the
# timeout backstop, or the holder's own report without an exit code): the attempt may
# have run until then.
_GIVEN_BACK: Final = 0
_CANCELLED: Final = 1
_LOST: Final = 2
_ENDED_HOW: Final = ("given back", "cancelled", "ended without a start (lost or timed out)")


class _Run:
    __slots__ = (
        "attempt",
        "claimed",
        "gbits",
        "grants",
        "job_id",
        "offset",
        "partition",
        "released",
        "scheduled_ms",
        "seq",
        "seqs",
        "since_ms",
        "started",
        "state",
    )

    def __init__(self, event: RunEvent, seq: int, partition: int, offset: int) -> None:
        self.job_id = event.job_id
        self.scheduled_ms = event.scheduled_ms
        self.state = event.state
        self.attempt = event.attempt
        self.seq = seq
        self.seqs = _bit(seq)  # bit set of the seq numbers seen
        self.claimed = 0  # bit set of attempts with a `dispatched` event
        self.started = 0  # bit set of attempts with a `running` event
        self.since_ms = event.at_ms  # creation, or the latest rerun
        self.released = 0  # claims given back before their start (dispatched -> due)
        self.grants: _Grants = None
        self.gbits = 0
        self.partition = partition
        self.offset = offset


@dataclass(slots=True)
class _Job:
    job_id: str
    partition: int
    offset: int  # the newest event of the job (where job-level violations point)
    # (kind, at_ms, spec) in log order
    timeline: list[tuple[str, int, JobSpec | None]] = field(default_factory=list)
    spec: JobSpec | None = None  # the newest upserted spec
    # scheduled_ms -> (run_id, created at_ms, partition, offset) of non-manual runs
    fires: dict[int, tuple[str, int, int, int]] = field(default_factory=dict)
    live: int = 0  # runs seen that are not final
    # Of those, the runs claimed and not started (`dispatched`): the ledger cancels such a
    # run only once its holder answers the stop order, so `replace` creates the new run
    # beside them.
    claimed: int = 0
    forbid: bool = False  # the newest spec's concurrency is `forbid`
    # (scheduled_ms, at_ms) of every final transition of a non-manual run, at_ms negated
    # minus one when not succeeded: the outcomes it notifies to its dependents.
    finals: array[int] = field(default_factory=lambda: array("q"))
    # (scheduled_ms, at_ms, attempt) of every `running` event while the job forbids
    # concurrency, the attempt negated for a run not of its schedule (the ledger applies
    # the policy to those only).
    starts: array[int] = field(default_factory=lambda: array("q"))
    # Once sealed: the starts of runs of its schedule in time order, with their scheduled
    # times; and every start ordered by (scheduled_ms, attempt): scheduled times, marked
    # attempts, starts.
    sealed: tuple[array[int], array[int], array[int], array[int], array[int]] | None = None


_BUCKETS: Final[tuple[tuple[str, int], ...]] = (
    # (label, upper bound in ms, exclusive)
    ("< 0 s", 0),
    ("0-0.1 s", 100),
    ("0.1-0.5 s", 500),
    ("0.5-1 s", 1_000),
    ("1-2 s", 2_000),
    ("2-5 s", 5_000),
    ("5-10 s", 10_000),
    ("10-30 s", 30_000),
    ("30-60 s", 60_000),
    ("1-5 min", 300_000),
)
_LAST_BUCKET: Final = ">= 5 min"


class Auditor:
    """Accumulates the audit of one replay. Not thread-safe; one per replay."""

    def __init__(self, config: AuditConfig = AuditConfig()) -> None:
        self.config = config
        self._runs: dict[str, _Run] = {}
        self._jobs: dict[str, _Job] = {}
        self._counts: Counter[ViolationKind] = Counter({k: 0 for k in KINDS})
        self._violations: list[Violation] = []
        self._lateness = array("q")
        self._events = 0
        self._job_events = 0
        self._undecodable = 0
        self._last_ms: int | None = None
        self._workers: dict[str, str] = {}  # one string object per worker id
        # Runs first seen mid-life -> their first attempt seen (reports up to it unjudged).
        self._midlife: dict[str, int] = {}
        self._flagged: set[tuple[str, str, int, str]] = set()
        # Runs started more than once (retries, reruns) -> (attempt, at_ms, ...) of the
        # `running` events after the first: the starts of later attempts.
        self._later_starts: dict[str, tuple[int, ...]] = {}
        # Runs with claims that ended without a start -> (attempt, worker, how, at_ms).
        self._ended: dict[str, list[tuple[int, str, int, int]]] = {}
        self._reports = 0
        self._unjudged = 0
        self._reports_note = ""
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
            job = self._jobs[event.job_id] = _Job(event.job_id, partition, offset)
        else:
            job.partition, job.offset = partition, offset
        if isinstance(event, JobEvent):
            self._job_events += 1
            job.timeline.append((event.kind, event.at_ms, event.spec))
            if event.kind == "upserted" and event.spec is not None:
                job.spec = event.spec
                job.forbid = event.spec.concurrency == "forbid"
            return
        self._run_event(job, event, partition, offset)

    def _record_after_seal(self, event: RunEvent | JobEvent, partition: int, offset: int) -> None:
        raise RuntimeError("Auditor.record after Auditor.report: run-events come first")

    def undecodable(self, partition: int, offset: int, error: str, key: bytes | None) -> None:
        """A record that is not a run-events record: counted and reported, never fatal."""
        self._undecodable += 1
        job_id = key.decode("utf-8", "replace") if key else ""
        self._violate("undecodable", job_id, "", partition, offset, error)

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
        if not decided:
            self._unjudged += 1
            return
        job = self._jobs.get(inp.job_id)
        run = self._runs.get(inp.run_id)
        first_seen = self._midlife.get(inp.run_id)
        if (
            job is None
            or (run is None and (job.spec is None or self.config.partial))
            or (first_seen is not None and inp.attempt <= first_seen)
        ):
            self._unjudged += 1  # the replay does not know this run's life
            return
        worker = inp.worker_id
        flags = 0 if run is None else _flags(run.grants, run.gbits, inp.attempt, worker)
        if run is not None and not flags & _RAN and _holds(run, inp.attempt, worker):
            self._unjudged += 1  # the holder of a claim still open: its start in flight
            return
        self._reports += 1
        if flags & _RAN:
            if isinstance(inp, RunFinished) and run is not None:
                self._overlap(job, run, inp, partition, offset)
            return
        if isinstance(inp, RunFinished) and inp.exit_code is None:
            return  # killed before it ran, or never started: not an execution
        what = "started" if isinstance(inp, RunStarted) else f"exited {inp.exit_code}"
        if run is None:
            why = f"run-events has no run {inp.run_id}"
        elif flags & _HELD:
            ended = [x for x in self._ended.get(inp.run_id, ()) if x[:2] == (inp.attempt, worker)]
            how, at = ended[-1][2:] if ended else (None, 0)
            if how == _CANCELLED and isinstance(inp, RunFinished):
                return  # a run stopped by its cancel ends after it
            if how in (_CANCELLED, _LOST) and inp.at_ms <= at + self.config.clock_tolerance_ms:
                return  # under way before the ledger ended the claim, which covers it
            why = (
                f"it held the attempt, but the ledger never recorded its start: the claim was "
                f"{_ENDED_HOW[how]} at {iso_utc(at)}"
                if how is not None
                else f"it held the attempt, but the ledger never recorded its start (the run "
                f"is {run.state}, attempt {run.attempt})"
            )
        else:
            holders = _holders(run.grants, run.gbits, inp.attempt)
            why = f"it never held the attempt (held by {', '.join(holders) or 'nobody'})"
        if not self._once("unsanctioned", inp):
            return
        self._violate(
            "unsanctioned_execution",
            inp.job_id,
            inp.run_id,
            partition,
            offset,
            f"worker {worker} {what} attempt {inp.attempt}: {why}",
            "job-log",
        )

    def _once(self, kind: str, inp: RunFinished | RunStarted) -> bool:
        """Whether this is the first finding of `kind` about this execution."""
        key = (kind, inp.run_id, inp.attempt, inp.worker_id)
        if key in self._flagged:
            return False
        if len(self._flagged) < _MAX_FLAGGED:
            self._flagged.add(key)
        return True

    def no_reports(self, why: str) -> None:
        """The worker reports could not be read (said in the report)."""
        self._reports_note = why

    def _violate(
        self,
        kind: ViolationKind,
        job_id: str,
        run_id: str,
        partition: int,
        offset: int,
        detail: str,
        source: Source = "run-events",
    ) -> None:
        self._counts[kind] += 1
        if len(self._violations) < self.config.keep_violations:
            self._violations.append(
                Violation(kind, job_id, run_id, partition, offset, detail, source)
            )

    # -- runs ---------------------------------------------------------------------------------
    def _run_event(self, job: _Job, e: RunEvent, partition: int, offset: int) -> None:
        head, sep, tail = e.event_id.rpartition("#")
        if not sep or head != e.run_id or not tail.isdigit():
            self._violate(
                "illegal_transition",
                e.job_id,
                e.run_id,
                partition,
                offset,
                f"malformed event id {e.event_id!r} (expected '{e.run_id}#<seq>')",
            )
            return
        seq = int(tail)
        state, attempt = e.state, e.attempt
        # A rerun of a skipped run (seq 0) is seq 1 too, but with attempt 2.
        creation = seq <= 1 and state in _FIRST_STATES and attempt == 1
        run = self._runs.get(e.run_id)
        if run is None:
            self._create(job, e, seq, creation, partition, offset)
            return
        attempt_bit = 1 << attempt if 0 <= attempt < _MAX_TRACKED else 0
        seq_bit = 1 << seq if 0 <= seq < _MAX_TRACKED else 0
        kind: ViolationKind | None = None
        detail = ""
        if state == "dispatched" and run.claimed & attempt_bit:
            kind, detail = "double_claim", f"attempt {attempt} dispatched again (seq {seq})"
        elif state == "running" and run.started & attempt_bit:
            kind, detail = "double_start", f"attempt {attempt} started again (seq {seq})"
        elif creation:
            kind, detail = "duplicate_run", f"created again ({state}, seq {seq})"
        elif run.seqs & seq_bit:
            kind, detail = "duplicate_run", f"seq {seq} repeated ({state})"
        elif seq < run.seq:
            kind = "illegal_transition"
            detail = f"out-of-order seq {seq} after seq {run.seq} ({state})"
        elif seq > run.seq + 1:
            kind = "illegal_transition"
            detail = f"seq gap: {run.seq} -> {seq} ({run.state} -> {state})"
        elif seq == run.seq + 1:
            before = run.state
            if state not in TRANSITIONS.get(before, ()) or attempt != (
                run.attempt + 1
                if state in _NEW_ATTEMPT_INTO and before in _NEW_ATTEMPT_FROM
                else run.attempt
            ):
                kind, detail = "illegal_transition", self._check_transition(run, e)
        if kind is not None:
            self._violate(kind, e.job_id, e.run_id, partition, offset, detail)
        if state == "dispatched":
            run.claimed |= attempt_bit
            grants, worker = run.grants, e.worker_id
            if grants is None and attempt_bit and worker:  # the common first claim
                run.grants = self._workers.get(worker) or self._intern(worker)
                run.gbits = _HELD << (2 * attempt)
            elif grants == worker and attempt_bit:
                run.gbits |= _HELD << (2 * attempt)
            else:
                self._grant(run, attempt, worker, _HELD)
        elif state == "running":
            if run.started and not run.started & attempt_bit:  # a later attempt's start
                later = self._later_starts
                later[e.run_id] = (*later.get(e.run_id, ()), attempt, e.at_ms)
            run.started |= attempt_bit
            if run.grants == e.worker_id and attempt_bit:
                run.gbits |= _RAN << (2 * attempt)
            else:
                self._grant(run, attempt, e.worker_id, _RAN)
            if job.forbid:
                mark = attempt if e.trigger == "schedule" else -attempt
                job.starts.extend((e.scheduled_ms, e.at_ms, mark))
            if kind is None and attempt == 1 and e.trigger != "backfill":
                self._lateness.append(e.happened_ms - e.scheduled_ms)
        else:
            if state in FINAL_STATES and _outcome(e):
                at = e.at_ms
                job.finals.extend((e.scheduled_ms, at if state == "succeeded" else -at - 1))
            if kind is None and run.state == "dispatched":
                self._claim_ended(run, e, attempt_bit)
        run.seqs |= seq_bit
        if seq > run.seq:
            if run.state in FINAL_STATES:
                if state not in FINAL_STATES:
                    job.live += 1
                    run.since_ms = e.at_ms  # a rerun, a revival: a new life
            elif state in FINAL_STATES:
                job.live -= 1
            job.claimed += (state == "dispatched") - (run.state == "dispatched")
            run.seq, run.state, run.attempt = seq, state, attempt
            run.partition, run.offset = partition, offset

    def _create(
        self, job: _Job, e: RunEvent, seq: int, creation: bool, partition: int, offset: int
    ) -> None:
        run = self._runs[e.run_id] = _Run(e, seq, partition, offset)
        if e.trigger != "manual":
            other = job.fires.get(e.scheduled_ms)
            if other is None:
                job.fires[e.scheduled_ms] = (e.run_id, e.at_ms, partition, offset)
            elif other[0] != e.run_id:
                self._violate(
                    "duplicate_run",
                    e.job_id,
                    e.run_id,
                    partition,
                    offset,
                    f"a second run for {iso_utc(e.scheduled_ms)}: {other[0]!r} exists",
                )
        if e.state in FINAL_STATES:
            if _outcome(e):
                ok = e.state == "succeeded"
                job.finals.extend((e.scheduled_ms, e.at_ms if ok else -e.at_ms - 1))
        else:
            # `replace` stops the live runs first: cancelled at once, but for those claimed
            # and not started, which the ledger cancels when their holder answers.
            replace = job.spec is not None and job.spec.concurrency == "replace"
            unstopped = job.live - job.claimed if replace else job.live
            if (
                creation
                and unstopped
                and e.trigger == "schedule"
                and e.state in _LIVE_AT_CREATION
                and job.spec is not None
                and job.spec.concurrency in _EXCLUSIVE
            ):
                self._violate(
                    "overlapping_attempts",
                    e.job_id,
                    e.run_id,
                    partition,
                    offset,
                    f"created while {unstopped} other run(s) of the job were live "
                    f"(concurrency {job.spec.concurrency})",
                )
            job.live += 1
            job.claimed += e.state == "dispatched"
        if e.state == "dispatched":
            run.claimed = _bit(e.attempt)
            self._grant(run, e.attempt, e.worker_id, _HELD)
        elif e.state == "running":
            run.started = _bit(e.attempt)
            self._grant(run, e.attempt, e.worker_id, _RAN)
            if job.forbid:
                mark = e.attempt if e.trigger == "schedule" else -e.attempt
                job.starts.extend((e.scheduled_ms, e.at_ms, mark))
        if creation and (seq == 0) == (e.state == "skipped") and e.attempt == 1:
            return
        self._midlife[e.run_id] = e.attempt  # its earlier attempts are not in the replay
        if self.config.partial and seq > 1:
            if e.state == "running":  # the run began before the replayed range
                self._start_lateness(e)
            return
        self._violate(
            "illegal_transition",
            e.job_id,
            e.run_id,
            partition,
            offset,
            f"first event is {e.state} with seq {seq}, attempt {e.attempt}: a run begins "
            "with due or waiting (seq 1) or skipped (seq 0), attempt 1",
        )

    @staticmethod
    def _check_transition(run: _Run, e: RunEvent) -> str:
        """Why run.state -> e.state is illegal, or "" if it is legal."""
        if e.state not in TRANSITIONS.get(run.state, frozenset()):
            return f"{run.state} -> {e.state} is not a legal transition"
        if e.state in _NEW_ATTEMPT_INTO and run.state in _NEW_ATTEMPT_FROM:
            expected = run.attempt + 1
        else:
            expected = run.attempt
        if e.attempt != expected:
            return (
                f"{run.state} -> {e.state} with attempt {e.attempt}, expected {expected} "
                f"(was {run.attempt})"
            )
        return ""

    def _start_lateness(self, e: RunEvent) -> None:
        if e.attempt == 1 and e.trigger != "backfill":
            self._lateness.append(e.happened_ms - e.scheduled_ms)

    # -- who held and ran each attempt ----------------------------------------------------------
    def _claim_ended(self, run: _Run, e: RunEvent, attempt_bit: int) -> None:
        """A claim that ends without a `running` event."""
        if e.exit_code is not None:
            # The holder's outcome, accepted while it held the claim: it ran the attempt
            # (its start report was lost or came late).
            self._grant(run, e.attempt, e.worker_id, _RAN)
            return
        if e.state == "due":
            # Given back before the start: the attempt may be claimed again.
            run.claimed &= ~attempt_bit
            run.released += 1
            how = _GIVEN_BACK
        else:
            how = _CANCELLED if e.state == "cancelled" else _LOST
        holders = _holders(run.grants, run.gbits, e.attempt)
        worker = holders[-1] if holders else e.worker_id
        ended = self._ended.setdefault(e.run_id, [])
        ended.append((e.attempt, worker, how, e.at_ms))

    def _intern(self, worker: str) -> str:
        """One string object per worker id, shared by the runs it held."""
        return self._workers.setdefault(worker, worker)

    def _grant(self, run: _Run, attempt: int, worker: str, flag: int) -> None:
        if not worker or not 0 < attempt < _MAX_TRACKED:
            return
        worker = self._intern(worker)
        grants = run.grants
        if grants is None:
            run.grants, run.gbits = worker, flag << (2 * attempt)
        elif grants is worker:
            run.gbits |= flag << (2 * attempt)
        else:
            if isinstance(grants, str):  # a second worker: spell the grants out
                bits = run.gbits
                entries = [
                    (a, grants, (bits >> (2 * a)) & 3)
                    for a in range(1, bits.bit_length() // 2 + 1)
                    if (bits >> (2 * a)) & 3
                ]
            else:
                entries = list(grants)
            found = [x for x in entries if x[0] == attempt and x[1] == worker]
            merged = (attempt, worker, flag | (found[0][2] if found else 0))
            if found and not flag & _HELD:
                entries[entries.index(found[0])] = merged
            else:  # the latest holder of the attempt goes last
                entries = [x for x in entries if x not in found] + [merged]
            run.grants, run.gbits = tuple(entries), 0

    def _seal(self) -> None:
        """Run-events are complete: index what the reports are judged against."""
        self._sealed = True
        self.record = self._record_after_seal  # type: ignore[method-assign]
        for job in self._jobs.values():
            if not job.starts:
                continue
            raw = job.starts
            n = len(raw) // 3
            by_run = sorted(range(n), key=lambda i: (raw[3 * i], raw[3 * i + 2]))
            by_time = sorted(
                (i for i in range(n) if raw[3 * i + 2] > 0), key=lambda i: raw[3 * i + 1]
            )
            job.sealed = (
                array("q", (raw[3 * i + 1] for i in by_time)),
                array("q", (raw[3 * i] for i in by_time)),
                array("q", (raw[3 * i] for i in by_run)),
                array("q", (raw[3 * i + 2] for i in by_run)),
                array("q", (raw[3 * i + 1] for i in by_run)),
            )
            job.starts = array("q")

    def _overlap(self, job: _Job, run: _Run, inp: RunFinished, partition: int, offset: int) -> None:
        """A sanctioned execution still going, by its worker's word, after the ledger
        started a later attempt of the run or a later run of a `forbid` job."""
        if inp.error.startswith(_END_UNKNOWN):
            return
        end = inp.at_ms - self.config.clock_tolerance_ms
        later: tuple[int, int] | None = None  # (start, attempt)
        starts = self._later_starts.get(inp.run_id, ())
        for i in range(0, len(starts), 2):
            attempt, start = starts[i], starts[i + 1]
            if attempt > inp.attempt and start < end and (later is None or start < later[0]):
                later = (start, attempt)
        if later is not None:
            what = f"attempt {later[1]} started at {iso_utc(later[0])}"
        else:
            other = _other_start(job, run.scheduled_ms, inp.attempt, end)
            if other is None:
                return
            what = f"run of the job for {iso_utc(other[1])} (concurrency forbid) started at "
            what += iso_utc(other[0])
        if not self._once("overlap", inp):
            return
        self._violate(
            "overlapping_attempts",
            inp.job_id,
            inp.run_id,
            partition,
            offset,
            f"attempt {inp.attempt} on {inp.worker_id} ended at {iso_utc(inp.at_ms)} by its "
            f"report, but the ledger's {what}",
            "job-log",
        )

    # -- the end --------------------------------------------------------------------------
    def finish(self, now_ms: int | None = None) -> AuditReport:
        """The checks that need the whole replay, and the report.

        `now_ms`: the newest time the reader saw (e.g. timestamps of records it skipped);
        the newest event time is used when later."""
        if self._finished:
            raise RuntimeError("Auditor.finish may be called once")
        self._finished = True
        now = self._last_ms
        if now_ms is not None and (now is None or now_ms > now):
            now = now_ms
        expected = excused = unchecked = steps = periods = 0
        if now is not None:
            until = now - self.config.safety_margin_ms
            for job in self._jobs.values():
                if job.spec is None:
                    unchecked += 1 if job.fires else 0
                    continue
                if any(s is not None and s.depends_on for _, _, s in job.timeline):
                    found = self._missing_periods(job, until)
                    if found is not None:
                        steps += 1
                        periods += found
                try:
                    e, x = self._missing_firings(job, until)
                except ValueError:  # a schedule this code cannot evaluate (ScheduleError)
                    unchecked += 1
                    continue
                expected += e
                excused += x
        live = self._not_final(now)
        return AuditReport(
            jobs=len(self._jobs),
            runs=len(self._runs),
            events=self._events,
            job_events=self._job_events,
            undecodable=self._undecodable,
            live_runs=live,
            unchecked_jobs=unchecked,
            expected_firings=expected,
            excused_firings=excused,
            counts=dict(self._counts),
            violations=tuple(self._violations),
            lateness=_lateness(self._lateness),
            now_ms=now,
            reports=self._reports,
            unjudged_reports=self._unjudged,
            reports_note=self._reports_note,
            dag_steps=steps,
            dag_periods=periods,
        )

    def _missing_firings(self, job: _Job, until: int) -> tuple[int, int]:
        """Check the job's due fire times; returns (checked, excused)."""
        cfg = self.config
        # The decision that moved past t: the earliest-made creation scheduled after t.
        times = sorted(job.fires)
        after_min: list[tuple[int, int, int]] = [(0, 0, 0)] * len(times)
        best: tuple[int, int, int] | None = None
        for i in range(len(times) - 1, -1, -1):
            _, at, partition, offset = job.fires[times[i]]
            if best is None or at < best[0]:
                best = (at, partition, offset)
            after_min[i] = best
        batch = Counter(at for _, at, _, _ in job.fires.values())
        checked = excused = 0
        for start, end, schedule, dst in _active_intervals(job.timeline, until):
            for t in _fire_times(schedule, start, end, dst):
                checked += 1
                if t in job.fires:
                    continue
                i = bisect.bisect_right(times, t)
                if i < len(times):
                    at, partition, offset = after_min[i]
                    if t <= at - cfg.catchup_window_ms or batch[at] >= cfg.max_catchup_runs:
                        excused += 1
                        continue
                    why = f"decided past it at {iso_utc(at)}"
                else:
                    partition, offset = job.partition, job.offset
                    why = "no later decision"
                self._violate(
                    "missing_firing",
                    job.job_id,
                    "",
                    partition,
                    offset,
                    f"no run for the firing at {iso_utc(t)} (active since {iso_utc(start)}; {why})",
                )
        return checked, excused

    def _missing_periods(self, job: _Job, until: int) -> int | None:
        """Check the lives of a DAG step (see the module docstring); returns the number
        of its records, or None if it never was a step in the replay."""
        cfg = self.config
        lag = cfg.notice_lag_ms
        lives = _step_lives(job.timeline, job.fires, until)
        if not lives:
            return None
        # The step's records by scheduled time.
        records = sorted((t, at) for t, (_, at, _, _) in job.fires.items())
        times = [t for t, _ in records]
        for start, end, since, fired, upstreams in lives:
            # Outcomes after the life's starting watermark: (scheduled, final at, ok, upstream).
            outcomes: list[tuple[int, int, bool, str]] = []
            for upstream in upstreams:
                other = self._jobs.get(upstream)
                finals = other.finals if other is not None else ()
                for i in range(0, len(finals), 2):
                    if finals[i] > since:
                        at = finals[i + 1]
                        ok = at >= 0
                        outcomes.append((finals[i], at if ok else -at - 1, ok, upstream))
            # When each record was made, as comparable with an outcome's final time: with
            # one upstream, the time of its first final event for the record's time (the
            # notices of one upstream are decided in the order of its final events);
            # with several, when the step's ledger made it, less the notice lag. Then the
            # earliest of those at or after each record.
            if len(upstreams) == 1:
                first: dict[int, int] = {}
                for scheduled, at, _, _ in outcomes:
                    first[scheduled] = min(at, first.get(scheduled, at))
                made = [first.get(t, -1) for t, _ in records]  # -1: before anything
                slack = 1  # strictly before
            else:
                # A failure waits behind an earlier period still open on another upstream
                # until that period's dependency wait runs out.
                made = [at for _, at in records]
                slack = lag + cfg.dependency_wait_ms
            for i in range(len(made) - 2, -1, -1):
                made[i] = min(made[i], made[i + 1])
            flagged: set[tuple[str, int]] = set()
            for scheduled, at, ok, upstream in outcomes:
                if not start + lag < at < end - max(lag, slack) or scheduled in job.fires:
                    continue
                i = bisect.bisect_left(times, scheduled)
                if i < len(times) and at + slack > made[i]:
                    continue  # a record at or after it may have been made first
                if ok and len(upstreams) > 1:
                    continue  # whether the others had succeeded: see below
                if (upstream, scheduled) in flagged:
                    continue
                flagged.add((upstream, scheduled))
                due = "a run" if ok else "a skip record"
                self._missing_period(
                    job,
                    upstream,
                    scheduled,
                    f"upstream {upstream}'s run for {iso_utc(scheduled)} "
                    f"{'succeeded' if ok else 'did not succeed'} (final at {iso_utc(at)}) "
                    f"while {job.job_id}'s last record was older: {due} was due for it, "
                    "and there is no record at or after it made before its notice",
                )
            if flagged or len(upstreams) < 2:
                continue
            # Several upstreams: the step runs when every one succeeded since its watermark.
            tail = [o for o in outcomes if o[0] > fired]
            if not all(o[2] for o in tail) or len(tail) >= cfg.keep_upstream_outcomes:
                continue
            for scheduled, at, _, upstream in sorted(tail, reverse=True):
                if not start + lag < at < end - lag:
                    continue
                if all(
                    other == upstream
                    or any(
                        o[3] == other and o[0] <= scheduled and start + lag < o[1] <= at - lag
                        for o in tail
                    )
                    for other in upstreams
                ):
                    self._missing_period(
                        job,
                        upstream,
                        scheduled,
                        f"every upstream of {job.job_id} succeeded in ({iso_utc(fired)}, "
                        f"{iso_utc(scheduled)}], the last being {upstream} (final at "
                        f"{iso_utc(at)}), but the step has no record at or after it",
                    )
                    break
        return len(job.fires)

    def _missing_period(self, job: _Job, upstream: str, scheduled: int, detail: str) -> None:
        run_id = scheduled_run_id(upstream, scheduled)
        run = self._runs.get(run_id)
        partition, offset = (run.partition, run.offset) if run else (job.partition, job.offset)
        self._violate("missing_period", job.job_id, run_id, partition, offset, detail)

    def _not_final(self, now: int | None) -> int:
        live = 0
        for run_id, run in self._runs.items():
            if run.state in FINAL_STATES:
                continue
            live += 1
            if now is None:
                continue
            job = self._jobs.get(run.job_id)
            spec = job.spec if job is not None else None
            limit = (
                allowance_ms(spec, self.config, run.released)
                if spec is not None
                else self.config.unknown_spec_allowance_ms
            )
            age = now - max(run.since_ms, run.scheduled_ms)
            if age > limit:
                self._violate(
                    "not_final",
                    run.job_id,
                    run_id,
                    run.partition,
                    run.offset,
                    f"still {run.state} (attempt {run.attempt}) {age / 1000:.0f} s after "
                    f"{'its creation' if run.since_ms >= run.scheduled_ms else 'its time'}; "
                    f"allowed {limit / 1000:.0f} s",
                )
        return live


def _outcome(e: RunEvent) -> bool:
    """A final event the ledger tells a job's dependents of: not a manual run's, nor a
    firing withdrawn ahead of its time (it may be revived; its time joins the dependents'
    next period)."""
    return e.trigger != "manual" and not (e.state == "cancelled" and e.reason in WITHDRAWN)


def _other_start(job: _Job, scheduled: int, attempt: int, until: int) -> tuple[int, int] | None:
    """(start, scheduled time) of a run of a `forbid` job's schedule for a time after
    `scheduled` that the ledger started after its `attempt` and before `until`. Under
    `forbid` the ledger starts a firing only once every run is final on its view; a rerun
    (of an earlier time) is the operator's and may run beside a later run."""
    if job.sealed is None:
        return None
    at, times, runs, attempts, starts = job.sealed
    i = bisect.bisect_left(runs, scheduled)
    own = None
    while i < len(runs) and runs[i] == scheduled:
        if abs(attempts[i]) == attempt:
            own = starts[i]
            break
        i += 1
    if own is None:
        return None  # its start is not on run-events: its outcome was accepted instead
    j = bisect.bisect_right(at, own)
    while j < len(at) and at[j] < until:
        if times[j] > scheduled:
            return at[j], times[j]
        j += 1
    return None


def _flags(grants: _Grants, gbits: int, attempt: int, worker: str) -> int:
    """What run-events says of (attempt, worker): _HELD and/or _RAN bits."""
    if grants is None:
        return 0
    if isinstance(grants, str):
        return (gbits >> (2 * attempt)) & 3 if grants == worker and attempt > 0 else 0
    return next((f for a, w, f in grants if a == attempt and w == worker), 0)


def _holders(grants: _Grants, gbits: int, attempt: int) -> list[str]:
    if grants is None:
        return []
    if isinstance(grants, str):
        return [grants] if attempt > 0 and (gbits >> (2 * attempt)) & _HELD else []
    return [w for a, w, f in grants if a == attempt and f & _HELD]


def _holds(run: _Run, attempt: int, worker: str) -> bool:
    """Whether `worker` holds the claim of the run's current attempt, not yet started."""
    if run.state != "dispatched" or run.attempt != attempt:
        return False
    holders = _holders(run.grants, run.gbits, attempt)
    return bool(holders) and holders[-1] == worker


def _step_lives(
    timeline: list[tuple[str, int, JobSpec | None]],
    fires: dict[int, tuple[str, int, int, int]],
    until: int,
) -> list[tuple[int, int, int, int, tuple[str, ...]]]:
    """The lives of a DAG step: (start, end, its watermark at the start and at the end,
    its upstreams), following the ledger's watermark: a registration sets it (never
    lower than a former life's), a schedule change too, a pause or deletion lowers it to
    its time, a resume raises it to its time, and each record (run or skip) at t raises
    it to t."""
    records = sorted((at, t) for t, (_, at, _, _) in fires.items())
    out: list[tuple[int, int, int, int, tuple[str, ...]]] = []
    spec: JobSpec | None = None
    start: int | None = None
    since = 0  # the watermark at the start of the open life
    fired: int | None = None
    registered = paused = deleted = False
    i = 0

    def step(s: JobSpec | None) -> tuple[str, ...]:
        return s.depends_on if s is not None and s.schedule is None else ()

    def advance(to: int) -> None:  # the records made before `to`
        nonlocal i, fired
        while i < len(records) and records[i][0] < to:
            fired = records[i][1] if fired is None else max(fired, records[i][1])
            i += 1

    def close(at: int) -> None:
        advance(at if at < until else records[-1][0] + 1 if records else at)
        if start is not None and fired is not None and step(spec) and start < min(at, until):
            out.append((start, min(at, until), since, fired, step(spec)))

    def begin(at: int) -> None:
        nonlocal start, since
        start, since = at, at if fired is None else fired

    for kind, at, new in timeline:
        advance(at)
        if kind == "upserted" and new is not None:
            if not registered or deleted:
                registered, paused, deleted = True, False, False
                spec = new
                fired = at if fired is None else max(fired, at)
                begin(at)
            else:
                assert spec is not None
                retimed = (new.schedule, new.dst) != (spec.schedule, spec.dst)
                if (step(new) != step(spec) or retimed) and not paused:
                    close(at)
                if retimed:
                    fired = at  # the ledger's watermark moves to a schedule change
                if (step(new) != step(spec) or retimed) and not paused:
                    begin(at)
                spec = new
        elif not registered or deleted:
            continue
        elif kind == "paused" and not paused:
            close(at)
            paused, start = True, None
            fired = at if fired is None else min(fired, at)
        elif kind == "resumed" and paused:
            paused = False
            fired = at if fired is None else max(fired, at)
            begin(at)
        elif kind == "deleted":
            if not paused:
                close(at)
            deleted, start = True, None
            fired = at if fired is None else min(fired, at)
    close(until)
    return out


def _active_intervals(
    timeline: list[tuple[str, int, JobSpec | None]], until: int
) -> list[tuple[int, int, Schedule, DstPolicy]]:
    """(after_ms exclusive, until_ms inclusive, schedule, dst) in which the job fires."""
    out: list[tuple[int, int, Schedule, DstPolicy]] = []
    spec: JobSpec | None = None
    start: int | None = None  # the open interval's start
    registered = paused = deleted = False

    def close(at: int) -> None:
        if start is not None and spec is not None:
            out.append((start, min(at, until), spec.schedule, spec.dst))

    for kind, at, new in timeline:
        if kind == "upserted" and new is not None:
            if not registered or deleted:
                registered, paused, deleted = True, False, False
                spec, start = new, at
            else:
                assert spec is not None
                if (new.schedule, new.dst) != (spec.schedule, spec.dst) and not paused:
                    close(at)
                    start = at
                spec = new
        elif not registered or deleted:
            continue
        elif kind == "paused" and not paused:
            close(at)
            paused, start = True, None
        elif kind == "resumed" and paused:
            paused, start = False, at
        elif kind == "deleted":
            if not paused:
                close(at)
            deleted, start = True, None
    close(until)
    return [i for i in out if i[0] < i[1]]


def _fire_times(schedule: Schedule, after: int, until: int, dst: DstPolicy) -> Iterator[int]:
    """fires_between, paged: any number of fire times without a list of them all."""
    page = 10_000
    while True:
        times = fires_between(schedule, after, until, dst, limit=page)
        yield from times
        if len(times) < page:
            return
        after = times[-1]


def _lateness(values: array[int]) -> Lateness:
    counts = [0] * (len(_BUCKETS) + 1)
    for v in values:
        for i, (_, bound) in enumerate(_BUCKETS):
            if v < bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    labels = [label for label, _ in _BUCKETS] + [_LAST_BUCKET]
    histogram = tuple(zip(labels, counts, strict=True))
    if not values:
        return Lateness(0, None, None, None, histogram)
    ordered = sorted(values)

    def rank(q: float) -> int:
        return int(nearest_rank_sorted(ordered, q))

    return Lateness(len(ordered), rank(0.50), rank(0.99), ordered[-1], histogram)


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


# -- text output ---------------------------------------------------------------------------
_KIND_WIDTH: Final = max(len(kind) for kind in KINDS)


def _seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def format_report(
    report: AuditReport,
    out: TextIO,
    *,
    topic: str = "run-events",
    limit: int = 20,
    job_log_topic: str = "job-log",
) -> None:
    """The human summary: counts, lateness with a histogram, the first violations."""
    w = out.write
    w(
        f"events   {report.events:,} ({report.job_events:,} job events), "
        f"undecodable {report.undecodable:,}\n"
    )
    w(f"jobs     {report.jobs:,}\n")
    w(f"runs     {report.runs:,} ({report.live_runs:,} not final at the end)\n")
    w(
        f"firings  {report.expected_firings:,} due firings checked, "
        f"{report.excused_firings:,} excused (beyond the catch-up window)"
    )
    if report.unchecked_jobs:
        w(f", {report.unchecked_jobs:,} jobs unchecked (no registration in the replay)")
    w("\n")
    if report.dag_steps:
        w(
            f"periods  {report.dag_periods:,} records of {report.dag_steps:,} DAG steps, "
            "their upstreams' outcomes checked\n"
        )
    if report.reports_note:
        w(f"reports  worker reports not checked: {report.reports_note}\n")
    else:
        w(
            f"reports  {report.reports:,} worker reports checked against the ledger's "
            f"record, {report.unjudged_reports:,} not judged (undecided, or runs the "
            "replay does not know)\n"
        )
    if report.now_ms is not None:
        w(f"newest   {iso_utc(report.now_ms)}\n")
    lat = report.lateness
    w(
        f"start lateness (first attempts, n={lat.count:,}): p50 {_seconds(lat.p50_ms)}, "
        f"p99 {_seconds(lat.p99_ms)}, max {_seconds(lat.max_ms)}\n"
    )
    if lat.count:
        used = [i for i, (_, count) in enumerate(lat.histogram) if count]
        shown_buckets = lat.histogram[used[0] : used[-1] + 1]  # without empty ends
        top = max(count for _, count in shown_buckets)
        for label, count in shown_buckets:
            bar = "#" * (0 if not count else max(1, round(40 * count / top)))
            w(f"  {label:>9} |{bar:<40}| {count:,}\n")
    total = report.total_violations
    w(f"violations {total:,}" + (" (clean)\n" if total == 0 else "\n"))
    for kind in KINDS:
        if report.counts.get(kind):
            w(f"  {kind:<{_KIND_WIDTH}} {report.counts[kind]:,}\n")
    if total:
        shown = report.violations[:limit]
        w(f"first {len(shown)} violations:\n")
        for v in shown:
            subject = v.run_id or v.job_id or "?"
            where = f"{job_log_topic if v.source == 'job-log' else topic}[{v.partition}]@{v.offset}"
            w(f"  {v.kind:<{_KIND_WIDTH}} {where}  {subject}: {v.detail}\n")
