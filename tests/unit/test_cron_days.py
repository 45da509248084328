"""Cron's day rule, checked against an oracle (issue 35): a day matches day-of-month OR
day-of-week when both fields are restricted, AND when either starts with `*` (cron
looks at the first character, so `*/2` and `*/7` count as stars), as cronie, Vixie cron
and Debian's cron do. The oracle scans every day of two years with its own reading of
the fields; cronlog's fire times must be exactly the days it finds."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta

import pytest

from schemas.spec import CronSchedule
from streams.core.schedule import fires_between

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
