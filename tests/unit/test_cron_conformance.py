"""Conformance of cronlog's cron expressions with cron: cronie's crond, and Vixie and
Debian cron where they agree with it, under the default `auto` DST policy.

- A table of expressions, zones and starting instants with the fire times cron gives,
  worked out by hand: daylight-saving changes, both day fields, `L` and `#`, steps,
  ranges, names.
- A brute-force oracle written here from cronie's source (src/entry.c, src/cron.c) and
  independent of streams/core/schedule.py and of croniter: it reads the fields itself and
  runs cronie's minute loop over real minutes (its virtual and running clocks, the four
  kinds of clock change, wildcard and fixed-time jobs), deciding each minute by the field
  sets and cron's day rule. Hypothesis compares `next_fire`, `fires_between` and
  `fire_window` with it over random expressions, zones and windows of a few days.
- Field errors name their field; `fire_window` says when its limit cut the list.

Where cronlog departs from cronie on purpose (streams/core/schedule.py documents it),
the oracle is told so: a fixed-time job's wall time in a spring-forward gap fires at the
instant it denotes with the offset before the gap, where cronie runs it at the jump.
The zones and years sampled here have only changes of 30 minutes to 3 hours, each a
change of the isdst flag, the only changes cronie's set_time() notices.
"""

from __future__ import annotations

import calendar
import itertools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from typing import Literal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.spec import CronSchedule, EverySchedule
from streams.core.schedule import (
    ScheduleError,
    fire_window,
    fires_between,
    next_fire,
    parse_schedule,
)

MINUTE_S = 60
HOUR_S = 3600
DAY_S = 86_400
NAIVE_EPOCH = datetime(1970, 1, 1)

# --- the oracle: cron's fields -----------------------------------------------------------

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")

# A day-of-month item: a day, ("L", 0, 0) the last day, ("W", n, 0) the weekday nearest
# the nth, ("-L", a, 0) from a to the last day. A day-of-week item: a weekday 0-6,
# ("L", d, 0) its last in the month, ("#", d, k) its kth in the month.
DayItem = int | tuple[str, int, int]


