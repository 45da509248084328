"""Reservations in time (streams/core/timeline.py): unit and property tests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.spec import Resources
from streams.core.placement import Capacity
from streams.core.timeline import DurationEstimates, Timeline

T0 = 1_800_000_000_000  # a whole second


def test_the_issue_case_short_runs_share_a_second() -> None:
    """100 jobs every 2 s asking 0.1 CPU on 4 + 2 + 1 CPUs: with their measured
    durations (a few ms) all of a second's runs fit; booked for a whole second each
    (the default before any run was seen) only 70 do."""
    need = Resources(cpu=0.1)
    for expected_ms, fitting in ((5, 100), (1000, 70)):
        workers = [Timeline(Capacity(c, 10_000, 0)) for c in (4.0, 2.0, 1.0)]
        placed = 0
        for i in range(100):
            for w in workers:
                if w.fits(need, T0, expected_ms):
                    w.plan(("run", i), need, T0, expected_ms)
                    placed += 1
                    break
        assert placed == fitting


def test_runs_claimed_ahead_hold_nothing_before_their_start() -> None:
    """A job every 2 s claimed 10 s ahead: five planned runs, and the worker is free now."""
    timeline = Timeline(Capacity(1.0, 1000, 0))
    for i in range(5):
        timeline.plan(("r", i), Resources(cpu=1.0), T0 + 2000 * (i + 1), 1000)
    assert timeline.booked(T0).cpu == 0
    assert timeline.fits(Resources(cpu=1.0), T0, 1000)
    assert not timeline.fits(Resources(cpu=0.5), T0 + 2000, 1000)


def test_a_running_run_holds_until_it_ends() -> None:
    timeline = Timeline(Capacity(2.0, 1000, 0))
    timeline.plan("long", Resources(cpu=1.5), T0, 1000)
    timeline.begin("long", Resources(cpu=1.5))
    assert timeline.booked(T0).cpu == 0  # no longer planned: running
    assert not timeline.fits(Resources(cpu=1.0), T0 + 3_600_000, 10)  # an hour later too
    assert timeline.free(T0, 60_000).cpu == 0.5
    timeline.end("long")
    assert timeline.fits(Resources(cpu=2.0), T0 + 3_600_000, 10)


def test_larger_than_the_worker_never_fits() -> None:
    assert not Timeline(Capacity(1.0, 100, 0)).fits(Resources(memory_mb=101), T0, 10)


def test_duration_estimates_learn_and_forget() -> None:
    estimates = DurationEstimates(default_ms=1000, limit=2)
    assert estimates.expected_ms("a") == 1000
    estimates.observe("a", 3)
    assert estimates.expected_ms("a") == 10  # at least 10 ms
    estimates.observe("b", 500)
    estimates.observe("c", 700)
    assert estimates.expected_ms("a") == 1000  # the oldest was forgotten
    assert estimates.expected_ms("c") == 700


bookings = st.lists(
    st.tuples(
        st.floats(0, 2, allow_nan=False),  # cpu
        st.integers(0, 512),  # memory
        st.integers(0, 5000),  # start offset ms
        st.integers(1, 5000),  # expected ms
        st.booleans(),  # begins running
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(bookings)
def test_never_over_committed_and_everything_released(items: list[tuple]) -> None:  # type: ignore[type-arg]
    cap = Capacity(4.0, 1024, 0)
    timeline = Timeline(cap)
    kept = []
    for i, (cpu, mem, offset, expected, runs) in enumerate(items):
        need = Resources(cpu=cpu, memory_mb=mem)
        if timeline.fits(need, T0 + offset, expected):
            timeline.plan(i, need, T0 + offset, expected)
            # Admitted: in every slot it covers, planned share-seconds plus what runs stay within
            # the capacity (float slack). A later start may crowd a slot: the executor's
            # start-time check is what resolves that.
            for slot, _ in timeline.slot_shares(T0 + offset, expected):
                load = timeline.slots[slot]
                assert load[0] + timeline.running[0] <= cap.cpu + 1e-6
                assert load[1] + timeline.running[1] <= cap.memory_mb + 1e-6
            if runs:
                timeline.begin(i, need)
            kept.append(i)
        free = timeline.free(T0, 60_000)
        assert 0 <= free.cpu <= cap.cpu
        assert 0 <= free.memory_mb <= cap.memory_mb
    for i in kept:
        timeline.end(i)
    assert timeline.slots == {}
    assert all(abs(x) < 1e-6 for x in timeline.running)
