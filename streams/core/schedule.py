"""Schedule maths: parse a job's `schedule`, compute its fire times, derive its jitter.

Pure and deterministic: no clock, no I/O beyond reading time zone data. All instants are
UTC epoch milliseconds (int).

Cron expressions are evaluated on the job's local wall clock and stored as UTC instants.
Wall-clock times that do not exist (spring forward) or exist twice (fall back) follow
the job's `DstPolicy`:

- a wall time in a gap: ``run_once`` and ``both`` fire at the instant that wall time
  denotes with the offset in force before the gap (``fold=0``: 02:30 in Europe/Berlin on
  the spring-forward day is 03:30 CEST = 01:30 UTC); ``skip`` does not fire;
- a wall time that occurs twice: ``run_once`` fires at the first occurrence (``fold=0``),
  ``both`` at both, ``skip`` at neither;
- ``auto`` (the default) is cron's rule, as cronie's crond applies it to its system time
  zone (src/cron.c: wildcard versus fixed-time jobs), applied here to the job's zone. A
  cron expression is *elapsed-time* when its minute or its hour field begins with ``*``
  (``*``, ``*/15``, ``*/2``: cron sets MIN_STAR or HR_STAR from the field's first
  character); such a job fires at exactly the instants whose local wall time matches:
  at both occurrences of a repeated wall time, and not for a gap's wall times, which no
  instant has. Every other expression is *fixed-time*, steps not led by ``*`` included
  (``30 2 * * *``, ``0-59/15 2 * * *``, ``0 1-23/2 * * *``, ``0 0-23 * * *``), and
  behaves as ``run_once``: once at a repeated wall time, at its first occurrence. The
  leading seconds field of a 6-field expression (not cron's) does not count.
  Where ``auto`` differs from cronie: a fixed-time job whose wall time falls in a gap
  fires at ``run_once``'s shifted instant (02:30 -> 03:30 CEST), where cronie runs it at
  the jump (03:00 CEST, the instant of the change: it catches up the skipped minutes
  then), so that ``auto`` on a fixed-time expression stays exactly ``run_once``; and
  cronie takes a change of more than 3 hours for a clock reset (a gap's jobs are not
  run, a repeated period's run again) and one of at most 5 minutes for a late wake-up,
  while ``auto`` treats every offset change alike. tests/unit/test_cron_conformance.py
  runs cronie's minute loop as an oracle, told of the gap's shifted instant.

The fields are read as cronie reads them (`_check_field`), with a leading seconds field
and croniter's extensions (`L`, `W`, `#`, `?`, `a/n`) beyond cron. A day matches
day-of-month OR day-of-week when both are restricted, AND when either begins with `*`
(or is `?`); `L`, `W`, `5L` and `5#2` are restricted fields like any other.

The fire times of a schedule form one fixed set of instants; `next_fire` returns the
smallest one after a given instant and `fires_between` lists them, so chaining
`next_fire` always reproduces `fires_between`. Several wall times that map to the same
instant fire once.

How a cron schedule is evaluated: the UTC time line is cut at the zone's offset changes
into segments of constant offset. Within a segment, local wall time is UTC plus the
offset, so croniter, run over naive wall-clock seconds, yields the segment's fire times
in order; the wall times of a gap at the start of a segment add their shifted instants,
and the repeated wall times around a fall back are dropped or kept per the policy.
Offset changes are found by sampling the zone every few hours and bisecting to the
second, cached per zone and per ~24-day chunk (the tz database has no two changes of
offset less than ~4 days apart).
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final, NamedTuple, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter  # type: ignore[import-untyped]

from schemas.spec import (
    DST_POLICIES,
    AtSchedule,
    CronSchedule,
    DstPolicy,
    EverySchedule,
    Schedule,
)
from streams.core.zones import load_zone

__all__ = [
    "FireWindow",
    "ScheduleError",
    "fire_window",
    "fires_between",
    "jitter_ms",
    "next_fire",
    "parse_schedule",
]


class ScheduleError(ValueError):
    """A schedule that cannot be parsed or evaluated; the message says what is wrong."""


# --- parsing ------------------------------------------------------------------------------

_SCHEDULE_KINDS: Final = ("cron", "every", "at")
_SCHEDULE_KEYS: Final = frozenset({"cron", "timezone", "every", "at", "start", "end"})

_EVERY_RE: Final = re.compile(r"([0-9]+)([smhd])")
_UNIT_MS: Final = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_EVERY_MAX_MS: Final = 366 * 86_400_000

# Zone names that load but are not portable IANA zones: the host's own zone, the
# leap-second ("right/") and duplicate ("posix/") trees, and the POSIX default rules.
_NON_PORTABLE_ZONES: Final = frozenset({"localtime", "posixrules"})
_NON_PORTABLE_PREFIXES: Final = ("posix/", "right/")

_UTC_ZONES: Final = frozenset({"UTC", "Etc/UTC"})

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS: Final = timedelta(milliseconds=1)
_ONE_S: Final = timedelta(seconds=1)


def parse_schedule(raw: object) -> Schedule:
    """From the JSON `schedule` value of a job.upsert command.

    - absent (None) -> None: the job runs when its upstreams succeeded;
    - ``{"cron": "...", "timezone": "..."}``: 5 fields, or 6 with leading seconds; the time
      zone is an IANA name, "UTC" when omitted;
    - ``{"every": "30s"}``: a positive integer and a unit s, m, h or d; 1s to 366d;
    - ``{"at": "2026-12-01T10:00:00Z"}``: ISO-8601 with an explicit offset or Z.

    Exactly one of cron/every/at; a cron or every schedule may be bounded by ``"start"``
    and ``"end"`` (ISO-8601 instants, inclusive): no fire time before or after them.
    Other keys are an error. Raises ScheduleError.
    """
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ScheduleError(
            "schedule must be an object with exactly one of 'cron', 'every' or 'at', "
            f"got {type(raw).__name__}"
        )
    unknown = sorted(repr(key) for key in raw if key not in _SCHEDULE_KEYS)
    if unknown:
        raise ScheduleError(
            f"unknown schedule key(s) {', '.join(unknown)}: "
            "allowed are 'cron' (with optional 'timezone'), 'every' and 'at'"
        )
    kinds = [kind for kind in _SCHEDULE_KINDS if kind in raw]
    if len(kinds) != 1:
        found = " and ".join(repr(kind) for kind in kinds) if kinds else "none"
        raise ScheduleError(f"schedule needs exactly one of 'cron', 'every' or 'at', got {found}")
    kind = kinds[0]
    if kind != "cron" and "timezone" in raw:
        raise ScheduleError(f"'timezone' only applies to 'cron' schedules, not to {kind!r}")
    value = raw[kind]
    if kind == "at":
        if "start" in raw or "end" in raw:
            raise ScheduleError("'start' and 'end' bound cron and every schedules, not 'at'")
        return _parse_at(value)
    bounded: CronSchedule | EverySchedule
    if kind == "cron":
        timezone = raw.get("timezone", "UTC")
        if not isinstance(timezone, str):
            raise ScheduleError(
                f"timezone must be a string such as 'Europe/Berlin', got {type(timezone).__name__}"
            )
        bounded = _parse_cron(value, timezone)
    else:
        bounded = _parse_every(value)
    return _with_bounds(bounded, raw.get("start"), raw.get("end"))


def _with_bounds(
    schedule: CronSchedule | EverySchedule, start: object, end: object
) -> CronSchedule | EverySchedule:
    if start is None and end is None:
        return schedule
    start_ms = None if start is None else _instant_ms(start, "start")
    end_ms = None if end is None else _instant_ms(end, "end")
    if start_ms is not None and end_ms is not None and start_ms > end_ms:
        raise ScheduleError(f"start {start!r} is after end {end!r}")
    bounded = replace(schedule, start_ms=start_ms, end_ms=end_ms)
    if next_fire(bounded, (start_ms or 0) - 1) is None and end_ms is not None:
        raise ScheduleError(f"the schedule never fires between start {start!r} and end {end!r}")
    return bounded


def _instant_ms(value: object, key: str) -> int:
    if not isinstance(value, str):
        raise ScheduleError(f"{key} must be an ISO-8601 string, got {type(value).__name__}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ScheduleError(f"invalid {key} {value!r}: not an ISO-8601 date-time") from None
    if moment.utcoffset() is None:
        raise ScheduleError(f"invalid {key} {value!r}: no UTC offset; add 'Z' or an offset")
    return (moment - _EPOCH) // _ONE_MS


def _parse_cron(value: object, timezone: str) -> CronSchedule:
    if not isinstance(value, str):
        raise ScheduleError(
            f"cron must be a string such as '*/5 * * * *', got {type(value).__name__}"
        )
    expr = " ".join(value.split())
    _zone(timezone)
    if not _fires(expr):
        raise ScheduleError(f"invalid cron expression {value!r}: it never fires")
    return CronSchedule(expr=expr, timezone=timezone)


@lru_cache(maxsize=4096)
def _fires(expr: str) -> bool:
    """Whether a cron expression ever matches (`0 0 31 2 *` does not). Asked of every
    job registered, from ingress and the API: one search per distinct expression."""
    return _cron(expr).next_wall(0) is not None


def _parse_every(value: object) -> EverySchedule:
    if not isinstance(value, str):
        raise ScheduleError(f"every must be a string such as '30s', got {type(value).__name__}")
    match = _EVERY_RE.fullmatch(value)
    if match is None:
        raise ScheduleError(
            f"invalid every {value!r}: expected a positive integer followed by a unit "
            "s, m, h or d, such as '30s', '5m', '2h' or '1d'"
        )
    every_ms = int(match.group(1)) * _UNIT_MS[match.group(2)]
    if every_ms <= 0:
        raise ScheduleError(f"invalid every {value!r}: the interval must be at least 1s")
    if every_ms > _EVERY_MAX_MS:
        raise ScheduleError(f"invalid every {value!r}: the interval must be at most 366d")
    return EverySchedule(every_ms=every_ms)


def _parse_at(value: object) -> AtSchedule:
    if not isinstance(value, str):
        raise ScheduleError(
            f"at must be an ISO-8601 string such as '2026-12-01T10:00:00Z', "
            f"got {type(value).__name__}"
        )
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ScheduleError(
            f"invalid at {value!r}: not an ISO-8601 date-time such as '2026-12-01T10:00:00Z'"
        ) from None
    if moment.utcoffset() is None:
        raise ScheduleError(
            f"invalid at {value!r}: no UTC offset; add 'Z' or an offset such as '+01:00'"
        )
    return AtSchedule(at_ms=(moment - _EPOCH) // _ONE_MS)


# --- cached cron expressions and zones ------------------------------------------------------


_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# (name, lowest, highest, names) of the five fields; seconds lead a 6-field expression.
_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _WEEKDAYS),
)
_SECONDS = ("second", 0, 59, ())
_STAR: Final = re.compile(r"\*(?:/([0-9]+))?")
_PLAIN: Final = re.compile(r"([0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?(?:/([0-9]+))?")
_NTH: Final = re.compile(r"([0-9A-Z]+)#([0-9]+)")
_LAST_WEEKDAY: Final = re.compile(r"L([0-9A-Z]+)|([0-9A-Z]+)L")
_NEAREST_WEEKDAY: Final = re.compile(r"([0-9]+)W")
_TO_LAST_DAY: Final = re.compile(r"([0-9]+)-L")
_DAY_FIELDS: Final = ("day-of-month", "day-of-week")


def _value(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text.upper() in names:
        return names.index(text.upper()) + (1 if name == "month" else 0)
    if not text.isascii() or not text.isdigit():
        raise ScheduleError(f"{name} field: {text!r} is not a number{' or a name' * bool(names)}")
    value = int(text)
    if not low <= value <= high:
        raise ScheduleError(f"{name} field: {value} is out of range {low}-{high}")
    return value


def _step(text: str, name: str, part: str) -> int:
    step = int(text)
    if step == 0:
        raise ScheduleError(f"{name} field: {part!r}: a step must be at least 1")
    return step


def _check_field(field: str, name: str, low: int, high: int, names: tuple[str, ...]) -> str:
    """One field as cron reads it, in the form croniter is given, or a ScheduleError
    naming the field.

    Cron's forms (cronie's entry.c): `*`, values, names, ranges low to high (cron refuses
    `7-0`, it does not wrap), steps of at least 1, lists; Sunday is 0 or 7. Single-value
    ranges (`5-5`, `05-5`, `5-5/2`) become that value: croniter reads such a range as
    `*`, so `0 5-5 * * *` would fire every hour. Beyond cron, the extensions croniter
    evaluates, each checked here so that croniter never sees a form it would misread:
    `a/n` (a to the field's end, every n), `?` (a whole day field, as `*`), `L` (the
    last day of the month, alone, listed or ending a range: `L`, `1,L`, `25-L`), `nW`
    (the weekday nearest the nth, alone), and in the day of the week `dL` or `Ld` (the
    last weekday d of the month: `5L`, `FRIL`, `L5`) and `d#k` (its kth, k 1-5), listed
    with each other but not with plain days, which croniter cannot combine."""
    if field[:1] in ("H", "h", "R", "r"):
        raise ScheduleError(
            f"{name} field: {field!r}: hashed (H) and random (R) fields are not supported"
        )
    if "?" in field:
        if field != "?" or name not in _DAY_FIELDS:
            raise ScheduleError(
                f"{name} field: {field!r}: '?' is only allowed as a whole day-of-month or "
                "day-of-week field"
            )
        return "*"
    parts: list[str] = []
    kinds: set[str] = set()
    for part in field.split(","):
        if not part:
            raise ScheduleError(f"{name} field: {field!r} has an empty item in its list")
        text, kind = _check_part(part, name, low, high, names)
        parts.append(text)
        kinds.add(kind)
    if "nearest" in kinds and len(parts) > 1:
        raise ScheduleError(f"{name} field: {field!r}: a W day must stand alone in its field")
    if name == "day-of-week" and "plain" in kinds and kinds & {"last", "nth"}:
        raise ScheduleError(
            f"{name} field: {field!r}: days such as 5L or 5#2 cannot be listed with plain days"
        )
    return ",".join(parts)


def _check_part(
    part: str, name: str, low: int, high: int, names: tuple[str, ...]
) -> tuple[str, str]:
    """One item of a field's list: its text for croniter, and its kind (plain, last,
    nth, nearest) for the rules on what may be listed together."""
    upper = part.upper()
    if (star := _STAR.fullmatch(part)) is not None:
        if star.group(1) is not None:
            _step(star.group(1), name, part)
        return part, "plain"
    if name == "day-of-week":
        if (nth := _NTH.fullmatch(upper)) is not None:
            day = _value(nth.group(1), name, low, high, names) % 7
            if not 1 <= int(nth.group(2)) <= 5:
                raise ScheduleError(f"{name} field: {part!r}: the week after # must be 1-5")
            return f"{day}#{int(nth.group(2))}", "nth"
        if upper == "L":
            raise ScheduleError(
                f"{name} field: 'L' needs a day: 5L (or FRIL, L5) is the last Friday of the month"
            )
        if (last := _LAST_WEEKDAY.fullmatch(upper)) is not None:
            day = _value(last.group(1) or last.group(2), name, low, high, names) % 7
            return f"L{day}", "last"
    if name == "day-of-month":
        if upper == "L":
            return "L", "last"
        if (nearest := _NEAREST_WEEKDAY.fullmatch(upper)) is not None:
            return f"{_value(nearest.group(1), name, low, high, names)}W", "nearest"
        if (to_last := _TO_LAST_DAY.fullmatch(upper)) is not None:
            return f"{_value(to_last.group(1), name, low, high, names)}-L", "plain"
    plain = _PLAIN.fullmatch(part)
    if plain is None:
        raise ScheduleError(
            f"{name} field: {part!r} is not a value, a range (a-b) or a step (*/n, a-b/n)"
        )
    first, last_text, step_text = plain.groups()
    step = 1 if step_text is None else _step(step_text, name, part)
    a = _value(first, name, low, high, names)
    if last_text is None and step_text is not None:
        # `a/n`: from a to the end of the field (Saturday in the day of the week, where
        # croniter stops), listed so that `59/5` cannot reach croniter as a range.
        end = max(a, 6) if name == "day-of-week" else high
        values = range(a, end + 1, step)
    else:
        b = a if last_text is None else _value(last_text, name, low, high, names)
        if a > b:
            raise ScheduleError(f"{name} field: {part!r}: a range must go from low to high")
        if name != "day-of-week" or b < 7:
            text = str(a) if a == b else f"{a}-{b}" + ("" if step_text is None else f"/{step}")
            return text, "plain"
        values = range(a, b + 1, step)
    if name == "day-of-week":
        # Sunday as 7, which croniter refuses in the 6-field form: the days named.
        return ",".join(map(str, sorted({d % 7 for d in values}))), "plain"
    return ",".join(map(str, values)), "plain"


class _Cron:
    """A validated cron expression, evaluated over naive wall-clock seconds.

    croniter objects are stateful, so each call passes its start and holds a lock.
    """

    __slots__ = ("_iters", "_lock", "elapsed")

    def __init__(self, expr: str) -> None:
        if any(c.isspace() and c not in " \t" for c in expr):
            raise ScheduleError(
                f"invalid cron expression {expr!r}: fields are separated by spaces or tabs"
            )
        raw = expr.split()
        if len(raw) not in (5, 6):
            alias = " (aliases such as @daily are not supported)" if expr.startswith("@") else ""
            raise ScheduleError(
                f"invalid cron expression {expr!r}: expected 5 fields (minute hour "
                "day-of-month month day-of-week), or 6 with leading seconds, "
                f"got {len(raw)}{alias}"
            )
        kinds = (_SECONDS, *_FIELDS) if len(raw) == 6 else _FIELDS
        try:
            fields = [_check_field(f, *kind) for f, kind in zip(raw, kinds, strict=True)]
        except ScheduleError as error:
            raise ScheduleError(f"invalid cron expression {expr!r}: {error}") from None
        # Cron's day rule (cronie, Vixie, Debian): a day matches day-of-month OR
        # day-of-week when both are restricted, AND when either starts with `*`: cron
        # sets its DOM_STAR/DOW_STAR flag from the field's first character, so `*/2`
        # counts as a star there, where croniter would OR it with the day of the week.
        # `?` is a star too (it says "any day"). The extensions (`L`, `W`, `5L`, `5#2`)
        # are restricted fields like any other. The OR is evaluated as two expressions,
        # one per day field (the other a star), the earlier time winning: croniter's own
        # OR finds nothing for `0 0 30 2 MON` (Mondays of February in cron) and drops
        # the day of the month beside `5#2` or `L5`.
        if any(field.startswith("*") or field == "?" for field in (raw[-3], raw[-1])):
            variants = [fields]
        else:
            variants = [[*fields[:-1], "*"], [*fields[:-3], "*", *fields[-2:]]]
        try:
            # A start time is given so that croniter never reads the clock.
            self._iters = [
                croniter(" ".join(v), 0.0, second_at_beginning=True, day_or=False) for v in variants
            ]
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise ScheduleError(f"invalid cron expression {expr!r}: {error}") from None
        self._lock = threading.Lock()
        # Elapsed-time (True) or fixed-time (False) under the `auto` DST policy: cronie
        # sets MIN_STAR/HR_STAR when the minute or hour field begins with `*`, and only
        # then runs a job on the wall clock; `0-59/15` or `1-23/2` is fixed-time there.
        self.elapsed: bool = any(field.startswith("*") for field in raw[-5:-3])

    def next_wall(self, wall_s: int) -> int | None:
        """The first matching wall-clock second strictly after `wall_s` (naive seconds
        since 1970-01-01T00:00), or None when none within croniter's search horizon
        (50 years) or the datetime range."""
        found: list[float] = []
        with self._lock:
            for each in self._iters:
                try:
                    found.append(each.get_next(float, start_time=float(wall_s)))
                except (ValueError, OverflowError):  # CroniterBadDateError is a ValueError
                    continue
        return int(min(found)) if found else None


@lru_cache(maxsize=4096)
def _cron(expr: str) -> _Cron:
    return _Cron(expr)


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    if name in _NON_PORTABLE_ZONES or name.startswith(_NON_PORTABLE_PREFIXES):
        raise ScheduleError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'"
        )
    try:
        return load_zone(name)  # from the pinned tzdata package, in every process
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


# --- offset changes ------------------------------------------------------------------------

# (instant in UTC seconds at which the new offset applies, offset before, offset after)
_Transition: TypeAlias = tuple[int, int, int]

_CHUNK_S: Final = 1 << 21  # ~24.3 days
_SAMPLE_S: Final = 6 * 3600
# Larger than any jump of a zone's offset (24 h: Pacific/Apia skipped 2011-12-30).
_MAX_SHIFT_S: Final = 2 * 86_400
# Cron fire times are computed in (_MIN_S, _MAX_S], well inside the years datetime can
# represent in every zone, with room for the offset-change lookups around them.
_MIN_S: Final = -62_104_060_800  # 0002-01-01T00:00Z
_MAX_S: Final = 253_368_086_400  # 9998-12-01T00:00Z


def _offset(zone: ZoneInfo, utc_s: int) -> int:
    offset = datetime.fromtimestamp(utc_s, zone).utcoffset()
    return 0 if offset is None else offset // _ONE_S


@lru_cache(maxsize=65_536)
def _chunk_transitions(zone_name: str, chunk: int) -> tuple[_Transition, ...]:
    """The offset changes of a zone at instants in [chunk*_CHUNK_S, (chunk+1)*_CHUNK_S)."""
    zone = _zone(zone_name)
    end = (chunk + 1) * _CHUNK_S - 1
    found: list[_Transition] = []
    left = chunk * _CHUNK_S - 1
    left_offset = _offset(zone, left)
    while left < end:
        right = min(left + _SAMPLE_S, end)
        right_offset = _offset(zone, right)
        if right_offset == left_offset:
            left = right
            continue
        # Bisect to the first second whose offset differs from left_offset.
        low, high = left, right
        while high - low > 1:
            middle = (low + high) // 2
            if _offset(zone, middle) == left_offset:
                low = middle
            else:
                high = middle
        high_offset = _offset(zone, high)
        found.append((high, left_offset, high_offset))
        left, left_offset = high, high_offset
    return tuple(found)


def _transitions(zone_name: str, low: int, high: int) -> Iterator[_Transition]:
    """The offset changes at instants in (low, high], ascending."""
    for chunk in range((low + 1) // _CHUNK_S, high // _CHUNK_S + 1):
        for transition in _chunk_transitions(zone_name, chunk):
            if low < transition[0] <= high:
                yield transition


# --- fire times ------------------------------------------------------------------------------


def next_fire(schedule: Schedule, after_ms: int, dst: DstPolicy = "auto") -> int | None:
    """The first fire time strictly greater than after_ms, or None (a one-off already
    past, no schedule, or a cron expression that never fires again).

    Cron fire times are computed between the years 2 and 9998 (UTC)."""
    _check_policy(dst)
    if schedule is None:
        return None
    if isinstance(schedule, AtSchedule):
        return schedule.at_ms if schedule.at_ms > after_ms else None
    if schedule.start_ms is not None:
        after_ms = max(after_ms, schedule.start_ms - 1)
    if isinstance(schedule, EverySchedule):
        every = _every_ms(schedule)
        fire: int | None = (after_ms // every + 1) * every
    else:
        fire_s = cron_next_s(schedule, after_ms // 1000, dst)
        fire = None if fire_s is None else fire_s * 1000
    if fire is not None and schedule.end_ms is not None and fire > schedule.end_ms:
        return None
    return fire


def _clamp(schedule: Schedule, after_ms: int, until_ms: int) -> tuple[int, int]:
    """A window (after, until] cut to the schedule's bounds."""
    if isinstance(schedule, CronSchedule | EverySchedule):
        if schedule.start_ms is not None:
            after_ms = max(after_ms, schedule.start_ms - 1)
        if schedule.end_ms is not None:
            until_ms = min(until_ms, schedule.end_ms)
    return after_ms, until_ms


