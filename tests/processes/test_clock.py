"""The broker clock (streams/core/clock.py): unit and property tests, and the executor's
use of it (a start on the monotonic clock, a lease on the monotonic clock)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import confluent_kafka
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.worker.engine import lease_holds, lease_text
from connectors.worker.executor import Finished, ProcessExecutor, Started, StartSpec
from connectors.worker.lease import write_atomic
from streams.core.clock import (
    DEFAULT_MAX_DRIFT,
    LOG_APPEND_TIME,
    SYSTEM_CLOCK,
    BrokerClock,
    ManualClock,
    broker_stamp,
)
from tests.support.waiting import eventually

T0 = 1_800_000_000_000


def test_only_the_brokers_stamps_count() -> None:
    assert confluent_kafka.TIMESTAMP_LOG_APPEND_TIME == LOG_APPEND_TIME
    assert broker_stamp((confluent_kafka.TIMESTAMP_LOG_APPEND_TIME, T0)) == T0
    assert broker_stamp((confluent_kafka.TIMESTAMP_CREATE_TIME, T0)) is None  # a producer's
    assert broker_stamp((confluent_kafka.TIMESTAMP_NOT_AVAILABLE, -1)) is None


def test_nothing_is_known_before_a_first_sample() -> None:
    clock = BrokerClock()
    assert not clock.synced
    assert clock.now_ms(5.0) is None
    assert clock.mono_at(T0) is None


def test_a_sample_is_carried_forward_on_the_monotonic_clock() -> None:
    clock = BrokerClock(max_drift=0)
    clock.observe(T0, 100.0)
    assert clock.synced
    assert clock.now_ms(100.0) == T0
    assert clock.now_ms(108.5) == T0 + 8500
    assert clock.now_ms(clock.mono_at(T0 + 2000) or 0) == T0 + 2000


def test_the_best_sample_wins_whatever_the_order() -> None:
    """A late delivery report (an old stamp seen now) does not pull the bound back."""
    clock = BrokerClock(max_drift=0)
    clock.observe(T0 + 1000, 11.0)  # appended 0 ms before it was seen
    clock.observe(T0 + 500, 12.0)  # appended 1.5 s before it was seen
    assert clock.now_ms(12.0) == T0 + 2000


def test_the_drift_allowance_keeps_it_below_a_slow_broker() -> None:
    """The broker's clock may tick up to max_drift slower than ours: carried for 100 s,
    a sample loses 0.1 s to the allowance."""
    clock = BrokerClock()
    clock.observe(T0, 0.0)
    assert clock.now_ms(100.0) == T0 + 100_000 - round(100_000 * DEFAULT_MAX_DRIFT)


def test_a_manual_clock_moves_only_when_told_and_carries_the_broker_time_forward() -> None:
    """What a loop given a ManualClock sees: no time passes until the test says so, and
    the broker's time it derives moves by the drift-discounted amount, no more."""
    clock = ManualClock(wall_s=1_000.0, mono_s=50.0)
    broker = BrokerClock()
    broker.observe(5_000_000, clock.monotonic())
    assert (clock.time(), clock.monotonic()) == (1_000.0, 50.0)
    assert broker.now_ms(clock.monotonic()) == 5_000_000
    clock.advance(2.0)
    assert (clock.time(), clock.monotonic()) == (1_002.0, 52.0)
    assert broker.now_ms(clock.monotonic()) == math.floor(
        5_000_000 + 2000 * (1 - DEFAULT_MAX_DRIFT)
    )
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


def test_the_system_clock_is_the_machines() -> None:
    before = time.monotonic()
    assert before <= SYSTEM_CLOCK.monotonic() <= time.monotonic()
    assert abs(SYSTEM_CLOCK.time() - time.time()) < 60


def test_a_drift_allowance_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="max_drift"):
        BrokerClock(max_drift=1.0)


