"""Schedule parsing, fire times and jitter (streams/core/schedule.py)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.spec import (
    DST_POLICIES,
    AtSchedule,
    CronSchedule,
    DstPolicy,
    EverySchedule,
    Schedule,
)
from streams.core.schedule import (
    ScheduleError,
    fires_between,
    jitter_ms,
    next_fire,
    parse_schedule,
)

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
YEAR_2200_MS = 7_258_118_400_000


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


# --- parse_schedule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ({"cron": "*/5 * * * *"}, CronSchedule("*/5 * * * *", "UTC")),
        (
            {"cron": "0 9 * * mon-fri", "timezone": "Europe/Berlin"},
            CronSchedule("0 9 * * mon-fri", "Europe/Berlin"),
        ),
        ({"cron": "*/10 * * * * *"}, CronSchedule("*/10 * * * * *", "UTC")),
        ({"cron": "  0   0 *  * * "}, CronSchedule("0 0 * * *", "UTC")),
        ({"cron": "0 0 29 2 *"}, CronSchedule("0 0 29 2 *", "UTC")),
        ({"every": "30s"}, EverySchedule(30 * SECOND)),
        ({"every": "1s"}, EverySchedule(SECOND)),
        ({"every": "5m"}, EverySchedule(5 * MINUTE)),
        ({"every": "2h"}, EverySchedule(2 * HOUR)),
        ({"every": "1d"}, EverySchedule(DAY)),
        ({"every": "366d"}, EverySchedule(366 * DAY)),
        ({"at": "2026-12-01T10:00:00Z"}, AtSchedule(ms("2026-12-01T10:00:00+00:00"))),
        ({"at": "2026-12-01T11:00:00+01:00"}, AtSchedule(ms("2026-12-01T10:00:00+00:00"))),
        ({"at": "2026-12-01T10:00:00.250Z"}, AtSchedule(ms("2026-12-01T10:00:00+00:00") + 250)),
        ({"at": "1969-12-31T23:59:59Z"}, AtSchedule(-1000)),
    ],
)
def test_parse_schedule_accepts(raw: object, expected: Schedule) -> None:
    assert parse_schedule(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"cron": "* * * *"}, "invalid cron expression '* * * *': expected 5 fields"),
        ({"cron": "0 0 1 1 * * 2030"}, "or 6 with leading seconds, got 7"),
        ({"cron": "@daily"}, "aliases such as @daily are not supported"),
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"cron": "0 24 * * *"}, "invalid cron expression '0 24 * * *'"),
        ({"cron": "*/0 * * * *"}, "invalid cron expression '*/0 * * * *'"),
        ({"cron": "a b c d e"}, "invalid cron expression 'a b c d e'"),
        ({"cron": "60 * * * * *"}, "invalid cron expression '60 * * * * *'"),
        ({"cron": "0 0 31 2 *"}, "invalid cron expression '0 0 31 2 *': it never fires"),
        ({"cron": "R * * * *"}, "random (R) fields are not supported"),
        ({"cron": "H * * * *"}, "hashed (H)"),
        ({"cron": 5}, "cron must be a string"),
        ({"cron": "0 0 * * *", "timezone": "Mars/Base"}, "unknown time zone 'Mars/Base'"),
        ({"cron": "0 0 * * *", "timezone": "europe/berlin"}, "unknown time zone"),
        ({"cron": "0 0 * * *", "timezone": "Europe"}, "unknown time zone 'Europe'"),
        ({"cron": "0 0 * * *", "timezone": "../UTC"}, "unknown time zone '../UTC'"),
        ({"cron": "0 0 * * *", "timezone": "localtime"}, "unknown time zone 'localtime'"),
        ({"cron": "0 0 * * *", "timezone": "right/UTC"}, "unknown time zone 'right/UTC'"),
        ({"cron": "0 0 * * *", "timezone": 1}, "timezone must be a string"),
        ({"cron": "0 0 * * *", "every": "5m"}, "exactly one of 'cron', 'every' or 'at'"),
        ({"cron": "0 0 * * *", "every": "5m"}, "got 'cron' and 'every'"),
        ({"every": "5m", "at": "2026-12-01T10:00:00Z"}, "got 'every' and 'at'"),
        ({}, "exactly one of 'cron', 'every' or 'at', got none"),
        ({"timezone": "UTC"}, "got none"),
        ({"cron": "0 0 * * *", "tz": "UTC"}, "unknown schedule key(s) 'tz'"),
        ({"every": "5m", "jitter": 3}, "unknown schedule key(s) 'jitter'"),
        ({"every": "5m", "timezone": "UTC"}, "'timezone' only applies to 'cron'"),
        ({"every": "0s"}, "invalid every '0s': the interval must be at least 1s"),
        ({"every": "0d"}, "at least 1s"),
        ({"every": "-5m"}, "invalid every '-5m': expected a positive integer followed by"),
        ({"every": "5x"}, "invalid every '5x'"),
        ({"every": "abc"}, "invalid every 'abc'"),
        ({"every": "5 m"}, "invalid every '5 m'"),
        ({"every": "1.5h"}, "invalid every '1.5h'"),
        ({"every": "5M"}, "invalid every '5M'"),
        ({"every": "\u0665m"}, "invalid every"),  # an Arabic-Indic digit five
        ({"every": "367d"}, "invalid every '367d': the interval must be at most 366d"),
        ({"every": "8785h"}, "at most 366d"),
        ({"every": 30}, "every must be a string such as '30s'"),
        ({"at": "2026-12-01T10:00:00"}, "invalid at '2026-12-01T10:00:00': no UTC offset"),
        ({"at": "2026-12-01"}, "no UTC offset"),
        ({"at": "tomorrow"}, "invalid at 'tomorrow': not an ISO-8601 date-time"),
        ({"at": 1_790_000_000_000}, "at must be an ISO-8601 string"),
        ("*/5 * * * *", "schedule must be an object"),
        (["cron", "* * * * *"], "got list"),
        (30, "got int"),
    ],
)
def test_parse_schedule_rejects(raw: object, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_schedule(raw)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


# --- every, at, none -------------------------------------------------------------------------


def test_every_is_anchored_at_the_epoch() -> None:
    every = EverySchedule(5 * MINUTE)
    assert next_fire(every, 0) == 5 * MINUTE
    assert next_fire(every, 5 * MINUTE - 1) == 5 * MINUTE
    assert next_fire(every, 5 * MINUTE) == 10 * MINUTE
    assert next_fire(every, -1) == 0
    assert fires_between(every, 0, 20 * MINUTE) == [
        5 * MINUTE,
        10 * MINUTE,
        15 * MINUTE,
        20 * MINUTE,
    ]
    assert fires_between(every, 0, 20 * MINUTE, limit=2) == [5 * MINUTE, 10 * MINUTE]


def test_at_fires_once_strictly_after() -> None:
    at = AtSchedule(1_000_000)
    assert next_fire(at, 999_999) == 1_000_000
    assert next_fire(at, 1_000_000) is None
    assert fires_between(at, 0, 1_000_000) == [1_000_000]
    assert fires_between(at, 1_000_000, 2_000_000) == []
    assert fires_between(at, 0, 999_999) == []
    assert fires_between(at, 0, 1_000_000, limit=0) == []


def test_no_schedule_never_fires() -> None:
    assert next_fire(None, 0) is None
    assert fires_between(None, 0, 10 * DAY) == []


def test_empty_or_inverted_window() -> None:
    cron = CronSchedule("* * * * *")
    assert fires_between(cron, MINUTE, MINUTE) == []
    assert fires_between(cron, 2 * MINUTE, MINUTE) == []
    assert fires_between(cron, 0, 10 * MINUTE, limit=3) == [MINUTE, 2 * MINUTE, 3 * MINUTE]


def test_unknown_dst_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown DST policy 'never'"):
        next_fire(CronSchedule("* * * * *"), 0, "never")  # type: ignore[arg-type]


def test_invalid_schedule_built_directly_raises_schedule_error() -> None:
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Base'"):
        next_fire(CronSchedule("* * * * *", "Mars/Base"), 0)
    with pytest.raises(ScheduleError, match="invalid cron expression"):
        next_fire(CronSchedule("61 * * * *"), 0)
    with pytest.raises(ScheduleError, match="every_ms must be positive"):
        next_fire(EverySchedule(0), 0)


# --- cron basics -----------------------------------------------------------------------------


def test_six_field_cron_has_leading_seconds() -> None:
    every_10s = CronSchedule("*/10 * * * * *")
    assert fires_between(every_10s, 0, MINUTE) == [10 * SECOND * k for k in range(1, 7)]
    assert next_fire(every_10s, 10 * SECOND - 1) == 10 * SECOND
    assert next_fire(every_10s, 10 * SECOND) == 20 * SECOND
    # 12:00:30 every day, in UTC and in Berlin (CET in January).
    assert next_fire(CronSchedule("30 0 12 * * *"), ms("2026-01-05T00:00Z")) == ms(
        "2026-01-05T12:00:30Z"
    )
    assert next_fire(CronSchedule("30 0 12 * * *", "Europe/Berlin"), ms("2026-01-05T00:00Z")) == (
        ms("2026-01-05T11:00:30Z")
    )


def test_five_field_cron_fires_at_second_zero() -> None:
    schedule = CronSchedule("* * * * *")
    assert next_fire(schedule, ms("2026-01-05T10:00:00Z")) == ms("2026-01-05T10:01:00Z")
    assert next_fire(schedule, ms("2026-01-05T10:00:59.999Z")) == ms("2026-01-05T10:01:00Z")
    assert next_fire(schedule, ms("2026-01-05T09:59:59.999Z")) == ms("2026-01-05T10:00:00Z")


def test_cron_in_a_zone_is_stored_in_utc() -> None:
    # 09:00 on weekdays in Berlin: CET (+01) in January, CEST (+02) in July.
    schedule = CronSchedule("0 9 * * mon-fri", "Europe/Berlin")
    assert next_fire(schedule, ms("2026-01-02T12:00Z")) == ms("2026-01-05T08:00Z")  # Friday
    assert next_fire(schedule, ms("2026-07-01T12:00Z")) == ms("2026-07-02T07:00Z")
    # Kolkata is +05:30 all year.
    kolkata = CronSchedule("0 0 * * *", "Asia/Kolkata")
    assert next_fire(kolkata, ms("2026-01-01T00:00Z")) == ms("2026-01-01T18:30Z")


def test_rare_cron_across_many_dst_changes() -> None:
    # 29 February, 02:30 New York time: EST (-05) in February.
    schedule = CronSchedule("30 2 29 2 *", "America/New_York")
    assert fires_between(schedule, ms("2026-01-01T00:00Z"), ms("2037-01-01T00:00Z")) == [
        ms(f"{year}-02-29T07:30Z") for year in (2028, 2032, 2036)
    ]


# --- properties ------------------------------------------------------------------------------


@st.composite
def cron_field(draw: st.DrawFn, low: int, high: int) -> str:
    kind = draw(st.sampled_from(["*", "step", "value", "range", "list", "range_step"]))
    if kind == "*":
        return "*"
    if kind == "step":
        return f"*/{draw(st.integers(1, high - low + 1))}"
    if kind == "value":
        return str(draw(st.integers(low, high)))
    if kind == "list":
        values = draw(st.lists(st.integers(low, high), min_size=1, max_size=4, unique=True))
        return ",".join(str(value) for value in sorted(values))
    # Ranges of one value (`5-5`) are left out here: croniter, the oracle, reads them as
    # `*` (test_a_range_of_one_value_is_that_value covers them).
    first = draw(st.integers(low, high - 1))
    last = draw(st.integers(first + 1, high))
    if kind == "range":
        return f"{first}-{last}"
    return f"{first}-{last}/{draw(st.integers(1, 5))}"


@st.composite
def cron_exprs(draw: st.DrawFn, seconds: bool | None = None) -> str:
    fields = [
        draw(cron_field(0, 59)),
        draw(cron_field(0, 23)),
        draw(cron_field(1, 28)),
        draw(cron_field(1, 12)),
        draw(cron_field(0, 6)),
    ]
    with_seconds = draw(st.booleans()) if seconds is None else seconds
    if with_seconds:
        fields.insert(0, draw(cron_field(0, 59)))
    return " ".join(fields)


instants = st.integers(min_value=0, max_value=YEAR_2200_MS)


def croniter_next_ms(expr: str, after_ms: int, zone: str) -> int:
    """croniter's answer, told cron's day rule (AND when day-of-month or day-of-week
    starts with `*`; tests/unit/test_cron_days.py checks the rule itself)."""
    start = datetime.fromtimestamp(after_ms / 1000, ZoneInfo(zone))
    fields = expr.split()
    day_or = not (fields[-3].startswith("*") or fields[-1].startswith("*"))
    found = croniter(expr, start, second_at_beginning=True, day_or=day_or).get_next(datetime)
    assert isinstance(found, datetime)
    return int(found.timestamp()) * 1000


@settings(max_examples=150, deadline=None)
@given(expr=cron_exprs(), after=instants)
def test_utc_cron_matches_croniter(expr: str, after: int) -> None:
    assert next_fire(CronSchedule(expr, "UTC"), after) == croniter_next_ms(expr, after, "UTC")


@settings(max_examples=60, deadline=None)
@given(
    expr=cron_exprs(),
    after=instants,
    zone=st.sampled_from(["Etc/GMT-5", "Etc/GMT+11", "Asia/Kolkata", "Asia/Kathmandu", "Etc/GMT"]),
)
def test_fixed_offset_cron_matches_croniter(expr: str, after: int, zone: str) -> None:
    # Zones without offset changes since 1986 go through the general (non-UTC) path.
    after = max(after, ms("1990-01-01T00:00Z"))
    assert next_fire(CronSchedule(expr, zone), after) == croniter_next_ms(expr, after, zone)


schedules: st.SearchStrategy[Schedule] = st.one_of(
    st.builds(
        CronSchedule,
        expr=cron_exprs(seconds=False),
        timezone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney"]),
    ),
    st.builds(EverySchedule, every_ms=st.integers(SECOND, 366 * DAY)),
    st.builds(AtSchedule, at_ms=instants),
)
policies = st.sampled_from(DST_POLICIES)


@settings(max_examples=150, deadline=None)
@given(schedule=schedules, after=instants, dst=policies)
def test_next_fire_is_strictly_later_and_tight(
    schedule: Schedule, after: int, dst: DstPolicy
) -> None:
    fire = next_fire(schedule, after, dst)
    if fire is None:
        assert isinstance(schedule, AtSchedule)
        assert schedule.at_ms <= after
        return
    assert fire > after
    # Nothing fires in (after, fire): starting just before `fire` finds `fire` again.
    assert next_fire(schedule, fire - 1, dst) == fire
    assert next_fire(schedule, max(after, fire - 1_000), dst) == fire


@settings(max_examples=100, deadline=None)
@given(
    schedule=schedules,
    after=instants,
    window=st.integers(0, 3 * DAY),
    dst=policies,
    limit=st.integers(1, 50),
)
def test_fires_between_is_the_chain_of_next_fire(
    schedule: Schedule, after: int, window: int, dst: DstPolicy, limit: int
) -> None:
    until = after + window
    fires = fires_between(schedule, after, until, dst, limit)
    chained: list[int] = []
    current = next_fire(schedule, after, dst)
    while current is not None and current <= until and len(chained) < limit:
        chained.append(current)
        current = next_fire(schedule, current, dst)
    assert fires == chained
    assert all(a < b for a, b in itertools.pairwise(fires))


@settings(max_examples=100, deadline=None)
@given(
    every=st.integers(SECOND, 366 * DAY),
    after=st.integers(-YEAR_2200_MS, YEAR_2200_MS),
    count=st.integers(1, 30),
)
def test_every_is_exactly_periodic(every: int, after: int, count: int) -> None:
    schedule = EverySchedule(every)
    fires = fires_between(schedule, after, after + count * every, limit=count + 1)
    assert len(fires) == count
    assert all(fire % every == 0 for fire in fires)
    assert all(b - a == every for a, b in itertools.pairwise(fires))
    assert fires[0] > after >= fires[0] - every


# --- cron in zones with offset changes, against a wall-clock oracle --------------------------


def oracle(expr: str, zone_name: str, dst: DstPolicy, after: int, until: int) -> list[int]:
    """The fire times by the definition: every matching wall-clock time, mapped to UTC
    with fold=0 and fold=1 as the policy says. `auto` is `run_once` for a fixed-time
    expression, and for an elapsed-time one (minute or hour field begins with * or has a
    step) every instant whose wall time matches: both folds of a repeated wall time,
    nothing for a wall time in a gap."""
    zone = ZoneInfo(zone_name)
    policy: str = dst
    if dst == "auto":
        minute, hour = expr.split()[-5:-3]
        wild = any(field.startswith("*") or "/" in field for field in (minute, hour))
        policy = "wall" if wild else "run_once"
    wall = datetime.fromtimestamp(after // 1000, UTC).replace(tzinfo=None) - timedelta(days=1)
    last = datetime.fromtimestamp(until // 1000, UTC).replace(tzinfo=None) + timedelta(days=1)
    fields = expr.split()
    day_or = not (fields[-3].startswith("*") or fields[-1].startswith("*"))  # cron's rule
    walls = croniter(expr, wall, second_at_beginning=True, day_or=day_or)
    found: set[int] = set()
    while (wall := walls.get_next(datetime)) <= last:
        first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        exists = first.astimezone(zone).replace(tzinfo=None) == wall
        if first == second:
            candidates = [first]
        elif not exists:  # in a gap
            candidates = [] if policy in ("skip", "wall") else [first]
        else:  # repeated
            candidates = {
                "run_once": [first],
                "both": [first, second],
                "wall": [first, second],
                "skip": [],
            }[policy]
        found.update(int(moment.timestamp()) * 1000 for moment in candidates)
    return sorted(fire for fire in found if after < fire <= until)


@cache
def offset_changes(zone_name: str, year: int) -> list[int]:
    """The instants (ms) in `year` at which the zone's UTC offset changes, to the hour."""
    zone = ZoneInfo(zone_name)
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    changes = []
    previous = datetime.fromtimestamp(start, zone).utcoffset()
    for hour in range(1, 366 * 24):
        offset = datetime.fromtimestamp(start + hour * 3600, zone).utcoffset()
        if offset != previous:
            changes.append((start + hour * 3600) * 1000)
        previous = offset
    return changes


