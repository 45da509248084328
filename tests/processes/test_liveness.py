"""The failure detector's judgement on one clock (streams/dispatcher_verdicts.py): a worker's beats
count by when the dispatcher received them, on its own monotonic clock, never by the
stamps the worker put on them; and the dispatcher's offsets of `dispatch` records."""

from __future__ import annotations

import pytest

from streams.core.liveness import BeatMark, Liveness, newer
from streams.core.timing import TIMING
from streams.dispatcher_kernel import Progress

LIVENESS = Liveness()  # the node's defaults (streams/core/timing.py)
LEASE_S = TIMING.lease_s  # the worker's lease: from the beat's making
HEARTBEAT_S = TIMING.heartbeat_s


def test_the_thresholds() -> None:
    assert LIVENESS.dead_after_s == 11.0
    assert LIVENESS.suspect_after_s == 4.0
    assert not LIVENESS.suspected(100.0, 104.0)
    assert LIVENESS.suspected(100.0, 104.1)
    assert not LIVENESS.dead(100.0, 0.0, 111.0)
    assert LIVENESS.dead(100.0, 0.0, 111.1)


def test_no_verdict_before_dead_after_of_reading() -> None:
    """A dispatcher that started (or restarted) reading at 1000 judges nobody before
    1000 + dead_after, even a worker whose last beat it received long before (a re-read)."""
    d = LIVENESS.dead_after_s
    assert not LIVENESS.dead(received_s=500.0, reading_since_s=1000.0, now_s=1000 + d - 0.1)
    assert LIVENESS.dead(received_s=500.0, reading_since_s=1000.0, now_s=1000 + d + 0.1)


def _simulate(
    skew_s: float, transit_s: float, reader_start_s: float = 0.0, beats: int = 20
) -> tuple[float | None, float, list[float]]:
    """A worker beats every HEARTBEAT_S for `beats` beats, its clock `skew_s` off the
    dispatcher's; each beat reaches the dispatcher `transit_s` after it is made. The
    dispatcher (reading since `reader_start_s`, when it reads the history: every beat
    made before) is asked every 0.1 s whether the worker is dead, and reads each beat as
    it arrives. Returns (the verdict's time or None, the
    end of the worker's last lease, the times the worker was suspected while beating),
    all on the dispatcher's clock."""
    made = [i * HEARTBEAT_S for i in range(beats)]  # on the dispatcher's clock
    stamps = [int((t + skew_s) * 1000) for t in made]  # what the worker writes on them
    # In order of arrival (the history arrives at once, in log order).
    arrivals = [
        (max(t + transit_s, reader_start_s), BeatMark(0, i, stamps[i])) for i, t in enumerate(made)
    ]
    last: BeatMark | None = None
    received: float | None = None
    suspected: list[float] = []
    verdict: float | None = None
    now = reader_start_s
    while now < max(made[-1], reader_start_s) + 60.0 and verdict is None:
        while arrivals and arrivals[0][0] <= now:
            _, mark = arrivals.pop(0)
            if newer(last, mark):
                last, received = mark, now
        if received is not None:
            if now < made[-1] and LIVENESS.suspected(received, now):
                suspected.append(now)
            if LIVENESS.dead(received, reader_start_s, now):
                verdict = now
        now = round(now + 0.1, 6)
    return verdict, made[-1] + LEASE_S, suspected


@pytest.mark.parametrize("skew_s", [-3600.0, -8.0, -2.0, 0.0, 2.0, 8.0, 3600.0])
@pytest.mark.parametrize("transit_s", [0.005, 0.5, 2.5])
def test_no_clock_skew_moves_the_verdict(skew_s: float, transit_s: float) -> None:
    """Whatever the worker's clock says, a beating worker is never suspected or declared
    dead, and once it stops the verdict comes after its lease ended, with the margin."""
    verdict, lease_end, suspected = _simulate(skew_s, transit_s)
    assert suspected == []
    assert verdict is not None
    assert verdict > lease_end + (LIVENESS.dead_after_s - LEASE_S) - 0.2
    # The verdict is the same as with synchronised clocks: no clock but the reader's.
    assert verdict == _simulate(0.0, transit_s)[0]


def test_a_dispatcher_started_late_waits_a_full_dead_after() -> None:
    """Started (reading the history) well after the worker stopped: the verdict comes
    dead_after after it started reading, never earlier."""
    verdict, lease_end, _ = _simulate(skew_s=0.0, transit_s=0.01, reader_start_s=100.0, beats=10)
    assert verdict is not None
    assert verdict >= 100.0 + LIVENESS.dead_after_s
    assert verdict > lease_end


def test_newer_is_log_order_within_a_partition() -> None:
    """A worker restarted with its clock set back: its new beats come later in the log
    and count, though their stamps are older."""
    old = BeatMark(partition=2, offset=10, stamp_ms=2_000_000)
    restarted = BeatMark(partition=2, offset=11, stamp_ms=1_000_000)
    assert newer(old, restarted)
    assert not newer(restarted, old)  # a replayed older beat
    assert not newer(old, old)
    assert newer(None, old)


def test_newer_across_partitions_uses_the_workers_own_stamps() -> None:
    a = BeatMark(partition=0, offset=500, stamp_ms=1_000)
    b = BeatMark(partition=1, offset=3, stamp_ms=2_000)
    assert newer(a, b)
    assert not newer(b, a)


def test_progress_commits_the_lowest_record_not_handled() -> None:
    progress = Progress()
    for offset in range(10, 15):
        progress.consumed(0, offset)
    progress.consumed(1, 7)
    assert progress.points() == {0: 10, 1: 7}
    for offset in (10, 11, 13):
        progress.handled(0, offset)
    assert progress.points() == {0: 12, 1: 7}  # 12 still waits for room
    progress.handled(0, 12)
    progress.handled(0, 14)
    progress.handled(1, 7)
    assert progress.points() == {0: 15, 1: 8}
    progress.handled(0, 99)  # a stray report changes nothing
    progress.forget(1)
    assert progress.points() == {0: 15}
