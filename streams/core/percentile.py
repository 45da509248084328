"""The one definition of a percentile behind every figure cronlog reports (the audit, the
benchmarks, the tests' figures, the `job_lateness` view): the nearest rank.

The q-percentile of n values is the ceil(q * n)-th smallest (1-based; the smallest for
q = 0): a value that was measured, never an interpolation, and the smallest value that
at least a share q of the values do not exceed. PostgreSQL's `percentile_disc` is the
same definition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def nearest_rank_sorted(ordered: Sequence[float], q: float) -> float:
    """The q-percentile (0 <= q <= 1) of values already sorted ascending; not empty."""
    if not ordered:
        raise ValueError("no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    n = len(ordered)
    return ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    """The q-percentile of `values`; None when there are none."""
    ordered = sorted(values)
    return nearest_rank_sorted(ordered, q) if ordered else None
