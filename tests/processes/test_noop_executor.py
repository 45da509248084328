"""The noop executor (benchmarks of the control plane) starts each run at its instant on a
clock of its own, never early, whether or not the worker's loop is collecting events."""

from __future__ import annotations

import time
from pathlib import Path

from connectors.worker.executor import Finished, NoopExecutor, Started, StartSpec
from tests.support.waiting import eventually


def _spec(key: tuple[str, int], at_mono: float) -> StartSpec:
    return StartSpec(key, Path("/nonexistent"), ("true",), {}, 60.0, 0, 0, (0.0, 0.0, 0.0), at_mono)


def test_runs_start_at_their_instant_without_the_loop_and_a_cancel_stops_one() -> None:
    executor = NoopExecutor()
    try:
        soon = time.monotonic() + 0.05
        executor.start(_spec(("a", 1), soon))
        executor.start(_spec(("b", 1), soon))
        executor.start(_spec(("late", 1), time.monotonic() + 3600))
        executor.cancel(("b", 1))
        executor.start(_spec(("a", 1), soon))  # a repeat is ignored
        # Nobody calls events() until both would have started: the clock thread did it.
        eventually(
            lambda: executor.heap_keys() == [("late", 1)],
            "the clock thread to start `a` and drop `b`",
            10,
            interval_s=0.01,
        )
        events = executor.events()
        started = [e for e in events if isinstance(e, Started)]
        assert [e.key for e in started] == [("a", 1)]
        assert started[0].started_mono is not None
        assert started[0].started_mono >= soon  # never before its instant
        finished = {e.key: e.outcome for e in events if isinstance(e, Finished)}
        assert finished == {("a", 1): "exited", ("b", 1): "not_started"}
        assert executor.events() == []  # each event once
    finally:
        executor.close()