DST_ZONES = [
    ("Europe/Berlin", 2026),
    ("America/New_York", 2026),
    ("Australia/Lord_Howe", 2026),  # changes by 30 minutes
    ("America/Santiago", 2027),
    ("Pacific/Apia", 2011),  # skipped a whole day
]
DST_EXPRS = [
    "*/15 * * * *",
    "30 2 * * *",
    "30 1 * * *",
    "10,50 2,3 * * *",
    "0 * * * *",
    "45 0-3 * * *",
    "*/20 1-3 * * *",
    "15,45 */2 * * *",
    "0 0 * * *",
    "0 12 * * *",
    "*/30 0-2 * * * *",
]


@st.composite
def near_offset_change(draw: st.DrawFn) -> tuple[str, int]:
    zone, year = draw(st.sampled_from(DST_ZONES))
    change = draw(st.sampled_from(offset_changes(zone, year)))
    return zone, change + draw(st.integers(-36 * HOUR, 36 * HOUR))


@settings(max_examples=80, deadline=None)
@given(
    place=near_offset_change(),
    expr=st.sampled_from(DST_EXPRS),
    window=st.integers(0, 2 * DAY),
    dst=policies,
)
def test_cron_across_offset_changes_matches_oracle(
    place: tuple[str, int], expr: str, window: int, dst: DstPolicy
) -> None:
    zone, after = place
    schedule = CronSchedule(expr, zone)
    expected = oracle(expr, zone, dst, after, after + window)
    assert fires_between(schedule, after, after + window, dst) == expected
    following = [fire for fire in expected if fire > after]
    if following:
        assert next_fire(schedule, after, dst) == following[0]


