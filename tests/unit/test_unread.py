"""The proposals the ledger has not read (streams/core/unread.py): which repeats wait."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.core.unread import APPEND_SLACK_MS, MARK_MS, STALE_S, UnreadProposals


def test_nothing_waits_until_the_ledgers_offsets_are_known_or_when_they_are_stale() -> None:
    unread = UnreadProposals()
    unread.delivered(0, 10, 1_000)
    assert unread.held_from(0, now=0.0) is None  # never told where the ledger is
    unread.read(0, 5, at=100.0)
    assert unread.held_from(0, now=100.0) == 1_000 - APPEND_SLACK_MS
    assert unread.held_from(0, now=100.0 + STALE_S + 0.1) is None  # fails open
    assert unread.held_from(1, now=100.0) is None  # another partition


def test_once_the_ledger_read_everything_nothing_waits() -> None:
    unread = UnreadProposals()
    for offset in range(5):
        unread.delivered(2, offset, 1_000 + offset * 500)
    unread.read(2, 3, at=1.0)
    assert unread.since(2, now=1.0) == 1_000 + 3 * 500
    unread.read(2, 5, at=2.0)
    assert unread.since(2, now=2.0) is None
    assert unread.marks() == 0
    unread.delivered(2, 4, 9_000)  # a late report of a record already read
    assert unread.since(2, now=2.0) is None


proposals = st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 50)),  # (append step ms, making delay ms)
    min_size=1,
    max_size=200,
)


@given(proposals, st.data())
def test_a_repeat_waits_exactly_while_its_proposal_may_be_unread(
    steps: list[tuple[int, int]], data: st.DataObject
) -> None:
    """Proposals appended in offset order at nondecreasing times, each made up to 50 ms
    before its append; the ledger has read some prefix. A repeat of an unread proposal
    made at or after the oldest unread's append always waits (the flood the soak saw);
    a repeat of one read more than the slack and a mark before the oldest unread never
    does; the memory is one mark per MARK_MS of appends at most."""
    unread = UnreadProposals()
    appended, made = [], []
    at = 1_000_000
    for offset, (step, delay) in enumerate(steps):
        at += step
        appended.append(at)
        made.append(at - delay)
        unread.delivered(0, offset, at)
    read_to = data.draw(st.integers(0, len(steps)))
    unread.read(0, read_to, at=0.0)
    held_from = unread.held_from(0, now=0.0)
    if read_to == len(steps):
        assert held_from is None
        return
    assert held_from is not None
    oldest = appended[read_to]
    for i in range(len(steps)):
        waits = made[i] >= held_from
        if i >= read_to and made[i] >= oldest:
            assert waits, (i, made[i], held_from)
        if i < read_to and made[i] < oldest - APPEND_SLACK_MS - MARK_MS:
            assert not waits, (i, made[i], held_from)
    span = appended[-1] - appended[0]
    assert unread.marks() <= span // MARK_MS + 1
