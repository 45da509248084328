"""Calendars and bounds (issue 37): a schedule's start and end, days it does not run
(recorded as skipped naming the calendar, never absent), a limit on its runs, and what a
resume does with the firings its pause covered."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from schemas.records import FireProposed, JobPaused, JobResumed, JobUpserted
from streams.core.commands import Rejection, UpsertJob, parse_command, upsert_document
from streams.core.ids import scheduled_run_id
from streams.core.schedule import fires_between, next_fire, parse_schedule
from tests.support.world import World

HOUR = 3_600_000
DAY = 24 * HOUR
# 2027-01-01T00:00:00Z, a Friday
T0 = 1_798_761_600_000


def upsert(**extra: Any) -> Any:
    doc = {"type": "job.upsert", "job_id": "j", "owner": "o", "command": ["x"], **extra}
    return parse_command(orjson.dumps(doc))


def test_a_bounded_schedule_fires_only_between_start_and_end() -> None:
    schedule = parse_schedule(
        {"every": "1h", "start": "2027-01-01T02:00:00Z", "end": "2027-01-01T04:00:00Z"}
    )
    assert next_fire(schedule, 0) == T0 + 2 * HOUR
    assert fires_between(schedule, 0, T0 + DAY) == [T0 + 2 * HOUR, T0 + 3 * HOUR, T0 + 4 * HOUR]
    assert next_fire(schedule, T0 + 4 * HOUR) is None
    cron = parse_schedule(
        {"cron": "0 9 * * *", "timezone": "Europe/Berlin", "end": "2027-01-03T00:00:00+01:00"}
    )
    assert [t - T0 for t in fires_between(cron, T0 - 1, T0 + 10 * DAY)] == [
        8 * HOUR,  # 09:00 in Berlin is 08:00 UTC in winter
        DAY + 8 * HOUR,
    ]


JAN1, JAN2 = "2027-01-01T00:00:00Z", "2027-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        ({"every": "1h", "start": JAN2, "end": JAN1}, "after end"),
        ({"cron": "0 9 * * *", "start": JAN1, "end": "2027-01-01T05:00:00Z"}, "never fires"),
        ({"at": "2027-01-01T00:00:00Z", "end": "2027-01-02T00:00:00Z"}, "not 'at'"),
        ({"every": "1h", "start": "2027-01-01T00:00:00"}, "no UTC offset"),
    ],
)  # fmt: skip
def test_bad_bounds_are_refused_saying_why(schedule: dict[str, str], words: str) -> None:
    refused = upsert(schedule=schedule)
    assert isinstance(refused, Rejection)
    assert refused.field == "schedule"
    assert words in refused.reason


def test_calendars_and_limits_read_back_as_written() -> None:
    parsed = upsert(
        schedule={
            "cron": "0 9 * * *",
            "timezone": "Europe/Berlin",
            "start": "2027-01-01T00:00:00Z",
        },
        exclude=[
            {"name": "holidays-de", "dates": ["2027-01-01", "2027-12-24..2027-12-26"]},
            {"dates": ["2027-03-01"]},
        ],
        max_runs=10,
    )
    assert isinstance(parsed, UpsertJob)
    again = parse_command(orjson.dumps(upsert_document(parsed.spec)))
    assert isinstance(again, UpsertJob)
    assert again.spec == parsed.spec
    names = {e.name for e in parsed.spec.exclude}
    assert names == {"holidays-de", "exclude"}


@pytest.mark.parametrize(
    ("exclude", "words"),
    [
        ([{"dates": ["2027-02-30"]}], "is not a day"),
        ([{"dates": ["2027-12-26..2027-12-24"]}], "ends before it starts"),
        ([{"dates": []}], "non-empty list"),
        ([{"name": "bad name", "dates": ["2027-01-01"]}], "exclude[0].name"),
        ([{"dates": [f"2027-01-{d:02d}" for d in range(1, 32)]}] * 13, "at most 400"),
        ({"dates": ["2027-01-01"]}, "must be a list"),
    ],
)
def test_bad_calendars_are_refused_naming_where(exclude: object, words: str) -> None:
    refused = upsert(schedule={"every": "1h"}, exclude=exclude)
    assert isinstance(refused, Rejection)
    assert words in refused.reason


def world(**extra: Any) -> World:
    w = World()
    parsed = upsert(**extra)
    assert isinstance(parsed, UpsertJob), parsed
    w.apply(JobUpserted(parsed.spec, T0 - 1))
    return w


def fire(w: World, t: int) -> None:
    w.apply(FireProposed("j", t, t, "n"))


def test_a_firing_on_an_excluded_day_is_recorded_skipped_naming_its_calendar() -> None:
    w = world(
        schedule={"cron": "0 9 * * *", "timezone": "Europe/Berlin"},
        exclude=[{"name": "holidays-de", "dates": ["2027-01-02"]}],
    )
    for day in range(3):
        fire(w, T0 + day * DAY + 8 * HOUR)
    states = [w.runs[scheduled_run_id("j", T0 + d * DAY + 8 * HOUR)].state for d in range(3)]
    assert states == ["due", "skipped", "due"]
    skipped = w.runs[scheduled_run_id("j", T0 + DAY + 8 * HOUR)]
    assert skipped.reason == "excluded by calendar holidays-de (2027-01-02)"


def test_the_day_is_the_schedules_zones_not_utcs() -> None:
    """23:30 UTC on 1 January is 00:30 on 2 January in Berlin: excluded there."""
    w = world(
        schedule={"cron": "30 0 * * *", "timezone": "Europe/Berlin"},
        exclude=[{"dates": ["2027-01-02"]}],
    )
    t = T0 + 23 * HOUR + 30 * 60_000
    fire(w, t)
    assert w.runs[scheduled_run_id("j", t)].reason.startswith("excluded by calendar exclude")


def test_a_schedule_stops_after_max_runs_and_proposes_nothing_more() -> None:
    w = world(schedule={"every": "1h"}, max_runs=2)
    for k in (1, 2, 3):
        fire(w, T0 + k * HOUR)
    assert scheduled_run_id("j", T0 + 3 * HOUR) not in w.runs
    assert w.jobs["j"].schedule_runs == 2
    assert w.jobs["j"].next_due_ms is None
    assert w.rejections[-1] == "the schedule made its 2 runs (max_runs)"


@pytest.mark.parametrize(("missed", "expected"), [("skip", 0), ("last", 1), ("all", 3)])
def test_a_resume_skips_runs_the_last_or_runs_all_it_missed(missed: str, expected: int) -> None:
    w = world(schedule={"every": "1h"})
    fire(w, T0 + HOUR)
    w.apply(JobPaused("j", T0 + HOUR + 1))
    resumed = T0 + 4 * HOUR + 30 * 60_000  # 2, 3 and 4 o'clock missed
    w.apply(JobResumed("j", resumed, missed), now=resumed)
    missed_runs = [t for t in (2, 3, 4) if scheduled_run_id("j", T0 + t * HOUR) in w.runs]
    assert len(missed_runs) == expected
    if missed == "last":
        assert missed_runs == [4]
    assert w.jobs["j"].next_due_ms == T0 + 5 * HOUR


def test_a_withdrawn_firing_does_not_use_up_max_runs() -> None:
    """The one run of max_runs=1, created ahead, withdrawn by a pause and revived by the
    resume: it runs (before, the withdrawal had counted it and the limit refused it)."""
    w = world(schedule={"every": "1h"}, max_runs=1)
    t = T0 + HOUR
    w.apply(FireProposed("j", t, t - 600_000, "n"), now=t - 600_000)  # decided ahead
    w.apply(JobPaused("j", t - 300_000), now=t - 300_000)
    assert w.runs[scheduled_run_id("j", t)].state == "cancelled"
    assert w.jobs["j"].schedule_runs == 0
    w.apply(JobResumed("j", t - 120_000), now=t - 120_000)
    fire(w, t)
    assert w.runs[scheduled_run_id("j", t)].state == "due"  # revived: the one run
    assert w.jobs["j"].schedule_runs == 1
    fire(w, t + HOUR)
    assert scheduled_run_id("j", t + HOUR) not in w.runs