def fires_between(
    schedule: Schedule,
    after_ms: int,
    until_ms: int,
    dst: DstPolicy = "auto",
    limit: int = 100_000,
) -> list[int]:
    """All fire times t with after_ms < t <= until_ms, ascending, at most `limit`: the
    list stops at the limit without saying so (`fire_window` says whether it did)."""
    _check_policy(dst)
    after_ms, until_ms = _clamp(schedule, after_ms, until_ms)
    if schedule is None or limit <= 0 or until_ms <= after_ms:
        return []
    if isinstance(schedule, EverySchedule):
        every = _every_ms(schedule)
        first = (after_ms // every + 1) * every
        return list(range(first, until_ms + 1, every)[:limit])
    if isinstance(schedule, AtSchedule):
        return [schedule.at_ms] if after_ms < schedule.at_ms <= until_ms else []
    fires: list[int] = []
    after_s, until_s = after_ms // 1000, until_ms // 1000
    while len(fires) < limit:
        fire_s = cron_next_s(schedule, after_s, dst)
        if fire_s is None or fire_s > until_s:
            break
        fires.append(fire_s * 1000)
        after_s = fire_s
    return fires


class FireWindow(NamedTuple):
    """The fire times of a window, ascending, at most a limit of them."""

    times: list[int]
    # More fire times lie in the window after the last one listed (after every one when
    # none is): continue from times[-1] for the rest.
    truncated: bool


def fire_window(
    schedule: Schedule,
    after_ms: int,
    until_ms: int,
    dst: DstPolicy = "auto",
    limit: int = 100_000,
) -> FireWindow:
    """`fires_between`, saying whether the limit cut the list: for whatever shows or
    pages fire times, where a full list must not pass for the whole window."""
    limit = max(limit, 0)
    times = fires_between(schedule, after_ms, until_ms, dst, limit + 1)
    return FireWindow(times[:limit], len(times) > limit)


def newest_fires(
    schedule: Schedule,
    after_ms: int,
    until_ms: int,
    dst: DstPolicy = "auto",
    count: int = 1,
) -> list[int]:
    """The newest `count` fire times t with after_ms < t <= until_ms, ascending.

    The work follows `count`, not the window: a catch-up over a day of a 1-second cron
    wants its newest 1,000 times, not the 86,400 before them. Cron times are read back
    in spans that double from a minute, each enumerated forward once."""
    _check_policy(dst)
    after_ms, until_ms = _clamp(schedule, after_ms, until_ms)
    if schedule is None or count <= 0 or until_ms <= after_ms:
        return []
    if isinstance(schedule, EverySchedule):
        every = _every_ms(schedule)
        first = (after_ms // every + 1) * every
        return list(range(first, until_ms + 1, every)[-count:])
    if isinstance(schedule, AtSchedule):
        return fires_between(schedule, after_ms, until_ms, dst)
    fires: list[int] = []
    span, covered = 60_000, until_ms  # fires in (covered, until_ms] are known
    while len(fires) < count and covered > after_ms:
        start = max(after_ms, until_ms - span)
        fires = fires_between(schedule, start, covered, dst, limit=_NO_LIMIT) + fires
        covered, span = start, span * 2
    return fires[-count:]


_NO_LIMIT = 1 << 62


def _check_policy(dst: str) -> None:
    if dst not in DST_POLICIES:
        raise ValueError(f"unknown DST policy {dst!r}: expected one of {DST_POLICIES}")


def _every_ms(schedule: EverySchedule) -> int:
    if schedule.every_ms <= 0:
        raise ScheduleError(f"every_ms must be positive, got {schedule.every_ms}")
    return schedule.every_ms


# Pure, and the same question is asked again and again: at the top of the hour every job
# on "0 * * * *" in one zone asks it for the same instant, and the ledger validates a
# proposal and computes the next due time with the same arguments the scheduler used.
@lru_cache(maxsize=65_536)
def cron_next_s(schedule: CronSchedule, after_s: int, dst: DstPolicy) -> int | None:
    """The first fire time, in whole UTC seconds, strictly after `after_s`: the one step
    `next_fire` and `fires_between` take through a cron schedule (looked up by name at
    each call, so a unit test of the ledger's catch-up work can count the steps)."""
    cron = _cron(schedule.expr)
    name = schedule.timezone
    zone = _zone(name)
    current = max(after_s, _MIN_S)
    if name in _UTC_ZONES:
        fire = cron.next_wall(current)
        return None if fire is None or fire > _MAX_S else fire
    # The policy as three answers: do a gap's wall times fire at their shifted instant;
    # does the first / the second occurrence of a repeated wall time fire.
    elapsed = dst == "auto" and cron.elapsed
    shift_gap = dst in ("run_once", "both") or (dst == "auto" and not elapsed)
    keep_first = dst != "skip"
    keep_second = dst == "both" or elapsed
    while current < _MAX_S:
        start = current + 1  # the earliest instant that may fire
        offset = _offset(zone, start)
        first_wall = start + offset
        shifted: int | None = None  # the earliest fire from a gap's wall times
        previous: _Transition | None = None
        for transition in _transitions(name, start - _MAX_SHIFT_S, start):
            previous = transition
        if previous is not None:
            begin, before, _ = previous
            if before > offset and not keep_second:
                # After a fall back: drop the second occurrence of the repeated wall times.
                first_wall = max(first_wall, begin + before)
            elif before < offset and shift_gap:
                # After a spring forward: the wall times of the gap fire at the instant
                # they denote with the old offset, which lies at or after `begin`.
                wall = cron.next_wall(start + before - 1)
                if wall is not None and wall < begin + offset:
                    shifted = wall - before
        wall = cron.next_wall(first_wall - 1)
        if wall is None:
            return shifted
        fire = wall - offset
        if fire > _MAX_S:
            return shifted
        upcoming = next(_transitions(name, start, fire + _MAX_SHIFT_S), None)
        if upcoming is None:
            return fire if shifted is None else min(fire, shifted)
        end, _, after = upcoming
        in_segment = fire < end and not (
            # Before a fall back, `skip` drops the first occurrence of repeated wall times.
            not keep_first and after < offset and wall >= end + after
        )
        if in_segment:
            return fire if shifted is None else min(fire, shifted)
        if shifted is not None:
            return shifted
        current = end - 1
    return None


# --- jitter --------------------------------------------------------------------------------


def jitter_ms(job_id: str, fire_ms: int, jitter_s: float) -> int:
    """A stable offset in [0, jitter_s*1000) milliseconds, from a BLAKE2b hash of job_id
    and fire_ms: the same on every machine and Python run. 0 when jitter_s <= 0."""
    if math.isnan(jitter_s) or math.isinf(jitter_s):
        raise ValueError(f"jitter_s must be finite, got {jitter_s}")
    if jitter_s <= 0:
        return 0
    # Rounding first keeps e.g. 0.3 s (300.00000000000006 ms) to a span of 300 ms.
    span = max(1, math.ceil(round(jitter_s * 1000, 6)))
    digest = hashlib.blake2b(
        f"{job_id}\x00{fire_ms}".encode(), digest_size=8, person=b"cronlog.jitter"
    ).digest()
    return (int.from_bytes(digest, "big") * span) >> 64
