"""A min-heap of due times with replace and remove, for the scheduler's timers.

Entries are replaced lazily: `set` pushes a new heap item and remembers the key's
current due time; stale heap items are dropped when they surface. Every operation is
O(log n); memory is bounded by a periodic rebuild when stale items pile up.
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

# Keys are ordered among themselves (job and run ids): items of one due time pop in key
# order, and a heap item is a pair: no tie-breaking counter, one int fewer per item.
K = TypeVar("K", bound=str)


class DueQueue(Generic[K]):
    def __init__(self) -> None:
        self._heap: list[tuple[int, K]] = []
        self._due: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: K) -> bool:
        return key in self._due

    def get(self, key: K) -> int | None:
        return self._due.get(key)

    def set(self, key: K, due: int | None) -> None:
        """Schedule `key` at `due`, replacing its previous time; None removes it."""
        if due is None:
            self._due.pop(key, None)
            return
        if self._due.get(key) == due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))
        if len(self._heap) > 2 * len(self._due) + 1024:
            self._compact()

    def pop_due(self, now: int, limit: int = 10_000) -> list[tuple[K, int]]:
        """Remove and return up to `limit` keys due at or before `now`, earliest first."""
        out: list[tuple[K, int]] = []
        while self._heap and len(out) < limit:
            due, key = self._heap[0]
            if self._due.get(key) != due:
                heapq.heappop(self._heap)
                continue
            if due > now:
                break
            heapq.heappop(self._heap)
            del self._due[key]
            out.append((key, due))
        return out

    def _compact(self) -> None:
        self._heap = [item for item in self._heap if self._due.get(item[1]) == item[0]]
        heapq.heapify(self._heap)
