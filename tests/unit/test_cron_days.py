"""Cron's day rule, checked against an oracle (issue 35): a day matches day-of-month OR
day-of-week when both fields are restricted, AND when either starts with `*` (cron
looks at the first character, so `*/2` and `*/7` count as stars), as cronie, Vixie cron
and Debian's cron do. The oracle scans every day of two years with its own reading of
the fields; cronlog's fire times must be exactly the days it finds."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, date, datetime, timedelta

import pytest

from schemas.spec import CronSchedule
from streams.core.schedule import ScheduleError, fires_between, next_fire

DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
DOM_FIELDS = ["*", "*/2", "*/7", "1-15", "13", "1,15", "2-30/3"]
DOW_FIELDS = ["*", "*/2", "*/3", "MON", "1-5", "0", "FRI,SAT", "2-6/2"]
START = date(2026, 1, 1)
SPAN_DAYS = 2 * 366


def _values(field: str, low: int, high: int) -> set[int]:
    """The values a cron field names (the forms the table uses: *, n, a-b, lists,
    steps, day names)."""
    found: set[int] = set()
    for part in field.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, b = base.split("-")
            first, last = _number(a), _number(b)
        else:
            first = last = _number(base)
        found.update(range(first, last + 1, int(step) if step else 1))
    return found


def _number(text: str) -> int:
    return DAYS.index(text) if text in DAYS else int(text)


def _cron_days(dom: str, dow: str) -> list[date]:
    """The days cron fires `0 0 dom * dow` on, by cron's rule."""
    doms, dows = _values(dom, 1, 31), {d % 7 for d in _values(dow, 0, 7)}
    star = dom.startswith("*") or dow.startswith("*")
    days = []
    for offset in range(SPAN_DAYS):
        day = START + timedelta(days=offset)
        on_dom, on_dow = day.day in doms, (day.isoweekday() % 7) in dows
        if (on_dom and on_dow) if star else (on_dom or on_dow):
            days.append(day)
    return days


def _ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(("dom", "dow"), list(itertools.product(DOM_FIELDS, DOW_FIELDS)))
def test_days_follow_crons_rule(dom: str, dow: str) -> None:
    schedule = CronSchedule(f"0 0 {dom} * {dow}", "UTC")
    fires = fires_between(schedule, _ms(START) - 1, _ms(START + timedelta(days=SPAN_DAYS)) - 1)
    got = [datetime.fromtimestamp(ms / 1000, UTC).date() for ms in fires]
    assert got == _cron_days(dom, dow)


def test_the_case_the_review_found() -> None:
    """`0 0 */2 * MON`: Mondays that are odd days, not odd days and Mondays."""
    fires = fires_between(
        CronSchedule("0 0 */2 * MON", "UTC"), _ms(date(2026, 1, 1)) - 1, _ms(date(2026, 3, 1))
    )
    days = [datetime.fromtimestamp(ms / 1000, UTC).date().isoformat() for ms in fires]
    assert days == ["2026-01-05", "2026-01-19", "2026-02-09", "2026-02-23"]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "minute field: 61 is out of range 0-59"),
        ("0 24 * * *", "hour field: 24 is out of range 0-23"),
        ("0 0 32 * *", "day-of-month field: 32 is out of range 1-31"),
        ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("0 0 * 13 *", "month field: 13 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("5-5/0 * * * *", "a step must be at least 1"),
        ("0 0 * * 7-0", "a range must go from low to high"),
        ("30-10 * * * *", "a range must go from low to high"),
        ("0 0 * * 1#0", "the week after # must be 1-5"),
        ("0 0 * * 1#6", "the week after # must be 1-5"),
        ("0\u00a00 * * *", "fields are separated by spaces or tabs"),
        ("0 0 * * *\u2003", "fields are separated by spaces or tabs"),
        ("60 0 0 * * *", "second field: 60 is out of range 0-59"),
        ("0 0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
    ],
)
def test_fields_cron_refuses_are_refused_naming_the_field(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        next_fire(CronSchedule(expr, "UTC"), 0)


@pytest.mark.parametrize(
    ("expr", "same_as"),
    [
        ("0 05-5 * * *", "0 5 * * *"),  # was read as `*`: every hour
        ("0 5-5/2 * * *", "0 5 * * *"),
        ("0 0 * * 7", "0 0 * * 0"),  # Sunday as 7
        ("0 0 0 * * 7", "0 0 0 * * 0"),  # and in the 6-field form
        ("0 0 * * MON-MON", "0 0 * * 1"),
    ],
)
def test_forms_cron_reads_as_one_value(expr: str, same_as: str) -> None:
    start, end = _ms(START), _ms(START + timedelta(days=30))
    assert fires_between(CronSchedule(expr, "UTC"), start, end) == fires_between(
        CronSchedule(same_as, "UTC"), start, end
    )


@pytest.mark.parametrize(
    ("expr", "days"),
    [
        # Both day fields restricted: either day. Cron runs these; they were refused as
        # "never fires" (croniter's own OR looks for a 30th of February).
        ("0 0 30 2 MON", ["2026-02-02", "2026-02-09", "2026-02-16", "2026-02-23"]),
        ("0 0 31 2 0", ["2026-02-01", "2026-02-08", "2026-02-15", "2026-02-22"]),
        # The 1st of each month or its second Friday (the day of the month was dropped).
        ("0 0 1 * 5#2", ["2026-01-09", "2026-02-01", "2026-02-13", "2026-03-01"]),
    ],
)
def test_both_day_fields_restricted_means_either_day(expr: str, days: list[str]) -> None:
    fires = fires_between(CronSchedule(expr, "UTC"), _ms(START), _ms(date(2026, 12, 31)))
    got = [datetime.fromtimestamp(ms / 1000, UTC).date().isoformat() for ms in fires]
    assert got[: len(days)] == days
