"""The reports of ended runs, held while the executor starts a burst.

When many runs share a start time (the top of the hour), the worker's executor starts them
as fast as fork/exec allows, and every run that ends meanwhile has a report to send. The
report's path (reading the run's last output, the worker's encoding, the broker, the
gate, the ledger) takes CPU, and on a machine that shares its cores it takes it from the
starts still waiting. Nothing reads a report within seconds (docs/architecture.md,
"Dispatch and workers": lateness is the start's own time, a lost worker's attempts are
judged by its lease), so while a run whose start time has come has not started, the
reports wait, up to `REPORT_HOLD_S`, and then go in the order they were made.

A held report's attempt stays listed in the worker's heartbeats (`keys`): were the worker
lost before sending it, the dispatcher's verdict settles it as it settles a running one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Generic, TypeVar

Key = tuple[str, int]  # run id, attempt
Report = TypeVar("Report")

# The longest a report waits for a burst's starts: a bound on how stale the ledger's view
# of this worker's ended runs gets (what depends on them starts that much later), not on
# the burst, which may take longer on a slow machine (then its reports go every 5 s).
REPORT_HOLD_S = 5.0


class ReportHold(Generic[Report]):
    """Runs handed to the executor by start time, and the reports held while one of them
    is due and not started."""

    def __init__(self, hold_s: float = REPORT_HOLD_S) -> None:
        self.hold_s = hold_s
        self._unstarted: list[tuple[int, Key]] = []  # a heap: (start ms, key)
        self._held: list[tuple[Key, Report]] = []
        self._since = 0.0  # when the oldest held report was held (monotonic s)

    def handed(self, key: Key, start_ms: int) -> None:
        """A run was handed to the executor, to start at `start_ms`."""
        heapq.heappush(self._unstarted, (start_ms, key))

    def behind(self, now_ms: int, waiting: Callable[[Key], bool]) -> bool:
        """Whether a run handed over has reached its start time and is still `waiting`
        (not started, not ended, not given up). Those that no longer wait are dropped."""
        while self._unstarted:
            start_ms, key = self._unstarted[0]
            if waiting(key):
                return start_ms <= now_ms
            heapq.heappop(self._unstarted)
        return False

    def hold(self, key: Key, report: Report, now_s: float) -> None:
        if not self._held:
            self._since = now_s
        self._held.append((key, report))

    def expired(self, now_s: float) -> bool:
        """Whether the oldest held report has waited its longest."""
        return bool(self._held) and now_s - self._since >= self.hold_s

    def take(self) -> list[Report]:
        """Every held report, oldest first; none is held after."""
        held, self._held = self._held, []
        return [report for _, report in held]

    def keys(self) -> tuple[Key, ...]:
        return tuple(key for key, _ in self._held)

    def __len__(self) -> int:
        return len(self._held)
