"""The noop executor (benchmarks of the control plane) starts each run at its instant on a
clock of its own, never early, whether or not the worker's loop is collecting events."""

from __future__ import annotations

import time
from pathlib import Path

from connectors.worker.executor import Finished, NoopExecutor, Started, StartSpec
from streams.core.clock import BrokerClock
from tests.support.waiting import eventually


def _spec(key: tuple[str, int], at_mono: float, at_ms: int = 0) -> StartSpec:
    return StartSpec(
        key, Path("/nonexistent"), ("true",), {}, 60.0, 0, at_ms, (0.0, 0.0, 0.0), at_mono
    )


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


def test_given_the_broker_clock_a_run_starts_when_its_newest_bound_reaches_the_start() -> None:
    """A run handed over while the worker's only sample is old (its bound carried forward
    a second behind) starts when a fresh sample says the broker's time has come, a second
    before the instant translated at the hand-over, and never before the bound says."""
    now = time.monotonic()

    def broker_ms(mono: float) -> int:  # the broker's true time, ticking with this clock
        return 5_000_000 + round((mono - now) * 1000)

    broker = BrokerClock()
    broker.observe(broker_ms(now - 1000), now - 1000)  # carried forward 1000 s: 1 s behind
    start_ms = broker_ms(now) + 400
    handed = broker.mono_at(start_ms)
    assert handed is not None
    assert handed > now + 1.3
    executor = NoopExecutor(broker)
    try:
        executor.start(_spec(("a", 1), handed, start_ms))
        broker.observe(broker_ms(now), now)  # a fresh sample: the start is 0.4 s away
        fresh = broker.mono_at(start_ms)
        assert fresh is not None
        assert fresh < handed - 0.9
        eventually(lambda: executor.heap_keys() == [], "the run to start", 10, interval_s=0.01)
        started = [e for e in executor.events() if isinstance(e, Started)]
        assert [e.key for e in started] == [("a", 1)]
        assert started[0].started_mono is not None
        assert fresh <= started[0].started_mono < handed - 0.5
    finally:
        executor.close()


def test_a_run_handed_over_before_the_clock_has_a_sample_starts_once_it_has_one() -> None:
    """No sample yet: no instant to wait for, so the thread looks again and again (it
    must not die of an endless wait) until a sample says the start time has come."""
    broker = BrokerClock()
    executor = NoopExecutor(broker)
    try:
        executor.start(_spec(("a", 1), time.monotonic(), 5_000_000))
        time.sleep(0.3)
        assert executor.heap_keys() == [("a", 1)]
        broker.observe(5_000_000, time.monotonic())
        eventually(lambda: executor.heap_keys() == [], "the run to start", 10, interval_s=0.01)
        assert [e.key for e in executor.events() if isinstance(e, Started)] == [("a", 1)]
    finally:
        executor.close()