def test_offset_change_anchors_exist() -> None:
    for zone, year in DST_ZONES:
        assert offset_changes(zone, year), zone


# --- jitter ----------------------------------------------------------------------------------


def test_jitter_is_pinned() -> None:
    # The same on every machine and run (nodes must agree): BLAKE2b of the job
    # id and fire time, so these values only change if the derivation does.
    assert [jitter_ms("job-a", fire, 10) for fire in (0, 60_000, 120_000)] == [7952, 7492, 510]


def test_jitter_zero_or_negative_window() -> None:
    assert jitter_ms("job-a", 123, 0) == 0
    assert jitter_ms("job-a", 123, -5) == 0
    assert jitter_ms("job-a", 123, 0.0004) == 0
    with pytest.raises(ValueError, match="finite"):
        jitter_ms("job-a", 123, float("nan"))


def test_jitter_spreads_fires() -> None:
    values = {jitter_ms("job-a", fire * MINUTE, 30) for fire in range(200)}
    assert len(values) > 150
    assert len({jitter_ms(f"job-{n}", 0, 30) for n in range(200)}) > 150


@settings(max_examples=200)
@given(
    job_id=st.text(max_size=40),
    fire=st.integers(-YEAR_2200_MS, YEAR_2200_MS),
    jitter_s=st.floats(min_value=0.001, max_value=86_400, allow_nan=False),
)
def test_jitter_is_stable_and_in_bounds(job_id: str, fire: int, jitter_s: float) -> None:
    value = jitter_ms(job_id, fire, jitter_s)
    assert 0 <= value < jitter_s * 1000
    assert jitter_ms(job_id, fire, jitter_s) == value


@pytest.mark.parametrize("jitter_s", [0.3, 0.001, 1.0, 2.5])
def test_jitter_stays_below_round_spans(jitter_s: float) -> None:
    span = round(jitter_s * 1000)
    assert all(0 <= jitter_ms("j", fire, jitter_s) < span for fire in range(2_000))


@pytest.mark.parametrize(
    ("ranged", "single"),
    [
        ("0 5-5 * * *", "0 5 * * *"),
        ("0-0 5 * * *", "0 5 * * *"),
        ("0 5 3-3 * *", "0 5 3 * *"),
        ("0 5-5/2 * * *", "0 5 * * *"),
        ("0 4-5,7-7 * * *", "0 4-5,7 * * *"),
        ("30 9 * * MON-MON", "30 9 * * MON"),
    ],
)
def test_a_range_of_one_value_is_that_value(ranged: str, single: str) -> None:
    # croniter reads `5-5` as `*`: `0 5-5 * * *` would fire every hour.
    start, end = 1_800_000_000_000, 1_800_000_000_000 + 60 * 86_400_000
    got = fires_between(CronSchedule(ranged, "UTC"), start, end)
    assert got == fires_between(CronSchedule(single, "UTC"), start, end)
    assert len(got) < 24 * 60
