"""Worker liveness: the failure detector's judgement and the order of heartbeats. Pure.

The dispatcher (its failure detector: streams/dispatcher_verdicts.py, whose docstring has
the safety argument) judges each worker on one clock, its own monotonic seconds: a
worker's beats count by when they were received, never by the stamps the worker put on
them, so no worker's clock moves a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.core.timing import TIMING


@dataclass(frozen=True, slots=True)
class Liveness:
    """The failure detector's judgement, on one clock: this dispatcher's monotonic
    seconds. A worker's beats count by when they were received, never by their stamps
    (the dispatcher's module docstring: why the verdict then always follows the
    worker's lease)."""

    suspect_after_s: float = TIMING.suspect_after_s
    dead_after_s: float = TIMING.dead_after_s

    def suspected(self, received_s: float, now_s: float) -> bool:
        """No beat received for `suspect_after_s`: no new placements there, and what was
        placed there unclaimed is placed again elsewhere."""
        return now_s - received_s > self.suspect_after_s

    def dead(self, received_s: float, reading_since_s: float, now_s: float) -> bool:
        """No beat received for `dead_after_s`, and this dispatcher has been reading
        heartbeats for at least that long (one that just started, or restarted reading,
        has not seen the beats a live worker sent meanwhile)."""
        return now_s - max(received_s, reading_since_s) > self.dead_after_s


@dataclass(frozen=True, slots=True)
class BeatMark:
    """Where a beat was in the log, and when the broker appended it (the heartbeats topic
    is stamped by the broker: LogAppendTime), never the writer's own stamp."""

    partition: int
    offset: int
    stamp_ms: int


def newer(last: BeatMark | None, beat: BeatMark) -> bool:
    """Is `beat` newer than `last`, of the same worker? Their order in the log (a worker's
    beats share its key, so a partition) where they share a partition; else the broker's
    append times. Never the stamp a beat carries: any worker principal may write a beat
    in another's name, and one stamped far in the future in another partition would
    otherwise make every real beat after it look older, and its worker dead."""
    if last is None:
        return True
    if beat.partition == last.partition:
        return beat.offset > last.offset
    return beat.stamp_ms > last.stamp_ms
