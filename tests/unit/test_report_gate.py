"""The gate between workers and job-log (streams/gate.py `report_route`), without I/O:
a worker's claims and outcomes pass as they are, onto their job's partition; nothing else
a worker's credentials can write reaches the ledger."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas.codec import JOB_LOG
from schemas.records import (
    ClaimRequested,
    FireProposed,
    JobDeleted,
    JobUpserted,
    LedgerInput,
    RunFinished,
    RunReleased,
    RunStarted,
)
from schemas.spec import EverySchedule, JobSpec
from streams.gate import report_route

REPORTS: list[LedgerInput] = [
    ClaimRequested("j", "j@1", 1, "w1", 5),
    RunStarted("j", "j@1", 1, "w1", 6),
    RunFinished("j", "j@1", 1, "w1", 0, "", 7),
    RunReleased("j", "j@1", 1, "w1", "shutting down", 8),
]


def test_claims_and_outcomes_pass_unchanged_keyed_by_their_job() -> None:
    for record in REPORTS:
        raw = JOB_LOG.encode(record)
        assert report_route(raw) == ("job-log", b"j", raw)


def test_a_forged_registration_or_firing_goes_to_the_dead_letters() -> None:
    forged: list[LedgerInput] = [
        JobUpserted(JobSpec("j", "team", EverySchedule(1000), ("sh", "-c", "evil")), 5),
        JobDeleted("j", 5),
        FireProposed("j", 1000, 5, "w1"),
    ]
    for record in forged:
        where, key, reason = report_route(JOB_LOG.encode(record))
        assert (where, key) == ("commands.dlq", b"")
        assert f"a worker may not write {type(record).__name__}" in reason.decode()


@given(st.binary(max_size=200))
def test_garbage_never_reaches_job_log_unless_it_is_a_report(raw: bytes) -> None:
    where, _, value = report_route(raw)
    if where == "job-log":
        assert isinstance(
            JOB_LOG.decode(raw), ClaimRequested | RunStarted | RunFinished | RunReleased
        )
        assert value == raw
    else:
        assert where == "commands.dlq"
        assert value
