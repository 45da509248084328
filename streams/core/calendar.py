"""The calendar rules of a job's schedule, pure: the days it does not run.

A firing on an excluded day (the day of its time in the schedule's zone: the cron's time
zone, UTC for `every` and `at`) is decided like any other, and recorded as `skipped`
naming the calendar: never silently absent. The bounds of a schedule (`start`, `end`) are
the schedule's own (streams/core/schedule.py): times outside them are not fire times.
"""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.spec import CronSchedule, Exclusion, JobSpec
from streams.core.zones import load_zone


def excluded_by(spec: JobSpec, at_ms: int) -> Exclusion | None:
    """The exclusion whose days hold the firing at `at_ms`, or None."""
    if not spec.exclude:
        return None
    # The pinned tzdata's zone, as the schedule's own maths uses (never the host's files).
    schedule = spec.schedule
    zone = load_zone(schedule.timezone) if isinstance(schedule, CronSchedule) else UTC
    day = datetime.fromtimestamp(at_ms / 1000, tz=zone).strftime("%Y-%m-%d")
    for exclusion in spec.exclude:
        if exclusion.first <= day <= exclusion.last:
            return exclusion
    return None


def skip_reason(exclusion: Exclusion) -> str:
    days = (
        exclusion.first
        if exclusion.first == exclusion.last
        else (f"{exclusion.first}..{exclusion.last}")
    )
    return f"excluded by calendar {exclusion.name} ({days})"
