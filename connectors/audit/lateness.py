"""Start lateness: ``running.happened_ms - scheduled_ms`` of first attempts (retries and
reruns start late on purpose), backfill runs excluded (created long after their time):
the start the worker reported, as the ledger vouched for it (no earlier than the grant
and the start time, no later than the record ``at_ms``), else the record itself.

The values are gathered from run-events (`connectors/audit/run_events.py`); here, what
the report says of them: count, percentiles and a histogram (`Lateness`).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Final

from streams.core.percentile import nearest_rank_sorted


@dataclass(frozen=True, slots=True)
class Lateness:
    """Start lateness of first attempts, in ms."""

    count: int
    p50_ms: int | None
    p99_ms: int | None
    max_ms: int | None
    # (bucket label, count), buckets in seconds
    histogram: tuple[tuple[str, int], ...]


_BUCKETS: Final[tuple[tuple[str, int], ...]] = (
    # (label, upper bound in ms, exclusive)
    ("< 0 s", 0),
    ("0-0.1 s", 100),
    ("0.1-0.5 s", 500),
    ("0.5-1 s", 1_000),
    ("1-2 s", 2_000),
    ("2-5 s", 5_000),
    ("5-10 s", 10_000),
    ("10-30 s", 30_000),
    ("30-60 s", 60_000),
    ("1-5 min", 300_000),
)
_LAST_BUCKET: Final = ">= 5 min"


def lateness(values: array[int]) -> Lateness:
    counts = [0] * (len(_BUCKETS) + 1)
    for v in values:
        for i, (_, bound) in enumerate(_BUCKETS):
            if v < bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    labels = [label for label, _ in _BUCKETS] + [_LAST_BUCKET]
    histogram = tuple(zip(labels, counts, strict=True))
    if not values:
        return Lateness(0, None, None, None, histogram)
    ordered = sorted(values)

    def rank(q: float) -> int:
        return int(nearest_rank_sorted(ordered, q))

    return Lateness(len(ordered), rank(0.50), rank(0.99), ordered[-1], histogram)
