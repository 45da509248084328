"""Expected firings against the runs recorded (``missing_firing``).

Missing firings. A job is *active* over intervals derived from its job events: from an
``upserted`` that registers it (or re-registers it after a deletion) until ``paused`` or
``deleted``, and again from ``resumed``; the fire times due are those strictly after the
start of an interval and at or before its end (the ledger's fired watermark moves to the
registration/resume time, and a pause or deletion stops firing). A second ``upserted``
with another schedule or DST policy ends the interval of the old schedule at its at_ms
and starts one of the new schedule there (a schedule change is never retroactive). The
last interval ends at ``now - safety_margin`` (120 s), where ``now`` is the newest event
time read (or a later time the reader passes), so firings in flight are not flagged.

A job re-created (``upserted`` at r after its ``deleted`` at d), or whose schedule
changes at c, fires from r (or c) in the ledger, but never at or below a firing whose
run it forgot (`JobState.forgotten_ms`: deciding it again would make its run twice;
the ledger's state, not on the topics). So its interval here starts at max(r, K) (or
max(c, K)), K the newest scheduled time after d (or c) of the firings its schedule
recorded before the event (a run of trigger ``schedule``, any record: due, waiting,
skipped, ...) whose latest event then is not a confirmed withdrawal (``cancelled`` with
exactly one of the withdrawal reasons, `WITHDRAWN`): every forgotten firing is among
those, so K is at least the ledger's floor. This is the one place the audit is
conservative rather than exact: it expects a subset of the firings the ledger makes
there (none it does not make).

A schedule with ``max_runs`` stops once it made that many runs: a fire time t is not
due (not expected, not counted as checked) when, at t, the runs the schedule made had
reached the ``max_runs`` of the spec in force at t (the newest ``upserted`` before t).
The runs counted, as the ledger counts `JobState.schedule_runs`, are those of the job
id's whole history (a re-creation after a deletion does not start the count again: a
withdrawal of the old life may still be pending then) for fire times before t (the
ledger decides firings in time order):
+1 for each run its schedule created (trigger ``schedule``, created ``due`` or
``waiting``; a firing recorded ``skipped``, by misfire, calendar, concurrency or
parameters, does not count) and for each withdrawn firing revived, -1 for each of those
runs cancelled with exactly a withdrawal reason ("... before the run was due"; "(it had
started)" gives nothing back); run-now, backfill, reruns and DAG steps never count
(`connectors/audit/run_events.py` keeps these events). A later spec with a higher
``max_runs`` makes the firings after it due again; one with a lower ``max_runs`` stops
them without taking back a run created ahead (it has its record, and counts). With
``max_runs`` unset, or not reached, every fire time is expected.

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

A second run for one fire time (``duplicate_run``) is found as the runs are created
(`connectors/audit/run_events.py`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate

from connectors.audit.config import AuditConfig
from connectors.audit.findings import Findings
from connectors.audit.history import GIVEN_BACK, KEPT, AuditedJob
from schemas.spec import DstPolicy, JobSpec, Schedule
from streams.core.ids import iso_utc
from streams.core.schedule import fires_between


def missing_firings(
    job: AuditedJob, until: int, config: AuditConfig, findings: Findings
) -> tuple[int, int]:
    """Check the job's due fire times; returns (checked, excused)."""
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
    intervals, registrations = _active_intervals(job.timeline, until, job.floors)
    lives: dict[int, _Life | None] = {}
    for start, end, schedule, dst, registration in intervals:
        if registration not in lives:
            lives[registration] = _life(job, registrations, registration)
        for after, upto in _due_ranges(start, end, lives[registration]):
            for t in _fire_times(schedule, after, upto, dst):
                checked += 1
                if t in job.fires:
                    continue
                i = bisect.bisect_right(times, t)
                if i < len(times):
                    at, partition, offset = after_min[i]
                    if t <= at - config.catchup_window_ms or batch[at] >= config.max_catchup_runs:
                        excused += 1
                        continue
                    why = f"decided past it at {iso_utc(at)}"
                else:
                    partition, offset = job.partition, job.offset
                    why = "no later decision"
                findings.violate(
                    "missing_firing",
                    job.job_id,
                    "",
                    partition,
                    offset,
                    f"no run for the firing at {iso_utc(t)} (active since {iso_utc(start)}; {why})",
                )
    return checked, excused


@dataclass(frozen=True, slots=True)
class _Life:
    """What `max_runs` reads of a job's history up to the end of one of its lives."""

    # The scheduled times of the runs that count (sorted), and the count before each:
    # counts[i] = the runs counted for times up to times[i - 1].
    times: list[int]
    counts: list[int]
    # The upserts of the life in log order: their times (kept non-decreasing) and the
    # max_runs each put in force.
    ats: list[int]
    limits: list[int | None]

    def made(self, t: int) -> int:
        """The runs counted for fire times before t."""
        return self.counts[bisect.bisect_left(self.times, t)]

    def limit(self, t: int) -> int | None:
        """The max_runs of the spec in force at t (upserted before t)."""
        i = bisect.bisect_left(self.ats, t) - 1
        return self.limits[i] if i >= 0 else None