# -- the property: never ahead of the broker ------------------------------------------------
# A broker whose clock ticks at a rate within the allowance of ours, anywhere in time.
# Events happen in local monotonic order: a sample (a stamp appended some time before it
# is seen: a delivery report, a consumed record) or a question.
steps = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=30),  # local seconds since the previous event
        st.floats(min_value=1 - DEFAULT_MAX_DRIFT, max_value=1 + DEFAULT_MAX_DRIFT),
        st.sampled_from(["sample", "ask"]),
        st.integers(min_value=0, max_value=5000),  # the sample's age when seen, ms
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(
    steps=steps,
    broker_t0=st.integers(min_value=0, max_value=4_000_000_000_000),
    mono_t0=st.floats(min_value=0, max_value=1e7),
)
def test_never_ahead_of_the_broker(
    steps: list[tuple[float, float, str, int]], broker_t0: int, mono_t0: float
) -> None:
    """With samples that are true lower bounds, the clock's time is never ahead of the
    broker's, and a start at `mono_at(T)` is never before the broker's T."""
    clock = BrokerClock()
    mono, broker = mono_t0, float(broker_t0)  # the broker's true time, in ms
    for dt, rate, kind, age in steps:
        mono += dt
        broker += dt * 1000 * rate
        if kind == "sample":
            clock.observe(math.floor(broker) - age, mono)
            continue
        now = clock.now_ms(mono)
        if now is None:
            continue
        assert now <= broker
        target = now + 3000
        start = clock.mono_at(target)
        assert start is not None
        # The broker's time at that instant is at least the target, however slowly
        # (within the allowance) its clock ticks meanwhile.
        assert broker + (start - mono) * 1000 * (1 - DEFAULT_MAX_DRIFT) >= target - 1e-6


@settings(max_examples=200, deadline=None)
@given(
    mono=st.floats(min_value=0, max_value=1e7),
    stamp=st.integers(min_value=0, max_value=4_000_000_000_000),
    ahead=st.floats(min_value=0, max_value=3600),
)
def test_a_fresh_sample_is_tight(mono: float, stamp: int, ahead: float) -> None:
    """Without drift, a sample seen the moment it was stamped gives the broker's time to
    the millisecond, however far it is carried. In floating point: `mono + ahead` and the
    clock's `base + rate * mono` each round (a few ulps: ~1e-3 ms at these magnitudes), so
    an exact `ahead * 1000` a hair below a whole millisecond may come out on it (found by
    hypothesis: ahead=3599.9999999999995); 0.01 ms covers that and nothing else."""
    clock = BrokerClock(max_drift=0)
    clock.observe(stamp, mono)
    now = clock.now_ms(mono + ahead)
    assert now is not None
    assert stamp + ahead * 1000 - 1 <= now <= stamp + ahead * 1000 + 0.01


# -- the executor: a start instant and a lease on the monotonic clock ------------------------
def test_monotonic_lease_format(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    assert not lease_holds(lease)
    write_atomic(lease, lease_text(time.monotonic() + 5))
    assert lease_holds(lease)
    write_atomic(lease, lease_text(time.monotonic() - 0.001))
    assert not lease_holds(lease)
    write_atomic(lease, f"{int(time.time() * 1000) + 5000}\n".encode())  # the wall form
    assert lease_holds(lease)
    write_atomic(lease, b"monotonic nonsense\n")
    assert not lease_holds(lease)


def test_the_executor_starts_by_the_monotonic_instant_not_the_wall_clock(
    tmp_path: Path,
) -> None:
    """The worker hands a run over with the broker clock's start instant on CLOCK_MONOTONIC;
    the wall clock's opinion (start_at_ms, here "now") does not start it earlier. The
    lease is on the monotonic clock too, and its end fences the run."""
    lease = tmp_path / "lease"
    executor = ProcessExecutor(lease, tmp_path / "executor.log", (10.0, 1e9, 1.0), grace_s=0.2)
    try:
        write_atomic(lease, lease_text(time.monotonic() + 2.5))
        handed = time.monotonic()
        executor.start(
            StartSpec(
                ("r", 1),
                tmp_path / "r",
                ("sleep", "30"),
                {"PATH": os.environ["PATH"]},
                60,
                0,
                int(time.time() * 1000),  # the wall clock says: now
                (0.0, 0.0, 0.0),
                start_at_mono=handed + 0.8,
            )
        )
        seen: list[object] = []

        def ended() -> bool:
            for event in executor.events():
                if isinstance(event, Started):
                    assert time.monotonic() - handed >= 0.8
                seen.append(event)
            return any(isinstance(e, Finished) for e in seen)

        eventually(ended, "the run to finish", 15, interval_s=0.02)
        started = [e for e in seen if isinstance(e, Started)]
        finished = [e for e in seen if isinstance(e, Finished)]
        assert len(started) == 1
        assert [f.outcome for f in finished] == ["fenced"]  # the monotonic lease ended
        assert time.monotonic() - handed < 2.5 + 0.2 + 2
    finally:
        executor.kill()
