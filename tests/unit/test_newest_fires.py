"""`newest_fires`: the newest fire times of a window, found with work that follows how many
are asked for (the ledger's catch-up), the same times a full enumeration ends with."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.spec import AtSchedule, CronSchedule, EverySchedule, Schedule
from streams.core.schedule import fires_between, newest_fires

T0 = 1_800_000_000_000
HOUR = 3_600_000

SCHEDULES: list[Schedule] = [
    CronSchedule("* * * * * *", "UTC"),
    CronSchedule("*/7 * * * *", "Europe/Berlin"),
    CronSchedule("0 9-17 * * MON-FRI", "America/New_York"),
    CronSchedule("30 2 * * *", "Europe/Berlin"),
    CronSchedule("0 0 1 1 *", "UTC"),
    EverySchedule(1_000),
    EverySchedule(45 * 60_000),
    AtSchedule(T0 + 5 * HOUR),
]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(SCHEDULES),
    st.integers(0, 400 * 24).map(lambda h: T0 + h * HOUR // 4),
    st.integers(0, 4 * 24 * HOUR),
    st.integers(1, 1_500),
)
def test_the_newest_times_are_the_tail_of_the_full_enumeration(
    schedule: Schedule, after: int, length: int, count: int
) -> None:
    until = after + length
    full = fires_between(schedule, after, until, limit=1 << 40)
    assert newest_fires(schedule, after, until, count=count) == full[-count:]


def test_nothing_asked_or_an_empty_window_gives_nothing() -> None:
    every_minute = CronSchedule("* * * * *", "UTC")
    assert newest_fires(every_minute, T0, T0 + HOUR, count=0) == []
    assert newest_fires(every_minute, T0, T0) == []
    assert newest_fires(None, T0, T0 + HOUR) == []
