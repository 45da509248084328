"""The `timers` header of job state records (pure)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from schemas.records import JobState, RunState
from streams.core.proposals import may_lead, may_look_ahead
from streams.headers import (
    DEADLINE_HEADER,
    TIMERS_HEADER,
    Deadline,
    Timers,
    deadline_of,
    decode_deadline,
    decode_timers,
    encode_deadline,
    encode_timers,
    job_state_headers,
    job_timers,
    run_deadline,
    run_state_headers,
    timers_of,
)
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
    assert timers_of(job_state_headers(job)) == job_timers(job)  # what the ledger writes


KINDS = st.sampled_from(["claim", "timeout", "retry", "dependency"])


@given(st.one_of(st.none(), st.tuples(MS, KINDS)), st.integers(0, 2**40))
def test_deadlines_round_trip(pending: tuple[int, str] | None, attempt: int) -> None:
    deadline = (
        Deadline(None, attempt, None)
        if pending is None
        else Deadline(pending[0], attempt, pending[1])  # type: ignore[arg-type]
    )
    data = encode_deadline(deadline)
    assert decode_deadline(data) == deadline
    assert deadline_of([(DEADLINE_HEADER, data)]) == deadline
    assert timers_of([(DEADLINE_HEADER, data)]) is None  # one header is not the other


def test_a_deadline_header_that_contradicts_itself_reads_as_none() -> None:
    assert decode_deadline(encode_deadline(Deadline(5, 1, "claim"))[:-1] + b"\x09") is None
    assert decode_deadline(encode_deadline(Deadline(None, 1, None))[:-1] + b"\x01") is None


@given(
    st.sampled_from(["due", "dispatched", "running", "retrying", "succeeded", "cancelled"]),
    st.one_of(st.none(), st.tuples(MS, KINDS)),
)
def test_a_run_states_deadline_is_what_the_scheduler_read_from_the_state(
    state: str, pending: tuple[int, str] | None
) -> None:
    run = RunState(
        "j@x", "j", 0, "schedule", state, 2, "", 0, 0,  # type: ignore[arg-type]
        None if pending is None else pending[0],
        None if pending is None else pending[1],  # type: ignore[arg-type]
        None, None, None, "", 1,
    )  # fmt: skip
    found = run_deadline(run)
    assert deadline_of(run_state_headers(run)) == found  # what the ledger writes
    if run.final or pending is None:
        assert found == Deadline(None, 2, None)
    else:
        assert found == Deadline(pending[0], 2, pending[1])  # type: ignore[arg-type]
