"""The inverse of the command parser (streams.core.commands.upsert_document): for every
spec the parser can produce, parsing the inverse's JSON gives the spec back; and the API's
PATCH, which turns a job's stored spec (the projection's JSON view) into a command again."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.api.service import ServiceError, patched_document
from schemas.json import to_plain
from schemas.spec import (
    CONCURRENCY_POLICIES,
    DST_POLICIES,
    MISFIRE_POLICIES,
    NOTIFY_ON,
    AtSchedule,
    CronSchedule,
    EverySchedule,
    JobSpec,
    Notify,
    Resources,
    RetryPolicy,
    Schedule,
)
from streams.core.command_spec import (
    MAX_BACKOFF_MULTIPLIER,
    MAX_BACKOFF_S,
    MAX_CPU,
    MAX_GPU,
    MAX_JITTER_S,
    MAX_MEMORY_MB,
    MAX_PRIORITY,
    MAX_SLA_S,
    MAX_TIMEOUT_S,
    MIN_PRIORITY,
)
from streams.core.commands import UpsertJob, parse_command, schedule_document, upsert_document

ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# Instants a one-off can name: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z.
MIN_AT_MS = -62_135_596_800_000
MAX_AT_MS = 253_402_300_799_999


def identifiers(rest: str, max_size: int, first: str = ALNUM) -> st.SearchStrategy[str]:
    tails = st.text(st.sampled_from(rest), max_size=max_size - 1)
    return st.builds(str.__add__, st.sampled_from(first), tails)


ids = identifiers(ALNUM + "._-", 128)
texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
env_names = identifiers(ALNUM + "_", 16, first=ALNUM[:52] + "_").filter(
    lambda name: not name.startswith("CRONLOG_")
)
label_keys = identifiers(ALNUM + "._/-", 16)
label_values = st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=12)


urls = st.builds(
    "{}://{}/{}".format,
    st.sampled_from(["http", "https"]),
    identifiers(ALNUM + ".-", 40),
    st.text(ALNUM + "/?=&", max_size=20),
)


def numbers(lo: float, hi: float, *, exclude_min: bool = False) -> st.SearchStrategy[float]:
    """Floats in [lo, hi]: whole ones, arbitrary ones, and the bounds themselves."""
    whole = st.integers(math.ceil(lo) + (1 if exclude_min else 0), math.floor(hi)).map(float)
    any_float = st.floats(lo, hi, allow_nan=False, exclude_min=exclude_min)
    bounds = st.sampled_from([hi] if exclude_min else [lo, hi])
    return whole | any_float | bounds


CRON_EXPRS = [
    "0 2 * * *",
    "*/5 * * * *",
    "30 0 2 * * *",
    "0 9-17/2 * * 1-5",
    "15,45 */3 1,15 * *",
    "0 0 29 2 *",
    "*/30 * * * *",
    "59 23 31 12 *",
]
ZONES = ["UTC", "Etc/UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
         "Asia/Kolkata", "Pacific/Apia", "America/St_Johns"]  # fmt: skip
UNIT_MS = [1_000, 60_000, 3_600_000, 86_400_000]

cron_schedules = st.builds(CronSchedule, st.sampled_from(CRON_EXPRS), st.sampled_from(ZONES))
every_schedules = st.one_of(
    st.integers(1, 366 * 86_400).map(lambda s: s * 1000),
    st.sampled_from(UNIT_MS).flatmap(
        lambda unit: st.integers(1, 366 * 86_400_000 // unit).map(lambda n: n * unit)
    ),
).map(EverySchedule)
at_schedules = st.one_of(
    st.integers(MIN_AT_MS, MAX_AT_MS),
    st.integers(MIN_AT_MS // 1000, MAX_AT_MS // 1000).map(lambda s: s * 1000),
    st.sampled_from([MIN_AT_MS, MAX_AT_MS, 0, -1, 1, 1_767_225_600_000]),
).map(AtSchedule)
schedules: st.SearchStrategy[Schedule] = st.one_of(cron_schedules, every_schedules, at_schedules)


@st.composite
def retries(draw: st.DrawFn) -> RetryPolicy:
    backoff = draw(numbers(0, MAX_BACKOFF_S))
    return RetryPolicy(
        max_attempts=draw(st.integers(1, 100)),
        backoff_s=backoff,
        backoff_multiplier=draw(numbers(1, MAX_BACKOFF_MULTIPLIER)),
        max_backoff_s=draw(numbers(backoff, MAX_BACKOFF_S)),
    )


def pairs(keys: st.SearchStrategy[str], values: st.SearchStrategy[str]) -> Any:
    return st.dictionaries(keys, values, max_size=4).map(lambda d: tuple(sorted(d.items())))


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    """Any spec the parser can produce: every schedule kind (or none, with upstreams),
    every field anywhere within its bounds."""
    job_id = draw(ids)
    depends_on = draw(st.lists(ids.filter(lambda up: up != job_id), max_size=4, unique=True))
    schedule = draw(schedules | st.none()) if depends_on else draw(schedules)
    sla_s = draw(st.none() | numbers(0, MAX_SLA_S, exclude_min=True))
    env = draw(pairs(env_names, texts))
    plain = {k for k, _ in env}
    events = [e for e in NOTIFY_ON if e != "late" or sla_s is not None]
    on = draw(st.none() | st.lists(st.sampled_from(events), min_size=1, unique=True).map(tuple))
    return JobSpec(
        job_id=job_id,
        owner=draw(identifiers(ALNUM + "._-", 64)),
        schedule=schedule,
        command=(draw(texts.filter(bool)), *draw(st.lists(texts, max_size=4))),
        env=env,
        secret_env=tuple(
            (k, v)
            for k, v in draw(pairs(env_names, identifiers(ALNUM + "._-", 128)))
            if k not in plain
        ),
        resources=Resources(
            cpu=draw(numbers(0, MAX_CPU)),
            memory_mb=draw(st.integers(0, MAX_MEMORY_MB)),
            gpu=draw(st.integers(0, MAX_GPU)),
            labels=draw(pairs(label_keys, label_values)),
        ),
        timeout_s=draw(numbers(0, MAX_TIMEOUT_S, exclude_min=True)),
        retry=draw(retries()),
        idempotent=draw(st.booleans()),
        depends_on=tuple(sorted(depends_on)),
        misfire=draw(st.sampled_from(MISFIRE_POLICIES)),
        concurrency=draw(st.sampled_from(CONCURRENCY_POLICIES)),
        dst=draw(st.sampled_from(DST_POLICIES)),
        jitter_s=draw(numbers(0, MAX_JITTER_S)),
        priority=draw(st.integers(MIN_PRIORITY, MAX_PRIORITY)),
        notify=None if on is None else Notify(draw(urls), on),
        sla_s=sla_s,
    )


PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(specs())
def test_parsing_the_inverse_gives_the_spec_back(spec: JobSpec) -> None:
    assert parse_command(orjson.dumps(upsert_document(spec))) == UpsertJob(spec)


@PROPERTY
@given(specs())
def test_the_inverse_of_a_stored_spec_gives_the_spec_back(spec: JobSpec) -> None:
    """The way PATCH goes: the projection's JSON view of the spec, read back from
    PostgreSQL, becomes the command that makes the same spec."""
    stored = orjson.loads(orjson.dumps(to_plain(spec)))
    doc = {"type": "job.upsert", **patched_document(stored, {})}
    assert parse_command(orjson.dumps(doc)) == UpsertJob(spec)


@PROPERTY
@given(specs(), st.integers(MIN_PRIORITY, MAX_PRIORITY))
def test_a_patch_changes_only_what_it_names(spec: JobSpec, priority: int) -> None:
    stored = orjson.loads(orjson.dumps(to_plain(spec)))
    doc = {"type": "job.upsert", **patched_document(stored, {"priority": priority})}
    parsed = parse_command(orjson.dumps(doc))
    assert isinstance(parsed, UpsertJob), parsed
    assert parsed.spec == JobSpec(**{**_fields(spec), "priority": priority})


def _fields(spec: JobSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in JobSpec.__slots__}


@pytest.mark.parametrize(
    ("every_ms", "text"),
    [
        (1_000, "1s"),
        (90_000, "90s"),
        (60_000, "1m"),
        (5_400_000, "90m"),
        (7_200_000, "2h"),
        (86_400_000, "1d"),
        (90_000_000, "25h"),
        (366 * 86_400_000, "366d"),
    ],
)
def test_an_interval_is_written_in_its_largest_whole_unit(every_ms: int, text: str) -> None:
    assert schedule_document(EverySchedule(every_ms)) == {"every": text}


@pytest.mark.parametrize(
    ("at_ms", "text"),
    [
        (1_764_583_200_000, "2025-12-01T10:00:00Z"),
        (1_764_583_200_007, "2025-12-01T10:00:00.007Z"),
        (0, "1970-01-01T00:00:00Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (MIN_AT_MS, "0001-01-01T00:00:00Z"),
        (MAX_AT_MS, "9999-12-31T23:59:59.999Z"),
    ],
)
def test_a_one_off_is_written_in_iso_8601_utc(at_ms: int, text: str) -> None:
    assert schedule_document(AtSchedule(at_ms)) == {"at": text}


def test_schedules_no_command_can_express_are_refused() -> None:
    for schedule in (EverySchedule(1_500), EverySchedule(0), EverySchedule(-60_000)):
        with pytest.raises(ValueError, match="whole number of seconds"):
            schedule_document(schedule)
    for at_ms in (MIN_AT_MS - 1, MAX_AT_MS + 1):
        with pytest.raises(ValueError, match="years 1 to 9999"):
            schedule_document(AtSchedule(at_ms))


def test_cron_and_no_schedule() -> None:
    cron = CronSchedule("0 2 * * *", "Europe/Berlin")
    assert schedule_document(cron) == {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}
    assert schedule_document(None) is None
    step = JobSpec("step", "me", None, ("true",), depends_on=("up",))
    assert "schedule" not in upsert_document(step)


def test_dst_is_passed_through_as_it_is() -> None:
    spec = JobSpec("j", "me", EverySchedule(60_000), ("true",), dst="both")
    assert upsert_document(spec)["dst"] == "both"


def test_patching_the_stored_spec_of_an_interval_job() -> None:
    """The report of issue 12: PATCH {"priority": 3} on an interval job was a 422."""
    spec = JobSpec("tick", "me", EverySchedule(10_000), ("x",))
    stored = orjson.loads(orjson.dumps(to_plain(spec)))
    assert stored["schedule"] == {"every_ms": 10_000}
    doc = patched_document(stored, {"priority": 3, "env": None})
    assert doc["schedule"] == {"every": "10s"}
    assert doc["priority"] == 3
    assert "env" not in doc  # null: the field's default
    parsed = parse_command(orjson.dumps({**doc, "type": "job.upsert"}))
    assert isinstance(parsed, UpsertJob), parsed


def test_a_stored_spec_that_cannot_be_read_back_is_a_conflict() -> None:
    with pytest.raises(ServiceError) as refused:
        patched_document({"type": "JobSpec", "job_id": "x"}, {"priority": 1})
    assert refused.value.status == 409
