"""The ledger process's clock (streams/ledger_outputs.py): the broker's append time of each
job-log record, a CreateTime stamp only where the topic was not migrated."""

from __future__ import annotations

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Message,
)

from schemas.records import FireProposed
from streams.core.clock import PROBE_JOB_ID
from streams.core.ledger import Decision, decide
from streams.ledger_outputs import record_time


def _record(kind: int, stamp: int) -> Message:
    return Message(topic="job-log", partition=0, offset=1, value=b"", timestamp=(kind, stamp))


def test_the_broker_append_time_is_the_clock() -> None:
    assert record_time(_record(TIMESTAMP_LOG_APPEND_TIME, 1_800_000_000_000)) == (
        1_800_000_000_000,
        True,
    )


def test_a_create_time_stamp_stands_in_and_is_flagged() -> None:
    assert record_time(_record(TIMESTAMP_CREATE_TIME, 1_700_000_000_000)) == (
        1_700_000_000_000,
        False,
    )


def test_no_stamp_leaves_the_inputs_own_time() -> None:
    assert record_time(_record(TIMESTAMP_NOT_AVAILABLE, 0)) == (None, False)


def test_a_clock_probe_decides_nothing_and_is_no_rejection() -> None:
    """A scheduler's clock probe (streams/core/clock.py) is read by the ledger like any
    job-log record: nothing changes, nothing is counted as refused."""
    decision = decide(None, lambda _: None, FireProposed(PROBE_JOB_ID, 0, 5, "node-a"))
    assert decision == Decision()
