"""What each of a node's ledger processes reads ahead: the range assignor's share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.ledger import range_share


@given(partitions=st.integers(1, 200), members=st.integers(1, 16))
def test_the_shares_cover_every_partition_once_in_ranges_that_differ_by_one(
    partitions: int, members: int
) -> None:
    shares = [range_share(partitions, i, members) for i in range(members)]
    assert [p for share in shares for p in share] == list(range(partitions))
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger ranges come first


def test_twelve_partitions_over_five_members_as_the_range_assignor_splits_them() -> None:
    assert [list(range_share(12, i, 5)) for i in range(5)] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
        [8, 9],
        [10, 11],
    ]


def test_an_index_outside_the_members_is_refused() -> None:
    with pytest.raises(ValueError, match="out of"):
        range_share(12, 2, 2)
