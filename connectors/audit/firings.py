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

from connectors.audit.config import AuditConfig
from connectors.audit.findings import Findings
from connectors.audit.history import AuditedJob
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
    for start, end, schedule, dst in _active_intervals(job.timeline, until):
        for t in _fire_times(schedule, start, end, dst):
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
