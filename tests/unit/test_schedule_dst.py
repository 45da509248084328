"""Cron schedules across daylight-saving changes: hand-computed tables.

2026 transitions used here (all on Sundays):
- Europe/Berlin spring forward 2026-03-29 01:00Z: 02:00 CET (+01) -> 03:00 CEST (+02);
  fall back 2026-10-25 01:00Z: 03:00 CEST -> 02:00 CET.
- America/New_York spring forward 2026-03-08 07:00Z: 02:00 EST (-05) -> 03:00 EDT (-04);
  fall back 2026-11-01 06:00Z: 02:00 EDT -> 01:00 EST.

Every expected instant below is written out in UTC, worked out by hand from those offsets.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from streams.core.ids import iso_utc
from streams.core.schedule import fires_between, next_fire
from streams.core.spec import CronSchedule, DstPolicy

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


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
            for policy in ("run_once", "both", "skip")
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
            for policy in ("run_once", "both", "skip")
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
        {
            policy: ["2026-03-29T01:10Z", "2026-03-29T01:50Z"]
            for policy in ("run_once", "both", "skip")
        },
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
        },
    ),
]

CASES = [
    pytest.param(expr, zone, after, until, policy, expected, id=f"{zone}-{expr}-{after}-{policy}")
    for expr, zone, after, until, by_policy in TABLE
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