def _life(job: AuditedJob, registrations: list[int], registration: int) -> _Life | None:
    """The job's history up to the end of the life begun at timeline index
    `registration` (the count runs over every life: see the module); None when no spec
    of it limits the schedule's runs (every fire time is due)."""
    k = registrations.index(registration)
    following = registrations[k + 1] if k + 1 < len(registrations) else len(job.timeline)
    ats: list[int] = []
    limits: list[int | None] = []
    for kind, at, spec in job.timeline[:following]:
        if kind == "upserted" and spec is not None:
            ats.append(max(at, ats[-1]) if ats else at)
            limits.append(spec.max_runs)
    if all(limit is None for limit in limits):
        return None
    # Its counted events: every one before the next registration. A run is given back
    # only if it was counted (the ledger never counts below zero).
    hi = job.marks[following] if following < len(job.marks) else len(job.counted)
    held: Counter[int] = Counter()
    deltas: list[tuple[int, int]] = []
    for code in job.counted[:hi]:
        t = code >> 1
        if code & 1 != GIVEN_BACK:
            held[t] += 1
            deltas.append((t, 1))
        elif held[t] > 0:
            held[t] -= 1
            deltas.append((t, -1))
    deltas.sort()
    counts = [0, *accumulate(d for _, d in deltas)]
    return _Life([t for t, _ in deltas], counts, ats, limits)


def _due_ranges(start: int, end: int, life: _Life | None) -> Iterator[tuple[int, int]]:
    """The (after exclusive, until inclusive) ranges of (start, end] in which the
    schedule had not made its max_runs: its fire times there are due."""
    if life is None:
        yield start, end
        return
    # The count and the limit change only past a counted run's time or an upsert's:
    # constant over each (p, q] between consecutive such points.
    times = life.times
    points = times[bisect.bisect_right(times, start) : bisect.bisect_left(times, end)]
    points = sorted({*points, *(a for a in life.ats if start < a < end), end})
    opened: int | None = None  # the start of the due range under way
    p = start
    for q in points:
        limit = life.limit(p + 1)  # ms are integers: p + 1 stands for all of (p, q]
        due = limit is None or life.made(p + 1) < limit
        if due and opened is None:
            opened = p
        elif not due and opened is not None:
            yield opened, p
            opened = None
        p = q
    if opened is not None:
        yield opened, end


def re_created(job: AuditedJob, index: int, at: int) -> None:
    """The job, deleted, is re-created at `at` by its timeline's event `index`: the
    new life starts firing above the newest firing after the deletion that stayed
    decided (see the module), noted in `AuditedJob.floors` when later than `at`."""
    assert job.deleted_ms is not None
    _floor(job, index, at, job.deleted_ms)
    job.deleted_ms = None


def rescheduled(job: AuditedJob, index: int, at: int) -> None:
    """The job's schedule changes at `at` (its timeline's event `index`): the new one
    fires from `at`, but the audit expects it only above the newest firing after `at`
    that stayed decided (see the module: the ledger never decides a forgotten firing
    again, and which were forgotten is not on the topics)."""
    _floor(job, index, at, at)


def _floor(job: AuditedJob, index: int, at: int, after: int) -> None:
    decided = job.decided
    # The entries after `after`, newest first: the first one kept is K.
    low = bisect.bisect_right(decided, 2 * after + 1)
    for i in range(len(decided) - 1, low - 1, -1):
        if decided[i] & 1 == KEPT:
            if decided[i] >> 1 > at:
                job.floors[index] = decided[i] >> 1
            break


def _active_intervals(
    timeline: list[tuple[str, int, JobSpec | None]],
    until: int,
    floors: dict[int, int] | None = None,
) -> tuple[list[tuple[int, int, Schedule, DstPolicy, int]], list[int]]:
    """(after_ms exclusive, until_ms inclusive, schedule, dst, registration) in which the
    job fires, `registration` the timeline index of the registration of its life; and
    those indexes (each registration or re-creation after a deletion). `floors`: per
    re-creation or schedule change (timeline index), the time its interval starts at
    when later than the event's own (`re_created`, `rescheduled`)."""
    out: list[tuple[int, int, Schedule, DstPolicy, int]] = []
    registrations: list[int] = []
    spec: JobSpec | None = None
    start: int | None = None  # the open interval's start
    registered = paused = deleted = False

    def close(at: int) -> None:
        if start is not None and spec is not None:
            out.append((start, min(at, until), spec.schedule, spec.dst, registrations[-1]))

    for index, (kind, at, new) in enumerate(timeline):
        if kind == "upserted" and new is not None:
            if not registered or deleted:
                registered, paused, deleted = True, False, False
                spec, start = new, max(at, floors.get(index, at)) if floors else at
                registrations.append(index)
            else:
                assert spec is not None
                if (new.schedule, new.dst) != (spec.schedule, spec.dst) and not paused:
                    close(at)
                    start = max(at, floors.get(index, at)) if floors else at
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
    return [i for i in out if i[0] < i[1]], registrations


def _fire_times(schedule: Schedule, after: int, until: int, dst: DstPolicy) -> Iterator[int]:
    """fires_between, paged: any number of fire times without a list of them all."""
    page = 10_000
    while True:
        times = fires_between(schedule, after, until, dst, limit=page)
        yield from times
        if len(times) < page:
            return
        after = times[-1]
