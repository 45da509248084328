"""The ledger's state tables under test: a state to hold, and the model they must follow."""

from __future__ import annotations

from hypothesis import strategies as st

from schemas.codec import JOB_STATE
from schemas.records import JobState
from streams.state_table import StateTable
from tests.support.specs import upsert

# (key, op, keep encoded): op 0 pops, 1 sets (then maybe keeps it encoded), else reads.
STEPS = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3), st.booleans()), max_size=40)


def state(job_id: str, fired: int) -> JobState:
    return JobState(upsert(job_id).spec, False, False, 0, 0, fired, None, (), (), (), 1)


def behaves_as_a_dict(table: StateTable[JobState], steps: list[tuple[str, int, bool]]) -> None:
    """Whatever is kept encoded, the table reads as a dict given the same steps."""
    model: dict[str, JobState] = {}
    for key, op, encode in steps:
        if op == 0:
            table.pop(key)
            model.pop(key, None)
        elif op == 1:
            value = state(key, len(model) + op)
            table[key] = value
            model[key] = value
            if encode:
                table.keep_encoded(key, value, JOB_STATE.encode(value))
        else:
            assert table.get(key) == model.get(key)
        assert len(table) == len(model)
        assert all(k in table for k in model)
    for key, value in model.items():
        assert table[key] == value
