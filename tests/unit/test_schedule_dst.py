"""Cron schedules across daylight-saving changes: hand-computed tables, and properties of
the `auto` policy.

2026 transitions used here (all on Sundays, local time):
- Europe/Berlin spring forward 2026-03-29 01:00Z: 02:00 CET (+01) -> 03:00 CEST (+02);
  fall back 2026-10-25 01:00Z: 03:00 CEST -> 02:00 CET.
- America/New_York spring forward 2026-03-08 07:00Z: 02:00 EST (-05) -> 03:00 EDT (-04);
  fall back 2026-11-01 06:00Z: 02:00 EDT -> 01:00 EST.
- Europe/London spring forward 2026-03-29 01:00Z: 01:00 GMT (+00) -> 02:00 BST (+01);
  fall back 2026-10-25 01:00Z: 02:00 BST -> 01:00 GMT.
- Australia/Sydney fall back 2026-04-05 (04-04 16:00Z): 03:00 AEDT (+11) -> 02:00 AEST
  (+10); spring forward 2026-10-04 (10-03 16:00Z): 02:00 AEST -> 03:00 AEDT.
- Australia/Lord_Howe (half-hour changes) fall back 2026-04-05 (04-04 15:00Z): 02:00
  (+11) -> 01:30 (+10:30); spring forward 2026-10-04 (10-03 15:30Z): 02:00 -> 02:30.

Every expected instant below is written out in UTC, worked out by hand from those offsets.

`auto` (the default): an expression whose minute or hour field begins with `*` (cronie's
MIN_STAR/HR_STAR flags) is elapsed-time and fires at exactly the instants whose local wall
time matches (twice in a repeated hour, never for a gap's wall times); any other, steps
such as `0-59/15` or `1-23/2` included, is fixed-time and behaves as `run_once`.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schemas.spec import DST_POLICIES, CronSchedule, DstPolicy
from streams.core.ids import iso_utc
from streams.core.schedule import fires_between, next_fire

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
LONDON = "Europe/London"
SYDNEY = "Australia/Sydney"
LORD_HOWE = "Australia/Lord_Howe"

MINUTE_MS = 60_000


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def isos(values: list[int]) -> list[str]:
    return [iso_utc(value) for value in values]


# (expr, zone, after, until, {policy: expected fires})
TABLE: list[tuple[str, str, str, str, dict[DstPolicy, list[str]]]] = [
    # Berlin spring forward: 02:30 does not exist on 03-29.
    (
        "30 2 * * *",
        BERLIN,
        "2026-03-27T12:00Z",
        "2026-03-30T12:00Z",
        {
            # 03-28 02:30 CET; 03-29 02:30 shifted = 03:30 CEST; 03-30 02:30 CEST.
            "run_once": ["2026-03-28T01:30Z", "2026-03-29T01:30Z", "2026-03-30T00:30Z"],
            "both": ["2026-03-28T01:30Z", "2026-03-29T01:30Z", "2026-03-30T00:30Z"],
            "skip": ["2026-03-28T01:30Z", "2026-03-30T00:30Z"],
            "auto": ["2026-03-28T01:30Z", "2026-03-29T01:30Z", "2026-03-30T00:30Z"],
        },
    ),
    # Berlin fall back: 02:30 happens twice on 10-25 (CEST, then CET).
    (
        "30 2 * * *",
        BERLIN,
        "2026-10-23T12:00Z",
        "2026-10-26T12:00Z",
        {
            "run_once": ["2026-10-24T00:30Z", "2026-10-25T00:30Z", "2026-10-26T01:30Z"],
            "both": [
                "2026-10-24T00:30Z",
                "2026-10-25T00:30Z",
                "2026-10-25T01:30Z",
                "2026-10-26T01:30Z",
            ],
            "skip": ["2026-10-24T00:30Z", "2026-10-26T01:30Z"],
            "auto": ["2026-10-24T00:30Z", "2026-10-25T00:30Z", "2026-10-26T01:30Z"],
        },
    ),
    # New York fall back: 01:30 happens twice on 11-01 (EDT, then EST).
    (
        "30 1 * * *",
        NEW_YORK,
        "2026-10-30T12:00Z",
        "2026-11-02T12:00Z",
        {
            "run_once": ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"],
            "both": [
                "2026-10-31T05:30Z",
                "2026-11-01T05:30Z",
                "2026-11-01T06:30Z",
                "2026-11-02T06:30Z",
            ],
            "skip": ["2026-10-31T05:30Z", "2026-11-02T06:30Z"],
            "auto": ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"],
        },
    ),
    # New York spring forward: 02:30 does not exist on 03-08; shifted = 03:30 EDT.
    (
        "30 2 * * *",
        NEW_YORK,
        "2026-03-06T12:00Z",
        "2026-03-09T12:00Z",
        {
            "run_once": ["2026-03-07T07:30Z", "2026-03-08T07:30Z", "2026-03-09T06:30Z"],
            "both": ["2026-03-07T07:30Z", "2026-03-08T07:30Z", "2026-03-09T06:30Z"],
            "skip": ["2026-03-07T07:30Z", "2026-03-09T06:30Z"],
            "auto": ["2026-03-07T07:30Z", "2026-03-08T07:30Z", "2026-03-09T06:30Z"],
        },
    ),
    # New York fall back, 02:30: 02:00 EDT becomes 01:00 EST, so 02:30 EST exists once.
    (
        "30 2 * * *",
        NEW_YORK,
        "2026-10-31T12:00Z",
        "2026-11-01T12:00Z",
        {
            "run_once": ["2026-11-01T07:30Z"],
            "both": ["2026-11-01T07:30Z"],
            "skip": ["2026-11-01T07:30Z"],
            "auto": ["2026-11-01T07:30Z"],
        },
    ),
    # Every 15 minutes, Berlin spring forward: the shifted gap times 02:00..02:45 CET
    # coincide with 03:00..03:45 CEST and fire once; the UTC rhythm is unbroken, even
    # with skip.
    (
        "*/15 * * * *",
        BERLIN,
        "2026-03-29T00:30Z",
        "2026-03-29T02:00Z",
        {
            policy: [
                "2026-03-29T00:45Z",
                "2026-03-29T01:00Z",
                "2026-03-29T01:15Z",
                "2026-03-29T01:30Z",
                "2026-03-29T01:45Z",
                "2026-03-29T02:00Z",
            ]
            for policy in DST_POLICIES
        },
    ),
    # Every 15 minutes, Berlin fall back: 02:00..02:45 local happen at 00:00..00:45Z (CEST)
    # and again at 01:00..01:45Z (CET).
    (
        "*/15 * * * *",
        BERLIN,
        "2026-10-24T23:30Z",
        "2026-10-25T02:00Z",
        {
            "run_once": [
                "2026-10-24T23:45Z",
                "2026-10-25T00:00Z",
                "2026-10-25T00:15Z",
                "2026-10-25T00:30Z",
                "2026-10-25T00:45Z",
                "2026-10-25T02:00Z",
            ],
            "both": [
                "2026-10-24T23:45Z",
                "2026-10-25T00:00Z",
                "2026-10-25T00:15Z",
                "2026-10-25T00:30Z",
                "2026-10-25T00:45Z",
                "2026-10-25T01:00Z",
                "2026-10-25T01:15Z",
                "2026-10-25T01:30Z",
                "2026-10-25T01:45Z",
                "2026-10-25T02:00Z",
            ],
            "skip": ["2026-10-24T23:45Z", "2026-10-25T02:00Z"],
            # Elapsed-time (minute and hour fields begin with *): as both.
            "auto": [
                "2026-10-24T23:45Z",
                "2026-10-25T00:00Z",
                "2026-10-25T00:15Z",
                "2026-10-25T00:30Z",
                "2026-10-25T00:45Z",
                "2026-10-25T01:00Z",
                "2026-10-25T01:15Z",
                "2026-10-25T01:30Z",
                "2026-10-25T01:45Z",
                "2026-10-25T02:00Z",
            ],
        },
    ),
    # Every 15 minutes, New York spring forward (gap 02:00..02:59 EST = 07:00..07:59Z).
    (
        "*/15 * * * *",
        NEW_YORK,
        "2026-03-08T06:30Z",
        "2026-03-08T08:00Z",
        {
            policy: [
                "2026-03-08T06:45Z",
                "2026-03-08T07:00Z",
                "2026-03-08T07:15Z",
                "2026-03-08T07:30Z",
                "2026-03-08T07:45Z",
                "2026-03-08T08:00Z",
            ]
            for policy in DST_POLICIES
        },
    ),
    # Every 15 minutes, New York fall back: 01:00..01:45 local happen at 05:00..05:45Z (EDT)
    # and again at 06:00..06:45Z (EST).
    (
        "*/15 * * * *",
        NEW_YORK,
        "2026-11-01T04:30Z",
        "2026-11-01T07:00Z",
        {
            "run_once": [
                "2026-11-01T04:45Z",
                "2026-11-01T05:00Z",
                "2026-11-01T05:15Z",
                "2026-11-01T05:30Z",
                "2026-11-01T05:45Z",
                "2026-11-01T07:00Z",
            ],
            "both": [
                "2026-11-01T04:45Z",
                "2026-11-01T05:00Z",
                "2026-11-01T05:15Z",
                "2026-11-01T05:30Z",
                "2026-11-01T05:45Z",
                "2026-11-01T06:00Z",
                "2026-11-01T06:15Z",
                "2026-11-01T06:30Z",
                "2026-11-01T06:45Z",
                "2026-11-01T07:00Z",
            ],
            "skip": ["2026-11-01T04:45Z", "2026-11-01T07:00Z"],
            "auto": [
                "2026-11-01T04:45Z",
                "2026-11-01T05:00Z",
                "2026-11-01T05:15Z",
                "2026-11-01T05:30Z",
                "2026-11-01T05:45Z",
                "2026-11-01T06:00Z",
                "2026-11-01T06:15Z",
                "2026-11-01T06:30Z",
                "2026-11-01T06:45Z",
                "2026-11-01T07:00Z",
            ],
        },
    ),
    # Berlin spring forward, wall times on both sides of the gap: 02:10 and 02:50 CET are
    # shifted onto 01:10Z and 01:50Z, which 03:10 and 03:50 CEST also denote. In wall-clock
    # order the instants go 01:10, 01:50, 01:10, 01:50; each fires once, in order.
    (
        "10,50 2,3 * * *",
        BERLIN,
        "2026-03-29T00:00Z",
        "2026-03-29T12:00Z",
        {policy: ["2026-03-29T01:10Z", "2026-03-29T01:50Z"] for policy in DST_POLICIES},
    ),
    # Seconds field across the Berlin fall back: 02:59:30 local, twice.
    (
        "30 59 2 * * *",
        BERLIN,
        "2026-10-25T00:00Z",
        "2026-10-25T03:00Z",
        {
            "run_once": ["2026-10-25T00:59:30Z"],
            "both": ["2026-10-25T00:59:30Z", "2026-10-25T01:59:30Z"],
            "skip": [],
            "auto": ["2026-10-25T00:59:30Z"],  # the seconds field does not count: fixed-time
        },
    ),
    # Pacific/Apia skipped Friday 2011-12-30 entirely (-10 -> +14 at 2011-12-30T10:00Z).
    # Noon of 12-30 is shifted by 24 h onto the instant of noon of 12-31; it fires once.
    (
        "0 12 * * *",
        "Pacific/Apia",
        "2011-12-28T00:00Z",
        "2012-01-01T00:00Z",
        {
            "run_once": [
                "2011-12-28T22:00Z",
                "2011-12-29T22:00Z",
                "2011-12-30T22:00Z",
                "2011-12-31T22:00Z",
            ],
            "both": [
                "2011-12-28T22:00Z",
                "2011-12-29T22:00Z",
                "2011-12-30T22:00Z",
                "2011-12-31T22:00Z",
            ],
            # Without the shift, noon of 12-31 still denotes 2011-12-30T22:00Z.
            "skip": [
                "2011-12-28T22:00Z",
                "2011-12-29T22:00Z",
                "2011-12-30T22:00Z",
                "2011-12-31T22:00Z",
            ],
            "auto": [
                "2011-12-28T22:00Z",
                "2011-12-29T22:00Z",
                "2011-12-30T22:00Z",
                "2011-12-31T22:00Z",
            ],
        },
    ),
]


def at(day: str, *times: str) -> list[str]:
    """Instants of one UTC day: at("2026-11-01", "05:00", "05:30")."""
    return [f"{day}T{time}Z" for time in times]


def every(first: str, last: str, minutes: int) -> list[str]:
    """first, first + minutes, ..., last (UTC, inclusive)."""
    return [iso_utc(t) for t in range(ms(first), ms(last) + 1, minutes * MINUTE_MS)]


def policies(
    run_once: list[str],
    both: list[str] | None = None,
    skip: list[str] | None = None,
    auto: list[str] | None = None,
) -> dict[DstPolicy, list[str]]:
    """Expected fires per policy; an omitted policy expects what run_once does."""
    return {
        "run_once": run_once,
        "both": run_once if both is None else both,
        "skip": run_once if skip is None else skip,
        "auto": run_once if auto is None else auto,
    }


# Frequent and fixed-time jobs across both changes, in both hemispheres, for every policy.
# The issue: New York fall back, */30 under run_once fires 01:00 and 01:30 EDT, then
# nothing until 02:00 EST, 90 minutes later; auto fires every 30 minutes of real time.
AUTO_TABLE: list[tuple[str, str, str, str, dict[DstPolicy, list[str]]]] = [
    # --- America/New_York fall back (01:00..01:59 at 05:00..05:59Z EDT and 06:00..06:59Z
    # EST), from 00:00 EDT to 03:00 EST.
    (
        "*/30 * * * *",
        NEW_YORK,
        "2026-11-01T04:00Z",
        "2026-11-01T08:00Z",
        policies(
            run_once=at("2026-11-01", "04:30", "05:00", "05:30", "07:00", "07:30", "08:00"),
            both=every("2026-11-01T04:30Z", "2026-11-01T08:00Z", 30),
            skip=at("2026-11-01", "04:30", "07:00", "07:30", "08:00"),
            auto=every("2026-11-01T04:30Z", "2026-11-01T08:00Z", 30),
        ),
    ),
    (
        "*/15 * * * *",
        NEW_YORK,
        "2026-11-01T04:00Z",
        "2026-11-01T08:00Z",
        policies(
            run_once=every("2026-11-01T04:15Z", "2026-11-01T05:45Z", 15)
            + every("2026-11-01T07:00Z", "2026-11-01T08:00Z", 15),
            both=every("2026-11-01T04:15Z", "2026-11-01T08:00Z", 15),
            skip=at("2026-11-01", "04:15", "04:30", "04:45")
            + every("2026-11-01T07:00Z", "2026-11-01T08:00Z", 15),
            auto=every("2026-11-01T04:15Z", "2026-11-01T08:00Z", 15),
        ),
    ),
    (
        "0 * * * *",
        NEW_YORK,
        "2026-11-01T04:00Z",
        "2026-11-01T08:00Z",
        policies(
            run_once=at("2026-11-01", "05:00", "07:00", "08:00"),
            both=at("2026-11-01", "05:00", "06:00", "07:00", "08:00"),
            skip=at("2026-11-01", "07:00", "08:00"),
            auto=at("2026-11-01", "05:00", "06:00", "07:00", "08:00"),
        ),
    ),
    # Fixed-time in the repeated hour: once, at 01:15 EDT.
    (
        "15 1 * * *",
        NEW_YORK,
        "2026-10-31T12:00Z",
        "2026-11-02T12:00Z",
        policies(
            run_once=["2026-11-01T05:15Z", "2026-11-02T06:15Z"],
            both=["2026-11-01T05:15Z", "2026-11-01T06:15Z", "2026-11-02T06:15Z"],
            skip=["2026-11-02T06:15Z"],
        ),
    ),
    # 02:30 exists once on the fall-back day (EST).
    (
        "30 2 * * *",
        NEW_YORK,
        "2026-10-31T12:00Z",
        "2026-11-02T12:00Z",
        policies(run_once=["2026-11-01T07:30Z", "2026-11-02T07:30Z"]),
    ),
    # --- America/New_York spring forward (gap 02:00..02:59 EST), 00:00 EST to 04:00 EDT.
    # A gap's wall times of a frequent job coincide with the wall times after it, so every
    # policy keeps the 30-minute rhythm in real time.
    (
        "*/30 * * * *",
        NEW_YORK,
        "2026-03-08T05:00Z",
        "2026-03-08T08:00Z",
        policies(run_once=every("2026-03-08T05:30Z", "2026-03-08T08:00Z", 30)),
    ),
    (
        "*/15 * * * *",
        NEW_YORK,
        "2026-03-08T05:00Z",
        "2026-03-08T08:00Z",
        policies(run_once=every("2026-03-08T05:15Z", "2026-03-08T08:00Z", 15)),
    ),
    (
        "0 * * * *",
        NEW_YORK,
        "2026-03-08T05:00Z",
        "2026-03-08T08:00Z",
        policies(run_once=at("2026-03-08", "06:00", "07:00", "08:00")),
    ),
    (
        "15 1 * * *",
        NEW_YORK,
        "2026-03-07T12:00Z",
        "2026-03-09T12:00Z",
        policies(run_once=["2026-03-08T06:15Z", "2026-03-09T05:15Z"]),
    ),
    # Fixed-time in the gap: at the shifted instant, 03:30 EDT (skip: not at all).
    (
        "30 2 * * *",
        NEW_YORK,
        "2026-03-07T12:00Z",
        "2026-03-09T12:00Z",
        policies(run_once=["2026-03-08T07:30Z", "2026-03-09T06:30Z"], skip=["2026-03-09T06:30Z"]),
    ),
    # --- Europe/London fall back (01:00..01:59 at 00:00..00:59Z BST and 01:00..01:59Z
    # GMT), from 00:00 BST to 03:00 GMT.
    (
        "*/30 * * * *",
        LONDON,
        "2026-10-24T23:00Z",
        "2026-10-25T03:00Z",
        policies(
            run_once=[
                "2026-10-24T23:30Z",
                *at("2026-10-25", "00:00", "00:30", "02:00", "02:30", "03:00"),
            ],
            both=every("2026-10-24T23:30Z", "2026-10-25T03:00Z", 30),
            skip=["2026-10-24T23:30Z", *at("2026-10-25", "02:00", "02:30", "03:00")],
            auto=every("2026-10-24T23:30Z", "2026-10-25T03:00Z", 30),
        ),
    ),
    (
        "*/15 * * * *",
        LONDON,
        "2026-10-24T23:00Z",
        "2026-10-25T03:00Z",
        policies(
            run_once=every("2026-10-24T23:15Z", "2026-10-25T00:45Z", 15)
            + every("2026-10-25T02:00Z", "2026-10-25T03:00Z", 15),
            both=every("2026-10-24T23:15Z", "2026-10-25T03:00Z", 15),
            skip=at("2026-10-24", "23:15", "23:30", "23:45")
            + every("2026-10-25T02:00Z", "2026-10-25T03:00Z", 15),
            auto=every("2026-10-24T23:15Z", "2026-10-25T03:00Z", 15),
        ),
    ),
    (
        "0 * * * *",
        LONDON,
        "2026-10-24T23:00Z",
        "2026-10-25T03:00Z",
        policies(
            run_once=at("2026-10-25", "00:00", "02:00", "03:00"),
            both=at("2026-10-25", "00:00", "01:00", "02:00", "03:00"),
            skip=at("2026-10-25", "02:00", "03:00"),
            auto=at("2026-10-25", "00:00", "01:00", "02:00", "03:00"),
        ),
    ),
    (
        "15 1 * * *",
        LONDON,
        "2026-10-24T12:00Z",
        "2026-10-26T12:00Z",
        policies(
            run_once=["2026-10-25T00:15Z", "2026-10-26T01:15Z"],
            both=["2026-10-25T00:15Z", "2026-10-25T01:15Z", "2026-10-26T01:15Z"],
            skip=["2026-10-26T01:15Z"],
        ),
    ),
    (
        "30 2 * * *",
        LONDON,
        "2026-10-24T12:00Z",
        "2026-10-26T12:00Z",
        policies(run_once=["2026-10-25T02:30Z", "2026-10-26T02:30Z"]),
    ),
    # --- Europe/London spring forward (gap 01:00..01:59 GMT), 23:00 GMT to 04:00 BST.
    (
        "*/30 * * * *",
        LONDON,
        "2026-03-28T23:00Z",
        "2026-03-29T03:00Z",
        policies(run_once=every("2026-03-28T23:30Z", "2026-03-29T03:00Z", 30)),
    ),
    (
        "*/15 * * * *",
        LONDON,
        "2026-03-28T23:00Z",
        "2026-03-29T03:00Z",
        policies(run_once=every("2026-03-28T23:15Z", "2026-03-29T03:00Z", 15)),
    ),
    (
        "0 * * * *",
        LONDON,
        "2026-03-28T23:00Z",
        "2026-03-29T03:00Z",
        policies(run_once=at("2026-03-29", "00:00", "01:00", "02:00", "03:00")),
    ),
    # Fixed-time in London's gap: 01:15 GMT is shifted to 02:15 BST.
    (
        "15 1 * * *",
        LONDON,
        "2026-03-28T12:00Z",
        "2026-03-30T12:00Z",
        policies(run_once=["2026-03-29T01:15Z", "2026-03-30T00:15Z"], skip=["2026-03-30T00:15Z"]),
    ),
    (
        "30 2 * * *",
        LONDON,
        "2026-03-28T12:00Z",
        "2026-03-30T12:00Z",
        policies(run_once=["2026-03-29T01:30Z", "2026-03-30T01:30Z"]),
    ),
    # --- Australia/Sydney fall back in April (02:00..02:59 at 15:00..15:59Z AEDT and
    # 16:00..16:59Z AEST), from 01:00 AEDT to 04:00 AEST.
    (
        "*/30 * * * *",
        SYDNEY,
        "2026-04-04T14:00Z",
        "2026-04-04T18:00Z",
        policies(
            run_once=at("2026-04-04", "14:30", "15:00", "15:30", "17:00", "17:30", "18:00"),
            both=every("2026-04-04T14:30Z", "2026-04-04T18:00Z", 30),
            skip=at("2026-04-04", "14:30", "17:00", "17:30", "18:00"),
            auto=every("2026-04-04T14:30Z", "2026-04-04T18:00Z", 30),
        ),
    ),
    (
        "30 2 * * *",
        SYDNEY,
        "2026-04-03T12:00Z",
        "2026-04-05T12:00Z",
        policies(
            run_once=["2026-04-03T15:30Z", "2026-04-04T15:30Z"],
            both=["2026-04-03T15:30Z", "2026-04-04T15:30Z", "2026-04-04T16:30Z"],
            skip=["2026-04-03T15:30Z"],
        ),
    ),
    # --- Australia/Sydney spring forward in October (gap 02:00..02:59 AEST).
    (
        "*/30 * * * *",
        SYDNEY,
        "2026-10-03T14:00Z",
        "2026-10-03T17:00Z",
        policies(run_once=every("2026-10-03T14:30Z", "2026-10-03T17:00Z", 30)),
    ),
    (
        "30 2 * * *",
        SYDNEY,
        "2026-10-02T12:00Z",
        "2026-10-04T18:00Z",
        policies(
            run_once=["2026-10-02T16:30Z", "2026-10-03T16:30Z", "2026-10-04T15:30Z"],
            skip=["2026-10-02T16:30Z", "2026-10-04T15:30Z"],
        ),
    ),
    # --- Where auto differs from both in a gap. Every two hours, New York spring forward:
    # 02:00 EST does not exist. auto fires at the instants whose wall time matches, as
    # cron does: 00:00 EST, then 04:00 EDT (3 h of real time); run_once and both add
    # 02:00 shifted to 03:00 EDT.
    (
        "0 */2 * * *",
        NEW_YORK,
        "2026-03-08T04:00Z",
        "2026-03-08T09:00Z",
        policies(
            run_once=at("2026-03-08", "05:00", "07:00", "08:00"),
            skip=at("2026-03-08", "05:00", "08:00"),
            auto=at("2026-03-08", "05:00", "08:00"),
        ),
    ),
    # Lord Howe moves by 30 minutes (02:00 -> 02:30): 00:00 at 13:30Z, then 04:00 at
    # 17:00Z under auto, 3.5 h: more than the period plus the shift (see the gap bound).
    (
        "0 */2 * * *",
        LORD_HOWE,
        "2026-10-03T12:00Z",
        "2026-10-03T18:00Z",
        policies(
            run_once=at("2026-10-03", "13:30", "15:30", "17:00"),
            skip=at("2026-10-03", "13:30", "17:00"),
            auto=at("2026-10-03", "13:30", "17:00"),
        ),
    ),
    # A minute step with a fixed hour is elapsed-time (cron: the minute field begins with
    # *): no wall time of hour 2 exists on the spring-forward day, so auto does not fire.
    (
        "*/20 2 * * *",
        NEW_YORK,
        "2026-03-08T00:00Z",
        "2026-03-09T00:00Z",
        policies(run_once=at("2026-03-08", "07:00", "07:20", "07:40"), skip=[], auto=[]),
    ),
    # ... and it fires through both 01:00..01:59 of the fall back.
    (
        "*/20 1 * * *",
        NEW_YORK,
        "2026-11-01T00:00Z",
        "2026-11-02T00:00Z",
        policies(
            run_once=at("2026-11-01", "05:00", "05:20", "05:40"),
            both=every("2026-11-01T05:00Z", "2026-11-01T06:40Z", 20),
            skip=[],
            auto=every("2026-11-01T05:00Z", "2026-11-01T06:40Z", 20),
        ),
    ),
    # The classification, at the New York fall back (04:00Z..08:00Z = 00:00 EDT..03:00 EST):
    # an hour step that does not begin with * is fixed-time, as in cron (01:00 EDT,
    # 03:00 EST; not 01:00 EST) ...
    (
        "0 1-23/2 * * *",
        NEW_YORK,
        "2026-11-01T04:00Z",
        "2026-11-01T08:00Z",
        policies(
            run_once=at("2026-11-01", "05:00", "08:00"),
            both=at("2026-11-01", "05:00", "06:00", "08:00"),
            skip=at("2026-11-01", "08:00"),
        ),
    ),
    # ... as is a list of the same hours ...
    (
        "0 1,3 * * *",
        NEW_YORK,
        "2026-11-01T04:00Z",
        "2026-11-01T08:00Z",
        policies(
            run_once=at("2026-11-01", "05:00", "08:00"),
            both=at("2026-11-01", "05:00", "06:00", "08:00"),
            skip=at("2026-11-01", "08:00"),
        ),
    ),
    # ... and a range, even one covering every hour (cron's rule: only a leading * makes
    # a wildcard).
    (
        "0 0-23 * * *",
        NEW_YORK,
        "2026-11-01T04:00Z",
        "2026-11-01T08:00Z",
        policies(
            run_once=at("2026-11-01", "05:00", "07:00", "08:00"),
            both=at("2026-11-01", "05:00", "06:00", "07:00", "08:00"),
            skip=at("2026-11-01", "07:00", "08:00"),
        ),
    ),
    # The leading seconds field of a 6-field expression does not count: fixed-time.
    (
        "*/30 15 1 * * *",
        NEW_YORK,
        "2026-11-01T05:00Z",
        "2026-11-01T07:00Z",
        policies(
            run_once=["2026-11-01T05:15:00Z", "2026-11-01T05:15:30Z"],
            both=at("2026-11-01", "05:15:00", "05:15:30", "06:15:00", "06:15:30"),
            skip=[],
        ),
    ),
]

CASES = [
    pytest.param(expr, zone, after, until, policy, expected, id=f"{zone}-{expr}-{after}-{policy}")
    for expr, zone, after, until, by_policy in TABLE + AUTO_TABLE
    for policy, expected in by_policy.items()
]


@pytest.mark.parametrize(("expr", "zone", "after", "until", "policy", "expected"), CASES)
def test_dst_table(
    expr: str, zone: str, after: str, until: str, policy: DstPolicy, expected: list[str]
) -> None:
    schedule = CronSchedule(expr, zone)
    fires = fires_between(schedule, ms(after), ms(until), policy)
    assert fires == [ms(iso) for iso in expected], isos(fires)
    # next_fire chained from `after` gives the same instants.
    chained: list[int] = []
    current = next_fire(schedule, ms(after), policy)
    while current is not None and current <= ms(until):
        chained.append(current)
        current = next_fire(schedule, current, policy)
    assert chained == fires


# Starting points inside the transitions, where walking wall-clock time from the start
# would go wrong: (expr, zone, policy, after, expected next fire).
NEXT_CASES: list[tuple[str, str, DstPolicy, str, str]] = [
    # 03:10 CEST on the Berlin spring-forward day: the shifted 02:30 (03:30 CEST) is next.
    ("30 2 * * *", BERLIN, "run_once", "2026-03-29T01:10Z", "2026-03-29T01:30Z"),
    ("30 2 * * *", BERLIN, "both", "2026-03-29T01:10Z", "2026-03-29T01:30Z"),
    ("30 2 * * *", BERLIN, "skip", "2026-03-29T01:10Z", "2026-03-30T00:30Z"),
    # 02:45 CEST on the Berlin fall-back day: 02:30 CET (the repeat) is next under `both`.
    ("30 2 * * *", BERLIN, "both", "2026-10-25T00:45Z", "2026-10-25T01:30Z"),
    ("30 2 * * *", BERLIN, "run_once", "2026-10-25T00:45Z", "2026-10-26T01:30Z"),
    ("30 2 * * *", BERLIN, "skip", "2026-10-25T00:45Z", "2026-10-26T01:30Z"),
    # 02:10 CET (the second 02:10) on the same day.
    ("30 2 * * *", BERLIN, "both", "2026-10-25T01:10Z", "2026-10-25T01:30Z"),
    ("30 2 * * *", BERLIN, "run_once", "2026-10-25T01:10Z", "2026-10-26T01:30Z"),
    # 01:45 EST (the second 01:45) on the New York fall-back day: 02:00 EST is next.
    ("0 * * * *", NEW_YORK, "run_once", "2026-11-01T06:45Z", "2026-11-01T07:00Z"),
    ("0 * * * *", NEW_YORK, "both", "2026-11-01T05:30Z", "2026-11-01T06:00Z"),
    ("0 * * * *", NEW_YORK, "run_once", "2026-11-01T05:30Z", "2026-11-01T07:00Z"),
    # Pacific/Apia's 24-hour gap: noon of the skipped 2011-12-30 fires at 22:00Z (12 h
    # after the jump), when no other wall time matches; under skip, noon of 2012-12-30
    # (+14) is next.
    ("0 12 30 12 *", "Pacific/Apia", "run_once", "2011-12-30T15:00Z", "2011-12-30T22:00Z"),
    ("0 12 30 12 *", "Pacific/Apia", "skip", "2011-12-30T15:00Z", "2012-12-29T22:00Z"),
    # One millisecond before / at a shifted fire.
    ("30 2 * * *", NEW_YORK, "run_once", "2026-03-08T07:29:59.999Z", "2026-03-08T07:30Z"),
    ("30 2 * * *", NEW_YORK, "run_once", "2026-03-08T07:30Z", "2026-03-09T06:30Z"),
    # auto, from inside New York's repeated hour: 01:45 EDT, then 01:00 EST is next for an
    # elapsed-time job, 02:00 EST under run_once; from 01:10 EST, 01:30 EST.
    ("*/30 * * * *", NEW_YORK, "auto", "2026-11-01T05:45Z", "2026-11-01T06:00Z"),
    ("*/30 * * * *", NEW_YORK, "run_once", "2026-11-01T05:45Z", "2026-11-01T07:00Z"),
    ("*/30 * * * *", NEW_YORK, "auto", "2026-11-01T06:10Z", "2026-11-01T06:30Z"),
    # A fixed-time job that ran at 01:15 EDT: next day's 01:15 EST.
    ("15 1 * * *", NEW_YORK, "auto", "2026-11-01T05:30Z", "2026-11-02T06:15Z"),
    ("15 1 * * *", NEW_YORK, "auto", "2026-11-01T06:00Z", "2026-11-02T06:15Z"),
    # Every two hours from 00:00 EST on the spring-forward day: 04:00 EDT under auto.
    ("0 */2 * * *", NEW_YORK, "auto", "2026-03-08T05:00Z", "2026-03-08T08:00Z"),
    ("0 */2 * * *", NEW_YORK, "run_once", "2026-03-08T05:00Z", "2026-03-08T07:00Z"),
    # Hour 2 does not exist on 03-08: the next 02:00 is 03-09 02:00 EDT.
    ("*/20 2 * * *", NEW_YORK, "auto", "2026-03-08T06:59Z", "2026-03-09T06:00Z"),
]


@pytest.mark.parametrize(("expr", "zone", "policy", "after", "expected"), NEXT_CASES)
def test_next_fire_inside_transition(
    expr: str, zone: str, policy: DstPolicy, after: str, expected: str
) -> None:
    assert next_fire(CronSchedule(expr, zone), ms(after), policy) == ms(expected)


def test_hourly_cron_across_fall_back_keeps_utc_order() -> None:
    # Berlin "0 * * * *" on 2026-10-25: 02:00 local is at 00:00Z (CEST) and 01:00Z (CET).
    schedule = CronSchedule("0 * * * *", BERLIN)
    after, until = ms("2026-10-24T22:30Z"), ms("2026-10-25T03:00Z")
    assert fires_between(schedule, after, until, "both") == [
        ms(f"2026-10-{day}T{hour}:00Z")
        for day, hour in [("24", "23"), ("25", "00"), ("25", "01"), ("25", "02"), ("25", "03")]
    ]
    assert fires_between(schedule, after, until, "run_once") == [
        ms(f"2026-10-{day}T{hour}:00Z")
        for day, hour in [("24", "23"), ("25", "00"), ("25", "02"), ("25", "03")]
    ]
    assert fires_between(schedule, after, until, "skip") == [
        ms(f"2026-10-{day}T{hour}:00Z") for day, hour in [("24", "23"), ("25", "02"), ("25", "03")]
    ]


# --- properties of auto --------------------------------------------------------------------

DAY_MS = 24 * 60 * MINUTE_MS

# (zone, instant of a 2026 offset change, its size in minutes), from the list at the top.
CHANGES: list[tuple[str, str, int]] = [
    (NEW_YORK, "2026-03-08T07:00Z", 60),
    (NEW_YORK, "2026-11-01T06:00Z", 60),
    (LONDON, "2026-03-29T01:00Z", 60),
    (LONDON, "2026-10-25T01:00Z", 60),
    (SYDNEY, "2026-04-04T16:00Z", 60),
    (SYDNEY, "2026-10-03T16:00Z", 60),
    (LORD_HOWE, "2026-04-04T15:00Z", 30),
    (LORD_HOWE, "2026-10-03T15:30Z", 30),
]
# Whole-hour offsets that change by one hour.
HOUR_CHANGES = [change for change in CHANGES if change[0] != LORD_HOWE]


def test_the_changes_are_offset_changes() -> None:
    for zone, iso, size in CHANGES:
        instant = ms(iso) // 1000
        before = datetime.fromtimestamp(instant - 1, ZoneInfo(zone)).utcoffset()
        after = datetime.fromtimestamp(instant, ZoneInfo(zone)).utcoffset()
        assert before is not None
        assert after is not None
        assert abs(after - before) == timedelta(minutes=size), (zone, iso)


WILD_KINDS = ("*", "step")
FIXED_KINDS = ("range", "range-step", "list", "value")


@st.composite
def cron_field(
    draw: st.DrawFn, low: int, high: int, kinds: tuple[str, ...] = WILD_KINDS + FIXED_KINDS
) -> str:
    """A minute or hour field: *, */n, a-b/n, a-b, a list, or one value."""
    kind = draw(st.sampled_from(kinds))
    if kind == "*":
        return "*"
    if kind == "step":
        return f"*/{draw(st.integers(1, (high - low + 1) // 2))}"
    if kind in ("range-step", "range"):
        # croniter reads a one-value range such as 5-5 as *: not generated.
        first = draw(st.integers(low, high - 1))
        last = draw(st.integers(first + 1, high))
        if kind == "range":
            return f"{first}-{last}"
        return f"{first}-{last}/{draw(st.integers(1, (high - low + 1) // 2))}"
    if kind == "list":
        values = draw(st.lists(st.integers(low, high), min_size=1, max_size=4, unique=True))
        return ",".join(str(value) for value in sorted(values))
    return str(draw(st.integers(low, high)))


def expand(field: str, low: int, high: int) -> set[int]:
    """The values a field of `cron_field` matches."""
    values: set[int] = set()
    for part in field.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = (int(bound) for bound in span.split("-"))
        else:
            first = last = int(span)
        values.update(range(first, last + 1, int(step or 1)))
    return values


def elapsed(*fields: str) -> bool:
    """The rule under test: a minute or hour field that begins with *."""
    return any(field.startswith("*") for field in fields)


@settings(max_examples=60, deadline=None)
@given(
    change=st.sampled_from(CHANGES),
    minute=cron_field(0, 59),
    hour=cron_field(0, 23),
    start=st.integers(-6 * 60, 3 * 60),
    length=st.integers(0, 10 * 60),
)
def test_auto_elapsed_time_fires_exactly_where_the_wall_clock_matches(
    change: tuple[str, str, int], minute: str, hour: str, start: int, length: int
) -> None:
    """Against a scan of every real minute: an elapsed-time job under auto fires at each
    instant whose local wall time matches, and nowhere else; so it sits between skip
    (never a changed wall time) and both (every wall time, gaps shifted)."""
    assume(elapsed(minute, hour))
    zone_name, iso, _ = change
    zone = ZoneInfo(zone_name)
    after = ms(iso) + start * MINUTE_MS
    until = after + length * MINUTE_MS
    minutes, hours = expand(minute, 0, 59), expand(hour, 0, 23)
    expected = [
        t
        for t in range(after + MINUTE_MS, until + 1, MINUTE_MS)
        if (wall := datetime.fromtimestamp(t // 1000, zone)).minute in minutes
        and wall.hour in hours
    ]
    schedule = CronSchedule(f"{minute} {hour} * * *", zone_name)
    fires = fires_between(schedule, after, until, "auto")
    assert fires == expected, isos(fires)
    assert set(fires_between(schedule, after, until, "skip")) <= set(fires)
    assert set(fires) <= set(fires_between(schedule, after, until, "both"))


@settings(max_examples=40, deadline=None)
@given(
    change=st.sampled_from(HOUR_CHANGES),
    seconds=st.sampled_from(["", "0 ", "30 ", "*/20 ", "15,45 "]),
    minute=cron_field(0, 59),
    start=st.integers(-4 * 60, 2 * 60),
    length=st.integers(0, 6 * 60),
)
def test_auto_keeps_an_hourly_pattern_on_its_real_time_rhythm(
    change: tuple[str, str, int], seconds: str, minute: str, start: int, length: int
) -> None:
    """A job with a wildcard hour, in a zone whose offsets are whole hours: its fire times
    across a change are exactly those in UTC, as if there were no daylight saving time
    (no firing lost in the repeated hour, none added in the gap)."""
    zone, iso, _ = change
    expr = f"{seconds}{minute} * * * *"
    after = ms(iso) + start * MINUTE_MS
    until = after + length * MINUTE_MS
    assert fires_between(CronSchedule(expr, zone), after, until, "auto") == fires_between(
        CronSchedule(expr, "UTC"), after, until, "auto"
    )


def test_run_once_loses_the_repeated_hour_and_auto_does_not() -> None:
    after, until = ms("2026-11-01T04:00Z"), ms("2026-11-01T08:00Z")
    utc = fires_between(CronSchedule("*/30 * * * *", "UTC"), after, until)
    new_york = CronSchedule("*/30 * * * *", NEW_YORK)
    assert fires_between(new_york, after, until, "auto") == utc
    assert fires_between(new_york, after, until) == utc  # auto is the default
    run_once = fires_between(new_york, after, until, "run_once")
    assert max(b - a for a, b in itertools.pairwise(run_once)) == 90 * MINUTE_MS


@settings(max_examples=40, deadline=None)
@given(change=st.sampled_from(CHANGES), minute=cron_field(0, 59), hour=cron_field(0, 23))
def test_auto_elapsed_time_gap_is_bounded(
    change: tuple[str, str, int], minute: str, hour: str
) -> None:
    """With P the longest wall-clock distance between consecutive matching times of the day
    and d the size of the change, an elapsed-time job under auto never goes more than
    P + max(P, d) of real time without firing: at most P + d across a fall back (the
    repeated wall times fire again), at most 2P across a spring forward (only the wall
    times of the gap are lost; each side of it is at most P). So a job at least as frequent
    as the change (P <= d) never waits longer than its period plus the change. The bound
    is tight: */2 hours with a one-hour change waits 3 h (P + d), with Lord Howe's
    half-hour change 3.5 h (more than P + d; see the table)."""
    assume(elapsed(minute, hour))
    zone, iso, shift = change
    wall_minutes = sorted(h * 60 + m for h in expand(hour, 0, 23) for m in expand(minute, 0, 59))
    period = max(b - a for a, b in itertools.pairwise([*wall_minutes, wall_minutes[0] + 24 * 60]))
    bound = (period + max(period, shift)) * MINUTE_MS
    schedule = CronSchedule(f"{minute} {hour} * * *", zone)
    # An unbroken chain of fires from 2 bounds before the change to 2 bounds after it.
    fires = fires_between(schedule, ms(iso) - 2 * bound, ms(iso) + 2 * bound, "auto")
    assert fires
    gaps = [b - a for a, b in itertools.pairwise(fires)]
    assert fires[0] - (ms(iso) - 2 * bound) <= period * MINUTE_MS  # no change in that span
    assert max(gaps, default=0) <= bound, (period, shift, isos(fires))


@settings(max_examples=40, deadline=None)
@given(
    change=st.sampled_from(CHANGES),
    minute=cron_field(0, 59, FIXED_KINDS),
    hour=cron_field(0, 23, FIXED_KINDS),
    start=st.integers(-2 * 24 * 60, 0),
    length=st.integers(0, 4 * 24 * 60),
)
def test_auto_fixed_time_is_run_once(
    change: tuple[str, str, int], minute: str, hour: str, start: int, length: int
) -> None:
    assert not elapsed(minute, hour)
    zone, iso, _ = change
    schedule = CronSchedule(f"{minute} {hour} * * *", zone)
    after = ms(iso) + start * MINUTE_MS
    until = after + length * MINUTE_MS
    fires = fires_between(schedule, after, until, "auto")
    assert fires == fires_between(schedule, after, until, "run_once")
    if fires:
        assert next_fire(schedule, after, "auto") == fires[0]
