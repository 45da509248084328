"""Run ids (streams/core/ids.py): built in one place, parsed by one function."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.core.ids import RunId, job_of, manual_run_id, parse_run_id, scheduled_run_id

job_ids = st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True)
times = st.integers(0, 4_102_444_800_000)  # up to 2100


@given(job_ids, times)
def test_a_scheduled_run_id_parses_back_to_its_job_and_time(job_id: str, ms: int) -> None:
    run_id = scheduled_run_id(job_id, ms)
    assert parse_run_id(run_id) == RunId(job_id, scheduled_ms=ms)
    assert job_of(run_id) == job_id


@given(job_ids, st.from_regex(r"[A-Za-z0-9_.:-]{1,40}", fullmatch=True))
def test_a_manual_run_id_parses_back_to_its_request(job_id: str, request_id: str) -> None:
    run_id = manual_run_id(job_id, request_id)
    assert parse_run_id(run_id) == RunId(job_id, request_id=request_id)
    assert job_of(run_id) == job_id


def test_other_shapes_are_no_run_ids() -> None:
    for text in (
        "no-at-sign",
        "j@2026-01-01T00:00:00",  # no Z
        "j@2026-01-01T00:00:00.000Z",  # zero milliseconds are never written
        "j@2026-02-31T00:00:00Z",  # no such day
        "j@tomorrow",
    ):
        assert parse_run_id(text) is None, text
    assert parse_run_id("j@2026-01-01T00:00:00.250Z") == RunId("j", scheduled_ms=1767225600250)
