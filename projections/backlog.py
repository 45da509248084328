"""The runs a job's queued backfills have still to create (`JobState.backfill_queue`),
estimated for the jobs row's `backfill_pending` (the API's per-owner quota of backfill
runs sums it).

An estimate, on purpose: counting the fire times of a range exactly walks the schedule
(about 0.1 ms a time for a cron), and a job state is written at every change of the
queue. Each queued range (from_ms - 1, min(to_ms, registration)] is divided by the
schedule's period near its start (the gap between its first two fire times, computed
once per spec and kept): exact for `every` schedules and crons of a constant period
(hourly, daily), an approximation for irregular crons (weekdays only: the mean gap is
larger than the first). Capped per backfill at what it may still create
(`max_backfill_runs`).
"""

from __future__ import annotations

from schemas.records import JobState
from schemas.spec import JobSpec
from streams.core.commands import MAX_BACKFILL_RUNS
from streams.core.schedule import next_fire

_PERIODS: dict[int, int | None] = {}  # id(spec) -> its period near a backfill's start
_KEPT = 4096


def _period(spec: JobSpec, after_ms: int) -> int | None:
    key = id(spec)
    if key in _PERIODS:
        return _PERIODS[key]
    first = next_fire(spec.schedule, after_ms, spec.dst)
    second = None if first is None else next_fire(spec.schedule, first, spec.dst)
    period = None if first is None or second is None else max(1, second - first)
    if len(_PERIODS) >= _KEPT:
        _PERIODS.clear()
    _PERIODS[key] = period
    return period


def backfill_pending(state: JobState) -> int:
    """About how many runs the job's queued backfills have still to create."""
    if not state.backfill_queue or state.spec.schedule is None:
        return 0
    total = 0
    for pending in state.backfill_queue:
        upper = min(pending.to_ms, state.created_ms)
        if upper < pending.from_ms:
            continue
        period = _period(state.spec, pending.from_ms - 1)
        runs = 1 if period is None else (upper - pending.from_ms) // period + 1
        total += max(0, min(runs, MAX_BACKFILL_RUNS - pending.created))
    return total