@dataclass(frozen=True)
class Entry:
    """A crontab line's schedule as cronie's entry holds it: a bit set per field and
    the flags set when a field's first character is `*`."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[DayItem]
    months: frozenset[int]
    dows: frozenset[DayItem]
    min_star: bool
    hr_star: bool
    dom_star: bool
    dow_star: bool

    @property
    def wildcard(self) -> bool:
        """cron.c runs a job on every wall minute it matches when MIN_STAR or HR_STAR is
        set, and a fixed-time job once, catching up the minutes of a gap."""
        return self.min_star or self.hr_star


def number(text: str, names: tuple[str, ...], offset: int) -> int:
    upper = text.upper()
    return names.index(upper) + offset if upper in names else int(upper)


def span(part: str, low: int, high: int, names: tuple[str, ...], offset: int) -> set[int]:
    """cronie's get_range: `*`, `n`, `a-b`, each with an optional `/step`; and `a/step`
    (a to the end of the field, Saturday in the day of the week), which cronlog accepts
    beyond cron."""
    base, _, step = part.partition("/")
    if base == "*":
        first, last = low, high
    elif "-" in base:
        a, b = base.split("-")
        first, last = number(a, names, offset), number(b, names, offset)
    else:
        first = number(base, names, offset)
        last = max(first, 6 if high == 7 else high) if step else first
    return set(range(first, last + 1, int(step) if step else 1))


def parse(expr: str) -> Entry:
    fields = expr.split()
    seconds = span_list(fields.pop(0), 0, 59, (), 0) if len(fields) == 6 else {0}
    minute, hour, dom, month, dow = fields
    doms: set[DayItem] = set()
    for part in dom.replace("?", "*").split(","):
        if part.upper() == "L":
            doms.add(("L", 0, 0))
        elif part.upper().endswith("W"):
            doms.add(("W", int(part[:-1]), 0))
        elif part.upper().endswith("-L"):
            doms.add(("-L", int(part[:-2]), 0))
        else:
            doms.update(span(part, 1, 31, (), 0))
    dows: set[DayItem] = set()
    for part in dow.replace("?", "*").upper().split(","):
        if "#" in part:
            day, _, nth = part.partition("#")
            dows.add(("#", number(day, WEEKDAYS, 0) % 7, int(nth)))
        elif part.endswith("L") or (part.startswith("L") and len(part) > 1):
            day = part[:-1] if part.endswith("L") else part[1:]
            dows.add(("L", number(day, WEEKDAYS, 0) % 7, 0))
        else:
            dows.update(day % 7 for day in span(part, 0, 7, WEEKDAYS, 0))
    return Entry(
        seconds=frozenset(seconds),
        minutes=frozenset(span_list(minute, 0, 59, (), 0)),
        hours=frozenset(span_list(hour, 0, 23, (), 0)),
        doms=frozenset(doms),
        months=frozenset(span_list(month, 1, 12, MONTHS, 1)),
        dows=frozenset(dows),
        min_star=minute.startswith("*"),
        hr_star=hour.startswith("*"),
        dom_star=dom.startswith("*") or dom == "?",
        dow_star=dow.startswith("*") or dow == "?",
    )


def span_list(field: str, low: int, high: int, names: tuple[str, ...], offset: int) -> set[int]:
    return set().union(*(span(part, low, high, names, offset) for part in field.split(",")))


def on_dom(item: DayItem, day: date) -> bool:
    length = calendar.monthrange(day.year, day.month)[1]
    if isinstance(item, int):
        return day.day == item
    if item[0] == "L":
        return day.day == length
    if item[0] == "-L":
        return day.day >= item[1]
    # ("W", n): the weekday nearest the nth (the last day when the month is shorter),
    # never in another month.
    target = date(day.year, day.month, min(item[1], length))
    if target.weekday() == 5:
        target += timedelta(days=-1 if target.day > 1 else 2)
    elif target.weekday() == 6:
        target += timedelta(days=1 if target.day < length else -2)
    return day == target


def on_dow(item: DayItem, day: date) -> bool:
    weekday = day.isoweekday() % 7
    if isinstance(item, int):
        return weekday == item
    if item[0] == "L":
        length = calendar.monthrange(day.year, day.month)[1]
        return weekday == item[1] and day.day + 7 > length
    return weekday == item[1] and (day.day - 1) // 7 + 1 == item[2]


def matches(entry: Entry, wall: datetime) -> bool:
    """cron.c's find_jobs test for one wall-clock minute, with its day rule: both day
    fields when either was written with a leading `*`, else either."""
    if wall.minute not in entry.minutes or wall.hour not in entry.hours:
        return False
    if wall.month not in entry.months:
        return False
    day = wall.date()
    dom = any(on_dom(item, day) for item in entry.doms)
    dow = any(on_dow(item, day) for item in entry.dows)
    return (dom and dow) if entry.dom_star or entry.dow_star else (dom or dow)


# --- the oracle: cronie's minute loop ----------------------------------------------------

Gap = Literal["jump", "shifted"]


def offset_min(zone: ZoneInfo, utc_s: int) -> int:
    offset = datetime.fromtimestamp(utc_s, zone).utcoffset()
    assert offset is not None
    return int(offset.total_seconds()) // 60


@cache
def hour_offset(zone: ZoneInfo, hour: int) -> int | None:
    """The offset (minutes) through a whole UTC hour, or None when it changes in it."""
    first, last = offset_min(zone, hour * HOUR_S), offset_min(zone, hour * HOUR_S + HOUR_S - 1)
    return first if first == last else None


def minute_offset(zone: ZoneInfo, minute: int) -> int:
    offset = hour_offset(zone, minute // 60)
    return offset_min(zone, minute * MINUTE_S) if offset is None else offset


def cron_fires(expr: str, zone_name: str, after_s: int, until_s: int, gap: Gap) -> list[int]:
    """The instants (UTC seconds) in (after_s, until_s] at which cronie's crond, its
    system zone set to `zone_name`, runs `expr`; a 6-field expression's seconds are
    added to each minute it runs. `gap="shifted"`: a fixed-time job caught up after a
    spring forward fires at its wall time with the offset before the change, as cronlog
    does, instead of at the jump."""
    entry = parse(expr)
    zone = ZoneInfo(zone_name)
    found: set[int] = set()

    def find_jobs(vtime: int, now: int, wild: bool, fixed: bool, old_offset: int | None) -> None:
        if not (wild if entry.wildcard else fixed):
            return
        if not matches(entry, NAIVE_EPOCH + timedelta(minutes=vtime)):
            return
        if old_offset is None:  # runs now
            found.update(now * MINUTE_S + second for second in entry.seconds)
        else:  # cronlog's instant for a wall time of a gap
            found.update((vtime - old_offset) * MINUTE_S + s for s in entry.seconds)

    # Start a day early in a steady state, so that a change just before `after_s` is
    # handled as crond, running for a while, handles it.
    first = (after_s - DAY_S) // MINUTE_S
    old_offset = minute_offset(zone, first)
    virtual = first + old_offset
    for now in range(first + 1, until_s // MINUTE_S + 1):
        offset = minute_offset(zone, now)
        running = now + offset  # clockTime: wall-clock minutes
        diff = running - virtual
        if diff == 1:
            virtual = running
            find_jobs(virtual, now, True, True, None)
        elif diff > 3 * 60 or diff < -3 * 60:  # a clock reset
            virtual = running
            find_jobs(running, now, True, True, None)
        elif diff > 5:  # DST begins: wildcard jobs now, fixed-time jobs caught up
            find_jobs(running, now, True, False, None)
            while virtual < running:
                virtual += 1
                late = gap == "shifted" and virtual < running
                find_jobs(virtual, now, False, True, old_offset if late else None)
        elif diff > 0:  # woke up late: every job of each missed minute, now
            while virtual < running:
                virtual += 1
                find_jobs(virtual, now, True, True, None)
        else:  # DST ends: wildcard jobs only, until the wall clock catches up
            find_jobs(running, now, True, False, None)
        old_offset = offset
    return sorted(t for t in found if after_s < t <= until_s)


# --- the table ----------------------------------------------------------------------------


def s(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp())


def isos(values: list[int]) -> list[str]:
    return [datetime.fromtimestamp(v, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for v in values]


BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
LORD_HOWE = "Australia/Lord_Howe"
SANTIAGO = "America/Santiago"

# (expression, zone, after, the next fire times cron gives). 2026 changes: Berlin
# 03-29 01:00Z 02:00 CET -> 03:00 CEST and 10-25 01:00Z 03:00 CEST -> 02:00 CET; New York
# 03-08 07:00Z 02:00 EST -> 03:00 EDT and 11-01 06:00Z 02:00 EDT -> 01:00 EST; Lord Howe
# 04-04 15:00Z 02:00 (+11) -> 01:30 (+10:30) and 10-03 15:30Z 02:00 -> 02:30; Santiago
# 04-05 03:00Z 24:00 (-03) -> 23:00 (-04) and 09-06 04:00Z 24:00 (-04) -> 01:00 (-03).
TABLE: list[tuple[str, str, str, list[str]]] = [
    # --- plain fields, names, steps, ranges (UTC, 2026-01-01 is a Thursday)
    ("*/20 9-10 * * MON-FRI", "UTC", "2026-01-02T10:30Z",
     ["2026-01-02T10:40Z", "2026-01-05T09:00Z", "2026-01-05T09:20Z"]),
    ("0 0 * JAN-MAR/2 *", "UTC", "2026-01-30T12:00Z",
     ["2026-01-31T00:00Z", "2026-03-01T00:00Z", "2026-03-02T00:00Z"]),
    ("0 0 1 */4 *", "UTC", "2026-01-01T00:00Z",
     ["2026-05-01T00:00Z", "2026-09-01T00:00Z", "2027-01-01T00:00Z"]),
    ("0 12 * * 5-7", "UTC", "2026-01-01T00:00Z",  # Friday to Sunday: 7 is Sunday
     ["2026-01-02T12:00Z", "2026-01-03T12:00Z", "2026-01-04T12:00Z", "2026-01-09T12:00Z"]),
    ("0 12 * * 1-7/2", "UTC", "2026-01-01T00:00Z",  # Mon, Wed, Fri, Sun
     ["2026-01-02T12:00Z", "2026-01-04T12:00Z", "2026-01-05T12:00Z", "2026-01-07T12:00Z"]),
    ("0 12 * * sun,Sat", "UTC", "2026-01-01T00:00Z",
     ["2026-01-03T12:00Z", "2026-01-04T12:00Z", "2026-01-10T12:00Z"]),
    ("0 05-5 * * *", "UTC", "2026-01-01T00:00Z", ["2026-01-01T05:00Z", "2026-01-02T05:00Z"]),
    ("5/20 8 * * *", "UTC", "2026-01-01T00:00Z",  # a/n, beyond cron: 5 to 59 every 20
     ["2026-01-01T08:05Z", "2026-01-01T08:25Z", "2026-01-01T08:45Z", "2026-01-02T08:05Z"]),
    ("30 */10 1 1 * *", "UTC", "2026-01-01T00:00Z",  # seconds first
     ["2026-01-01T01:00:30Z", "2026-01-01T01:10:30Z", "2026-01-01T01:20:30Z"]),
    ("0 0 12 * * 7", "UTC", "2026-01-01T00:00Z", ["2026-01-04T12:00Z", "2026-01-11T12:00Z"]),
    # --- both day fields: AND when either begins with *, OR when both are restricted
    ("0 0 13 * FRI", "UTC", "2026-02-01T00:00Z",
     ["2026-02-06T00:00Z", "2026-02-13T00:00Z", "2026-02-20T00:00Z", "2026-02-27T00:00Z",
      "2026-03-06T00:00Z", "2026-03-13T00:00Z"]),
    ("0 0 */10 * MON", "UTC", "2026-01-01T00:00Z",  # days 1, 11, 21, 31 that are Mondays
     ["2026-05-11T00:00Z", "2026-06-01T00:00Z", "2026-08-31T00:00Z", "2026-09-21T00:00Z"]),
    ("0 0 1,15 * SAT", "UTC", "2026-01-01T00:00Z",
     ["2026-01-03T00:00Z", "2026-01-10T00:00Z", "2026-01-15T00:00Z", "2026-01-17T00:00Z"]),
    ("0 0 30 2 MON", "UTC", "2026-01-01T00:00Z",  # Mondays of February
     ["2026-02-02T00:00Z", "2026-02-09T00:00Z", "2026-02-16T00:00Z", "2026-02-23T00:00Z",
      "2027-02-01T00:00Z"]),
    ("0 12 ? * MON", "UTC", "2026-01-01T00:00Z",  # ? is any day, a star
     ["2026-01-05T12:00Z", "2026-01-12T12:00Z"]),
    ("0 12 1 * ?", "UTC", "2026-01-01T00:00Z", ["2026-01-01T12:00Z", "2026-02-01T12:00Z"]),
    # --- L, W and # (beyond cron, croniter's): restricted day fields like any other
    ("0 0 * * 5L", "UTC", "2026-01-01T00:00Z",  # the last Friday
     ["2026-01-30T00:00Z", "2026-02-27T00:00Z", "2026-03-27T00:00Z"]),
    ("0 0 * * FRIL", "UTC", "2026-01-01T00:00Z", ["2026-01-30T00:00Z", "2026-02-27T00:00Z"]),
    ("0 0 * * L5", "UTC", "2026-01-01T00:00Z", ["2026-01-30T00:00Z", "2026-02-27T00:00Z"]),
    ("0 0 * * 7L", "UTC", "2026-01-01T00:00Z", ["2026-01-25T00:00Z", "2026-02-22T00:00Z"]),
    ("0 0 13 * 5L", "UTC", "2026-01-01T00:00Z",  # the 13th, or the last Friday
     ["2026-01-13T00:00Z", "2026-01-30T00:00Z", "2026-02-13T00:00Z", "2026-02-27T00:00Z"]),
    ("0 0 */2 * 5L", "UTC", "2026-01-01T00:00Z",  # odd days that are last Fridays
     ["2026-02-27T00:00Z", "2026-03-27T00:00Z", "2026-05-29T00:00Z"]),
    ("0 9 * * MON#1", "UTC", "2026-01-01T00:00Z",
     ["2026-01-05T09:00Z", "2026-02-02T09:00Z", "2026-03-02T09:00Z"]),
    ("0 9 10 * 1#2,5#5", "UTC", "2026-01-01T00:00Z",  # the 10th, 2nd Monday, 5th Friday
     ["2026-01-10T09:00Z", "2026-01-12T09:00Z", "2026-01-30T09:00Z", "2026-02-09T09:00Z",
      "2026-02-10T09:00Z"]),
    ("0 0 L * *", "UTC", "2026-01-01T00:00Z",
     ["2026-01-31T00:00Z", "2026-02-28T00:00Z", "2026-03-31T00:00Z"]),
    ("0 0 L * MON", "UTC", "2026-01-20T00:00Z",  # the last day, or Mondays
     ["2026-01-26T00:00Z", "2026-01-31T00:00Z", "2026-02-02T00:00Z"]),
    ("0 0 1,L 2 *", "UTC", "2028-01-01T00:00Z", ["2028-02-01T00:00Z", "2028-02-29T00:00Z"]),
    ("0 0 27-L 2 *", "UTC", "2027-01-01T00:00Z",
     ["2027-02-27T00:00Z", "2027-02-28T00:00Z", "2028-02-27T00:00Z", "2028-02-28T00:00Z",
      "2028-02-29T00:00Z"]),
    ("0 0 1W * *", "UTC", "2025-12-31T12:00Z",  # Feb 1 and Mar 1 are Sundays
     ["2026-01-01T00:00Z", "2026-02-02T00:00Z", "2026-03-02T00:00Z"]),
    ("0 0 1W 8 *", "UTC", "2026-01-01T00:00Z", ["2026-08-03T00:00Z"]),  # not in July
    # --- DST, Europe/Berlin. Fall back: a fixed-time job once, a wildcard one on every
    # real hour; a step not led by * is fixed-time (cronie's MIN_STAR/HR_STAR).
    ("30 2 * * *", BERLIN, "2026-10-24T12:00Z", ["2026-10-25T00:30Z", "2026-10-26T01:30Z"]),
    ("0-59/30 2 * * *", BERLIN, "2026-10-24T12:00Z",
     ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-26T01:00Z"]),
    ("*/30 2 * * *", BERLIN, "2026-10-24T12:00Z",
     ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-25T01:00Z", "2026-10-25T01:30Z",
      "2026-10-26T01:00Z"]),
    ("0 */2 * * *", BERLIN, "2026-10-24T23:30Z",
     ["2026-10-25T00:00Z", "2026-10-25T01:00Z", "2026-10-25T03:00Z"]),
    ("0 0-23/2 * * *", BERLIN, "2026-10-24T23:30Z",
     ["2026-10-25T00:00Z", "2026-10-25T03:00Z"]),
    # Spring forward: a wildcard job has no wall time in the gap.
    ("*/30 * * * *", BERLIN, "2026-03-29T00:00Z",
     ["2026-03-29T00:30Z", "2026-03-29T01:00Z", "2026-03-29T01:30Z"]),
    ("*/20 2 * * *", BERLIN, "2026-03-28T12:00Z",
     ["2026-03-30T00:00Z", "2026-03-30T00:20Z", "2026-03-30T00:40Z"]),
    # --- America/New_York
    ("30 1 * * *", NEW_YORK, "2026-10-31T12:00Z", ["2026-11-01T05:30Z", "2026-11-02T06:30Z"]),
    ("0 1-23/2 * * *", NEW_YORK, "2026-11-01T04:00Z",
     ["2026-11-01T05:00Z", "2026-11-01T08:00Z"]),
    ("15 * * * *", NEW_YORK, "2026-11-01T04:00Z",
     ["2026-11-01T04:15Z", "2026-11-01T05:15Z", "2026-11-01T06:15Z", "2026-11-01T07:15Z"]),
    ("0 3 * * *", NEW_YORK, "2026-03-07T12:00Z", ["2026-03-08T07:00Z", "2026-03-09T07:00Z"]),
    # --- Australia/Lord_Howe: half-hour changes
    ("45 1 * * *", LORD_HOWE, "2026-04-04T12:00Z",
     ["2026-04-04T14:45Z", "2026-04-05T15:15Z"]),
    ("*/15 1 * * *", LORD_HOWE, "2026-04-04T14:00Z",  # 01:30-01:59 twice
     ["2026-04-04T14:15Z", "2026-04-04T14:30Z", "2026-04-04T14:45Z", "2026-04-04T15:00Z",
      "2026-04-04T15:15Z", "2026-04-05T14:30Z"]),
    ("*/15 * * * *", LORD_HOWE, "2026-10-03T15:00Z",
     ["2026-10-03T15:15Z", "2026-10-03T15:30Z", "2026-10-03T15:45Z"]),
    # --- America/Santiago: changes at midnight. 00:00 does not exist on 09-06; its
    # shifted instant is the jump, where cron runs it too.
    ("0 0 * * *", SANTIAGO, "2026-09-05T12:00Z", ["2026-09-06T04:00Z", "2026-09-07T03:00Z"]),
    ("30 23 * * *", SANTIAGO, "2026-04-04T12:00Z", ["2026-04-05T02:30Z", "2026-04-06T03:30Z"]),
]  # fmt: skip


@pytest.mark.parametrize(("expr", "zone", "after", "expected"), TABLE)
def test_next_fire_times_are_crons(expr: str, zone: str, after: str, expected: list[str]) -> None:
    schedule = CronSchedule(expr, zone)
    start, end = s(after), s(expected[-1])
    assert cron_fires(expr, zone, start, end, "jump") == [s(iso) for iso in expected]
    fires = [ms // 1000 for ms in fires_between(schedule, start * 1000, end * 1000)]
    assert isos(fires) == isos([s(iso) for iso in expected])
    assert next_fire(schedule, start * 1000) == s(expected[0]) * 1000
    parse_schedule({"cron": expr, "timezone": zone})


# Where cronlog differs from cronie: (expression, zone, after, cron's fire, cronlog's).
# cronie runs a fixed-time job skipped by a spring forward at the jump; cronlog at the
# instant its wall time denotes with the offset before the gap.
DIFFERENCES: list[tuple[str, str, str, str, str]] = [
    ("30 2 * * *", BERLIN, "2026-03-28T12:00Z", "2026-03-29T01:00Z", "2026-03-29T01:30Z"),
    ("30 2 * * *", NEW_YORK, "2026-03-07T12:00Z", "2026-03-08T07:00Z", "2026-03-08T07:30Z"),
    ("15 2 * * *", LORD_HOWE, "2026-10-03T12:00Z", "2026-10-03T15:30Z", "2026-10-03T15:45Z"),
    ("30 0 * * *", SANTIAGO, "2026-09-05T12:00Z", "2026-09-06T04:00Z", "2026-09-06T04:30Z"),
]


@pytest.mark.parametrize(("expr", "zone", "after", "cron", "cronlog"), DIFFERENCES)
def test_a_gap_fires_at_the_shifted_instant_where_cron_fires_at_the_jump(
    expr: str, zone: str, after: str, cron: str, cronlog: str
) -> None:
    start = s(after)
    assert cron_fires(expr, zone, start, s(cronlog), "jump")[0] == s(cron)
    assert cron_fires(expr, zone, start, s(cronlog), "shifted")[0] == s(cronlog)
    assert next_fire(CronSchedule(expr, zone), start * 1000) == s(cronlog) * 1000


# --- the oracle against cronlog: random expressions, zones and windows --------------------


@st.composite
def plain_field(draw: st.DrawFn, low: int, high: int, names: tuple[str, ...] = ()) -> str:
    """A field in cron's own forms: *, */n, a value or a name, a-b, a-b/n, a list of
    these; and a/n, which cronlog accepts beyond cron."""

    def value(at_least: int = low) -> str:
        n = draw(st.integers(at_least, high))
        offset = 1 if names == MONTHS else 0
        if names and n - offset < len(names) and draw(st.booleans()):
            return names[n - offset].lower() if draw(st.booleans()) else names[n - offset]
        return str(n)

    def item() -> str:
        kind = draw(st.sampled_from(["value", "range", "range-step", "step", "from"]))
        if kind == "value":
            return value()
        if kind == "step":
            return f"*/{draw(st.integers(1, high - low + 1))}"
        if kind == "from":
            return f"{draw(st.integers(low, high))}/{draw(st.integers(1, 12))}"
        first = draw(st.integers(low, high))
        last = draw(st.integers(first, high))
        text = f"{first}-{last}"
        return f"{text}/{draw(st.integers(1, 12))}" if kind == "range-step" else text

    kind = draw(st.sampled_from(["*", "*/n", "items"]))
    if kind == "*":
        return "*"
    if kind == "*/n":
        return f"*/{draw(st.integers(1, high - low + 1))}"
    return ",".join(item() for _ in range(draw(st.integers(1, 3))))


@st.composite
def dom_field(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["plain", "plain", "plain", "L", "W", "?"]))
    if kind == "plain":
        return draw(plain_field(1, 31))
    if kind == "W":
        return f"{draw(st.integers(1, 31))}W"
    if kind == "?":
        return "?"
    return draw(st.sampled_from(["L", "1,L", "15,L", "25-L", "L,10-12"]))


@st.composite
def dow_field(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["plain", "plain", "plain", "special", "?"]))
    if kind == "plain":
        return draw(plain_field(0, 7, WEEKDAYS))
    if kind == "?":
        return "?"
    items = []
    for _ in range(draw(st.integers(1, 2))):
        day = draw(st.sampled_from(["0", "1", "5", "6", "7", "FRI", "mon"]))
        form = draw(st.sampled_from(["{d}L", "L{d}", "{d}#1", "{d}#2", "{d}#5"]))
        items.append(form.format(d=day))
    return ",".join(items)


@st.composite
def cron_exprs(draw: st.DrawFn) -> str:
    # Minute and hour fields that fire often are rarer: cronlog enumerates every fire.
    minute = draw(st.one_of(plain_field(0, 59), st.sampled_from(["0", "30", "15,45", "*/20"])))
    hour = draw(plain_field(0, 23))
    if draw(st.booleans()):  # every day: the days of the offset changes are in
        fields = [minute, hour, "*", "*", "*"]
    else:
        month = draw(st.one_of(st.just("*"), plain_field(1, 12, MONTHS)))
        fields = [minute, hour, draw(dom_field()), month, draw(dow_field())]
    if draw(st.integers(0, 9)) == 0:
        fields.insert(0, draw(st.sampled_from(["0", "30", "0,30", "*/20"])))
    return " ".join(fields)


ZONES_WITH_CHANGES = [
    BERLIN,
    NEW_YORK,
    LORD_HOWE,
    SANTIAGO,
    "Europe/London",
    "Australia/Sydney",
    "America/St_Johns",  # -03:30 / -02:30
    "Pacific/Chatham",  # +12:45 / +13:45
    "Europe/Dublin",
]


@cache
def changes(zone_name: str, year: int) -> list[int]:
    """The instants (s) in `year` at which the zone's offset changes, to the minute,
    each checked to be a change cronie notices (of isdst) and of at most 3 hours."""
    zone = ZoneInfo(zone_name)
    found = []
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    for hour in range(366 * 24):
        low, high = start + hour * HOUR_S, start + (hour + 1) * HOUR_S
        if offset_min(zone, low) == offset_min(zone, high):
            continue
        while high - low > MINUTE_S:
            middle = (low + high) // 2 // MINUTE_S * MINUTE_S
            if offset_min(zone, middle) == offset_min(zone, low):
                low = middle
            else:
                high = middle
        before, after = (datetime.fromtimestamp(t, zone) for t in (high - 1, high))
        assert before.dst() != after.dst(), (zone_name, high)
        assert abs(offset_min(zone, high) - offset_min(zone, high - 1)) <= 180
        found.append(high)
    return found


@st.composite
def places(draw: st.DrawFn) -> tuple[str, int]:
    """A zone and a starting instant (s), mostly a day and a half around an offset change."""
    zone = draw(st.sampled_from([*ZONES_WITH_CHANGES, "UTC", "Asia/Kolkata"]))
    year = draw(st.integers(2024, 2030))
    if zone in ("UTC", "Asia/Kolkata"):
        start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
        return zone, start + draw(st.integers(0, 365 * DAY_S))
    change = draw(st.sampled_from(changes(zone, year)))
    return zone, change + draw(st.integers(-36 * HOUR_S, 36 * HOUR_S))


@settings(max_examples=300, deadline=None)
@given(expr=cron_exprs(), place=places(), days=st.integers(0, 3), limit=st.integers(0, 40))
def test_fire_times_are_crons(expr: str, place: tuple[str, int], days: int, limit: int) -> None:
    zone, after = place
    until = after + days * DAY_S + HOUR_S
    expected = cron_fires(expr, zone, after, until, "shifted")
    schedule = CronSchedule(expr, zone)
    fires = fires_between(schedule, after * 1000, until * 1000)
    assert isos([ms // 1000 for ms in fires]) == isos(expected)
    following = next_fire(schedule, after * 1000)
    if expected:
        assert following == expected[0] * 1000
        assert next_fire(schedule, expected[-1] * 1000 - 1) == expected[-1] * 1000
    else:
        assert following is None or following > until * 1000
    window = fire_window(schedule, after * 1000, until * 1000, limit=limit)
    assert window.times == [t * 1000 for t in expected[:limit]]
    assert window.truncated == (len(expected) > limit)


def test_the_oracle_sees_the_changes_it_is_given() -> None:
    for zone in ZONES_WITH_CHANGES:
        assert len(changes(zone, 2026)) == 2, zone


# --- the DST classification: only a leading * makes a wildcard job ----------------------


@pytest.mark.parametrize(
    ("minute", "hour", "wildcard"),
    [
        ("*", "2", True),
        ("*/15", "2", True),
        ("0", "*", True),
        ("0", "*/2", True),
        ("*/15", "*", True),
        ("0-59/15", "2", False),
        ("0", "1-23/2", False),
        ("0", "0-23", False),
        ("0,30", "2", False),
        ("30", "2", False),
        ("5/15", "2", False),
    ],
)
def test_a_job_is_wildcard_when_its_minute_or_hour_begins_with_a_star(
    minute: str, hour: str, wildcard: bool
) -> None:
    """Across the Berlin fall back (02:00-02:59 twice): a wildcard job fires in the
    repeated hour again, a fixed-time job does not."""
    expr = f"{minute} {hour} * * *"
    after, until = s("2026-10-25T00:00Z") - 1, s("2026-10-25T01:59Z")
    fires = fires_between(CronSchedule(expr, BERLIN), after * 1000, until * 1000)
    repeated = [t for t in fires if t >= s("2026-10-25T01:00Z") * 1000]
    assert bool(repeated) == wildcard
    assert parse(expr).wildcard == wildcard
    assert [t // 1000 for t in fires] == cron_fires(expr, BERLIN, after, until, "jump")


# --- field errors name the field --------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "minute field: 61 is out of range 0-59"),
        ("0 24 * * *", "hour field: 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("0 0 * 0 *", "month field: 0 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("0 0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),  # 6 fields
        ("60 0 0 * * *", "second field: 60 is out of range 0-59"),
        ("1-2-3 * * * *", "minute field: '1-2-3' is not a value, a range"),
        ("1,,2 * * * *", "minute field: '1,,2' has an empty item"),
        (",5 * * * *", "minute field: ',5' has an empty item"),
        ("*-5 * * * *", "minute field: '*-5' is not a value"),
        ("+5 * * * *", "minute field: '+5' is not a value"),
        ("~ * * * *", "minute field: '~' is not a value"),
        ("R * * * *", "minute field: 'R': hashed (H) and random (R) fields are not supported"),
        ("0 H * * *", "hour field: 'H': hashed (H)"),
        ("0 0 * JANUARY *", "month field: 'JANUARY' is not a number or a name"),
        ("0 ? * * *", "hour field: '?': '?' is only allowed as a whole day-of-month"),
        ("0 0 ?,1 * *", "day-of-month field: '?,1': '?' is only allowed"),
        ("0 0 * * L", "day-of-week field: 'L' needs a day"),
        ("0 0 * * 8L", "day-of-week field: 8 is out of range 0-7"),
        ("0 0 * * XL", "day-of-week field: 'X' is not a number or a name"),
        ("0 0 * * 1#6", "day-of-week field: '1#6': the week after # must be 1-5"),
        ("0 0 * * 1#2/2", "day-of-week field: '1#2/2' is not a value"),
        ("0 0 * * MON#2,FRI", "day-of-week field: 'MON#2,FRI': days such as 5L or 5#2"),
        ("0 0 LW * *", "day-of-month field: 'LW' is not a number"),
        ("0 0 L-2 * *", "day-of-month field: 'L' is not a number"),
        ("0 0 L/2 * *", "day-of-month field: 'L' is not a number"),
        ("0 0 W * *", "day-of-month field: 'W' is not a number"),
        ("0 0 32W * *", "day-of-month field: 32 is out of range 1-31"),
        ("0 0 15W,L * *", "day-of-month field: '15W,L': a W day must stand alone"),
        ("0 L * * *", "hour field: 'L' is not a number"),
        ("0 0 * * 7-0", "day-of-week field: '7-0': a range must go from low to high"),
        ("*/0 * * * *", "minute field: '*/0': a step must be at least 1"),
        ("0 0 * * 5#2/0", "day-of-week field: '5#2/0' is not a value"),
    ],
)
def test_field_errors_name_the_field(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(f"invalid cron expression {expr!r}: ")):
        parse_schedule({"cron": expr})
    with pytest.raises(ScheduleError, match=re.escape(message)):
        next_fire(CronSchedule(expr, "UTC"), 0)


FIELD_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")


@settings(max_examples=400, deadline=None)
@given(
    position=st.integers(0, 5),
    text=st.text(alphabet="0123456789LW#?*/-,SUNMONFRIJANlw", min_size=1, max_size=7),
    six=st.booleans(),
)
def test_every_field_error_names_its_field(position: int, text: str, six: bool) -> None:
    fields = ["0", "0", "0", "1", "*", "*"] if six else ["0", "0", "1", "*", "*"]
    position %= len(fields)
    fields[position] = text
    expr = " ".join(fields)
    name = FIELD_NAMES[position + (0 if six else 1)]
    try:
        parse_schedule({"cron": expr})
    except ScheduleError as error:
        message = str(error)
        assert f": {name} field: " in message or message.endswith(": it never fires"), message


# --- a list cut by its limit says so ----------------------------------------------------


def test_fire_window_says_when_its_limit_cut_the_list() -> None:
    minute = CronSchedule("* * * * *")
    assert fire_window(minute, 0, 10 * 60_000, limit=3) == ([60_000, 120_000, 180_000], True)
    whole = fire_window(minute, 0, 10 * 60_000, limit=10)
    assert whole.times == [n * 60_000 for n in range(1, 11)]
    assert not whole.truncated
    assert fire_window(minute, 0, 10 * 60_000, limit=0) == ([], True)
    assert fire_window(minute, 0, 30_000, limit=0) == ([], False)
    assert fire_window(EverySchedule(1000), 0, 5000, limit=4) == ([1000, 2000, 3000, 4000], True)
    assert fire_window(None, 0, 5000) == ([], False)
    # fires_between keeps its list: the same times, cut without a word.
    assert fires_between(minute, 0, 10 * 60_000, limit=3) == [60_000, 120_000, 180_000]


def test_paging_with_fire_window_covers_the_whole_window() -> None:
    schedule = CronSchedule("*/7 * * * *", BERLIN)
    after, until = s("2026-10-24T22:00Z") * 1000, s("2026-10-25T04:00Z") * 1000
    pages: list[int] = []
    start = after
    while True:
        window = fire_window(schedule, start, until, limit=9)
        pages += window.times
        if not window.truncated:
            break
        start = window.times[-1]
    assert pages == fires_between(schedule, after, until)
    assert len(pages) > 9


def test_equal_forms_give_equal_times() -> None:
    """Forms cron reads alike (names in any case, 7 for Sunday, leading zeros) are the
    same schedule."""
    start, end = s("2026-01-01T00:00Z") * 1000, s("2026-03-01T00:00Z") * 1000
    for a, b in itertools.pairwise(["0 9 * * MON-FRI", "0 9 * * mon-fri", "00 09 * * 1-5"]):
        assert fires_between(CronSchedule(a), start, end) == fires_between(
            CronSchedule(b), start, end
        )
    for a, b in [("0 0 * * 0", "0 0 * * 7"), ("0 0 * * 5L", "0 0 * * L5")]:
        assert fires_between(CronSchedule(a), start, end) == fires_between(
            CronSchedule(b), start, end
        )
