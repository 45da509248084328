"""The nearest-rank percentile (streams/core/percentile.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.percentile import nearest_rank, nearest_rank_sorted

values = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=200)
shares = st.floats(0.0, 1.0)


@given(values, shares)
def test_the_smallest_measured_value_at_or_above_a_share_q_of_them(
    xs: list[float], q: float
) -> None:
    p = nearest_rank(xs, q)
    assert p in xs
    assert sum(1 for x in xs if x <= p) >= q * len(xs)
    # No smaller value would do.
    assert all(sum(1 for x in xs if x <= y) < q * len(xs) for y in xs if y < p)


def test_known_figures() -> None:
    hundred = [float(i) for i in range(1, 101)]
    assert nearest_rank(hundred, 0.99) == 99.0
    assert nearest_rank(hundred, 0.5) == 50.0
    assert nearest_rank(hundred, 1.0) == 100.0
    assert nearest_rank(hundred, 0.0) == 1.0
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0
    assert nearest_rank([], 0.99) is None
    with pytest.raises(ValueError, match="q must be in"):
        nearest_rank_sorted([1.0], 1.5)
    assert math.isclose(nearest_rank([2.5], 0.99) or 0, 2.5)
