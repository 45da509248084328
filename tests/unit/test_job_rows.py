"""projections/job_rows.py: a job row is skipped only when the same row was written in a
committed batch or earlier in the same batch; a rolled-back batch leaves nothing
behind; the memory is bounded."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from projections.job_rows import WrittenRows

KEYS = st.sampled_from([b"a", b"b", b"c"])
ROWS = st.integers(0, 2)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("state"), KEYS, ROWS),
        st.tuples(st.just("commit")),
        st.tuples(st.just("forget")),
    ),
    max_size=60,
)


@given(STEPS)
def test_a_row_is_skipped_only_when_its_database_row_is_the_same(
    steps: list[tuple[Any, ...]],
) -> None:
    """A model of the database: what was committed, and the open batch's writes on top.
    A state whose row is skipped must be the row the database would hold for the key
    after the batch's writes so far (so skipping changes nothing)."""
    rows = WrittenRows(most=1000)
    database: dict[bytes, int] = {}
    batch: dict[bytes, int] = {}
    for step in steps:
        if step[0] == "state":
            _, key, row = step
            current = batch.get(key, database.get(key))
            if rows.unchanged(key, row):
                assert current == row
            else:
                batch[key] = row  # written in this batch
        elif step[0] == "commit":
            database.update(batch)
            batch.clear()
            rows.commit()
        else:  # the batch rolled back, and the memory of every row forgotten
            batch.clear()
            rows.forget()


def test_the_same_row_after_a_commit_is_skipped_after_a_rollback_written() -> None:
    rows = WrittenRows()
    assert not rows.unchanged(b"j", (1, 2))
    assert rows.unchanged(b"j", (1, 2))  # the same batch: written once
    rows.commit()
    assert rows.unchanged(b"j", (1, 2))
    assert not rows.unchanged(b"j", (1, 3))
    rows.forget()  # the batch that wrote (1, 3) was rolled back
    assert not rows.unchanged(b"j", (1, 2))  # nothing remembered: written again


def test_the_least_recently_written_are_forgotten_beyond_the_bound() -> None:
    rows = WrittenRows(most=2)
    for key in (b"a", b"b", b"c"):
        rows.unchanged(key, 1)
    rows.commit()
    assert len(rows) == 2
    assert not rows.unchanged(b"a", 1)  # forgotten: written again
    assert rows.unchanged(b"c", 1)
