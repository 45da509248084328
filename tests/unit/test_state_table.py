"""The ledger's state table: states held decoded or as their record's bytes (pure)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given

from schemas.codec import JOB_STATE
from schemas.records import JobState
from streams.state_store import MemoryStates
from streams.state_table import StateTable
from tests.support.tables import STEPS, behaves_as_a_dict, state


def test_a_restored_table_decodes_a_state_when_first_asked_and_once() -> None:
    decoded: list[bytes] = []

    def decode(data: bytes) -> JobState:
        decoded.append(data)
        return JOB_STATE.decode(data)

    a, b = state("a", 1), state("b", 2)
    table = StateTable(decode, MemoryStates(a=JOB_STATE.encode(a), b=JOB_STATE.encode(b)))
    assert (len(table), table.decoded, "a" in table, "c" in table) == (2, 0, True, False)
    assert table.get("a") == a
    assert table.get("a") is table.get("a")  # decoded once, then held
    assert (len(decoded), table.decoded, len(table)) == (1, 1, 2)
    assert table.get("c") is None


def test_a_state_kept_encoded_reads_back_equal_and_only_if_still_current() -> None:
    table: StateTable[JobState] = StateTable(JOB_STATE.decode)
    a = state("a", 1)
    table["a"] = a
    newer = replace(a, fired_ms=5)
    table["a"] = newer
    table.keep_encoded("a", a, JOB_STATE.encode(a))  # not what it holds: ignored
    assert table.get("a") is newer
    table.keep_encoded("a", newer, JOB_STATE.encode(newer))
    assert table.decoded == 0
    assert table.get("a") == newer
    table.pop("a")
    assert "a" not in table
    assert len(table) == 0


@given(STEPS)
def test_the_table_behaves_as_a_dict_whatever_is_kept_encoded(
    steps: list[tuple[str, int, bool]],
) -> None:
    table: StateTable[JobState] = StateTable(JOB_STATE.decode)
    behaves_as_a_dict(table, steps)
