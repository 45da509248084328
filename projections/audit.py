"""The audit of `run-events`: a pure checker of the exactly-once promises (design.md §4).

Feed it the events of the audit log in log order (`Auditor.record`, with the partition
and offset each came from; undecodable records through `Auditor.undecodable`), then call
`Auditor.finish`. No Kafka here: `projections/audit_replay.py` reads the topic.

What is checked, and the kind of violation reported (each names the run or job and the
partition/offset of the offending event):

- ``duplicate_run``: a run created twice. Run ids are deterministic, so a duplicate shows
  as a second creation event (seq 1, or seq 0 for a skip) for a run id already seen, as a
  repeated seq number of a run, or as a second run id for the same (job, scheduled time)
  (manual runs excepted: their scheduled time is the request time).
- ``illegal_transition``: a transition not in `TRANSITIONS`, a wrong attempt number (a
  retry or a rerun starts attempt + 1, every other transition keeps the attempt), a seq
  gap or an out-of-order seq, a malformed event id, or a run whose first event is not a
  creation.
- ``double_claim`` / ``double_start``: more than one ``dispatched`` / ``running`` event
  for one (run, attempt). These take precedence over ``illegal_transition`` for the
  same event (a second start is also an illegal transition, but it is reported once, by
  its specific kind). A claim given back before its start (``dispatched -> due``, the
  same attempt: released by its worker, or its worker lost before the run's start) ends
  that claim: the attempt may be claimed once more, and still started only once.
- ``missing_firing``: a fire time of a job's schedule with no run record (see below).
- ``not_final``: a run that is not final at the end of the replay although older than
  its job could legitimately take (see `AuditConfig` and `allowance_ms`).
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

Transitions follow the ledger (`streams/core/ledger.py`), including ``skipped -> due``:
the ledger's rerun accepts every final state, a skipped firing included; and
``dispatched -> due`` with the same attempt: a claimed attempt that never started is
dispatched again.

Start lateness is ``running.at_ms - scheduled_ms`` of first attempts (retries and reruns
start late on purpose), backfill runs excluded (created long after their time).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, Literal, TextIO, TypeAlias

from streams.core.ids import iso_utc
from streams.core.records import FINAL_STATES, TRANSITIONS, JobEvent, RunEvent
from streams.core.schedule import fires_between
from streams.core.spec import DstPolicy, JobSpec, Schedule

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
    "undecodable",
]
KINDS: Final[tuple[ViolationKind, ...]] = (
    "duplicate_run",
    "missing_firing",
    "illegal_transition",
    "double_claim",
    "double_start",
    "not_final",
    "undecodable",
)

# Transitions into `due` that begin a new attempt (a retry, a rerun).
_NEW_ATTEMPT_FROM: Final = frozenset({"retrying", *FINAL_STATES})

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


class _Run:
    __slots__ = (
        "attempt",
        "claimed",
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
            return
        self._run_event(job, event, partition, offset)

    def undecodable(self, partition: int, offset: int, error: str, key: bytes | None) -> None:
        """A record that is not a run-events record: counted and reported, never fatal."""
        self._undecodable += 1
        job_id = key.decode("utf-8", "replace") if key else ""
        self._violate("undecodable", job_id, "", partition, offset, error)

    def _violate(
        self,
        kind: ViolationKind,
        job_id: str,
        run_id: str,
        partition: int,
        offset: int,
        detail: str,
    ) -> None:
        self._counts[kind] += 1
        if len(self._violations) < self.config.keep_violations:
            self._violations.append(Violation(kind, job_id, run_id, partition, offset, detail))

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
        # A rerun of a skipped run (seq 0) is seq 1 too, but with attempt 2.
        creation = seq <= 1 and e.state in TRANSITIONS[None] and e.attempt == 1
        run = self._runs.get(e.run_id)
        if run is None:
            self._create(job, e, seq, creation, partition, offset)
            return
        attempt_bit = _bit(e.attempt)
        kind: ViolationKind | None = None
        detail = ""
        if e.state == "dispatched" and run.claimed & attempt_bit:
            kind, detail = "double_claim", f"attempt {e.attempt} dispatched again (seq {seq})"
        elif e.state == "running" and run.started & attempt_bit:
            kind, detail = "double_start", f"attempt {e.attempt} started again (seq {seq})"
        elif creation:
            kind, detail = "duplicate_run", f"created again ({e.state}, seq {seq})"
        elif run.seqs & _bit(seq):
            kind, detail = "duplicate_run", f"seq {seq} repeated ({e.state})"
        elif seq < run.seq:
            kind = "illegal_transition"
            detail = f"out-of-order seq {seq} after seq {run.seq} ({e.state})"
        elif seq > run.seq + 1:
            kind = "illegal_transition"
            detail = f"seq gap: {run.seq} -> {seq} ({run.state} -> {e.state})"
        elif seq == run.seq + 1:
            detail = self._check_transition(run, e)
            kind = "illegal_transition" if detail else None
        if kind is not None:
            self._violate(kind, e.job_id, e.run_id, partition, offset, detail)
        if e.state == "dispatched":
            run.claimed |= attempt_bit
        elif e.state == "running":
            run.started |= attempt_bit
            if kind is None:
                self._start_lateness(e)
        elif e.state == "due" and kind is None and run.state == "dispatched":
            # The claim was given back before the start: the attempt may be claimed again.
            run.claimed &= ~attempt_bit
            run.released += 1
        run.seqs |= _bit(seq)
        if seq > run.seq:
            if e.state == "due" and run.state in FINAL_STATES:
                run.since_ms = e.at_ms  # a rerun: a new life
            run.seq, run.state, run.attempt = seq, e.state, e.attempt
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
        if e.state == "dispatched":
            run.claimed = _bit(e.attempt)
        elif e.state == "running":
            run.started = _bit(e.attempt)
        if creation and (seq == 0) == (e.state == "skipped") and e.attempt == 1:
            return
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
        if e.state == "due" and run.state in _NEW_ATTEMPT_FROM:
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
            self._lateness.append(e.at_ms - e.scheduled_ms)

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
        expected = excused = unchecked = 0
        if now is not None:
            for job in self._jobs.values():
                if job.spec is None:
                    unchecked += 1 if job.fires else 0
                    continue
                try:
                    e, x = self._missing_firings(job, now - self.config.safety_margin_ms)
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
    n = len(ordered)

    def rank(q: float) -> int:  # nearest rank
        return ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return Lateness(n, rank(0.50), rank(0.99), ordered[-1], histogram)


def audit(
    records: Iterable[tuple[RunEvent | JobEvent, int, int]],
    config: AuditConfig = AuditConfig(),
    now_ms: int | None = None,
) -> AuditReport:
    """Audit (event, partition, offset) triples in log order."""
    auditor = Auditor(config)
    for event, partition, offset in records:
        auditor.record(event, partition, offset)
    return auditor.finish(now_ms)


# -- text output ---------------------------------------------------------------------------
def _seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def format_report(
    report: AuditReport, out: TextIO, *, topic: str = "run-events", limit: int = 20
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
            w(f"  {kind:<18} {report.counts[kind]:,}\n")
    if total:
        shown = report.violations[:limit]
        w(f"first {len(shown)} violations:\n")
        for v in shown:
            subject = v.run_id or v.job_id or "?"
            w(f"  {v.kind:<18} {topic}[{v.partition}]@{v.offset}  {subject}: {v.detail}\n")
