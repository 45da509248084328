"""The `timers` header of job state records (pure)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from schemas.headers import (
    TIMERS_HEADER,
    Timers,
    decode_timers,
    encode_timers,
    job_timers,
    timers_of,
)
from streams.core.proposals import may_lead, may_look_ahead
from streams.core.records import JobState
from tests.support.specs import upsert

MS = st.integers(0, 2**62)


@given(st.one_of(st.none(), MS), MS, st.booleans(), st.booleans())
def test_timers_round_trip(due: int | None, fired: int, early: bool, lead: bool) -> None:
    timers = Timers(due, fired, early, lead)
    data = encode_timers(timers)
    assert len(data) == 17
    assert decode_timers(data) == timers
    assert timers_of([("other", b"x"), (TIMERS_HEADER, data)]) == timers
    assert timers_of({TIMERS_HEADER: data}) == timers


def test_no_header_or_a_foreign_one_reads_as_none() -> None:
    assert timers_of(None) is None
    assert timers_of([]) is None
    assert timers_of([("other", b"x")]) is None
    assert timers_of([(TIMERS_HEADER, b"short")]) is None
    assert timers_of([(TIMERS_HEADER, None)]) is None


@given(
    st.sampled_from(["allow", "forbid", "replace"]),
    st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True),
    st.one_of(st.none(), MS),
)
def test_a_job_states_timers_are_what_the_scheduler_read_from_the_state(
    concurrency: str, depends_on: list[str], due: int | None
) -> None:
    spec = replace(
        upsert("j").spec,
        concurrency=concurrency,  # type: ignore[arg-type]
        depends_on=tuple(depends_on),
    )
    job = JobState(spec, False, False, 0, 0, 7, due, (), (), (), 1)
    assert job_timers(job) == Timers(due, 7, may_look_ahead(spec), may_lead(spec))
