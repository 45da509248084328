"""The broker's clock as one process sees it: a lower bound of the broker's time (pure).

Why: every machine's wall clock may be off (a node 10 minutes ahead, a worker
8 s behind), and cronlog never compares two machines' clocks for a decision. The one clock
is the broker's: `commands`, `job-log` and `heartbeats` carry LogAppendTime, the time at
which the broker appended each record (streams/topics.py).

A process learns the broker's time from the broker stamps it sees: the delivery report of
a record it produced to such a topic carries the append time, and so does every record
it consumes from one. A stamp is a *lower bound* of the broker's time at the moment it is
seen (the broker stamped it before). Carried forward on the local monotonic clock
(CLOCK_MONOTONIC: never stepped, and system-wide on Linux, so another process of the
machine, such as the worker's executor, can use the same instants), the best sample
bounds the broker's time now from below:

    broker_now >= max over samples of (stamp + (mono_now - mono_seen) * (1 - max_drift))

`max_drift` allows the two clocks to tick at slightly different rates (quartz within
100 ppm, NTP slewing within 500 ppm): the default, 1000 ppm, costs 1 ms per second a
sample is carried forward, and samples come every few seconds. The bound is late by the
time between the append and the moment the sample is taken (milliseconds), never early,
so "start when the bound reaches T" never starts before the broker's T.

Samples are reduced to one number as they come (the maximum of `stamp - rate *
mono_seen`), so the clock is O(1) in memory and time.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Final, Protocol

#: The timestamp type of a Kafka message whose time the broker set (LogAppendTime): the
#: value of librdkafka's RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME, which confluent_kafka
#: exports as TIMESTAMP_LOG_APPEND_TIME (not imported: this module knows no Kafka).
LOG_APPEND_TIME: Final = 2
DEFAULT_MAX_DRIFT: Final = 1e-3


class Clock(Protocol):
    """This machine's two clocks, as every loop reads them: passed in (the system's by
    default), so a test can hand a loop a clock that moves only when told. The names
    are the `time` module's, so `time.monotonic()` reads `clock.monotonic()`."""

    def time(self) -> float:
        """The wall clock, seconds since the epoch: for stamps and displays, never for a
        decision that two machines must agree on (that is the broker's time)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock never stepped: for intervals, timeouts and ages."""
        ...


class SystemClock:
    """The machine's clocks."""

    __slots__ = ()

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Final = SystemClock()


class ManualClock:
    """A clock that moves only when told (`advance`): both readings move together."""

    def __init__(self, wall_s: float = 1_800_000_000.0, mono_s: float = 1_000.0) -> None:
        self.wall_s = wall_s
        self.mono_s = mono_s

    def time(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.mono_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock moves forward only")
        self.wall_s += seconds
        self.mono_s += seconds


#: The job id of a clock probe: a fire proposal a node writes to job-log only for
#: the broker's stamp on its delivery report, when it has had no sample for a while (no
#: proposal of its own, no heartbeat). No job has the empty id (ids are validated), so
#: the ledger knows a probe by it and decides nothing.
PROBE_JOB_ID: Final = ""


def broker_stamp(timestamp: tuple[int, int]) -> int | None:
    """The broker's time in a message's `(type, ms)` timestamp (`msg.timestamp()`), or
    None if the broker did not set it: a producer's CreateTime is no clock to trust."""
    kind, ms = timestamp
    return ms if kind == LOG_APPEND_TIME and ms > 0 else None


class BrokerClock:
    """A lower bound of the broker's current time, from samples (stamp, mono_seen).

    Thread-safe: samples may come from delivery callbacks on several threads. Callers
    pass readings of `time.monotonic()`; a query's reading must not be older than the
    samples observed before it (take it when asking, not beforehand).
    """

    def __init__(self, max_drift: float = DEFAULT_MAX_DRIFT) -> None:
        if not 0 <= max_drift < 1:
            raise ValueError(f"max_drift must be in [0, 1), got {max_drift}")
        self.rate_ms = (1.0 - max_drift) * 1000.0  # broker ms per local second, at least
        self._base = -math.inf  # max over samples of stamp - rate_ms * mono_seen
        self._lock = threading.Lock()
        self.samples = 0

    @property
    def synced(self) -> bool:
        """Whether a sample was seen: before it, the broker's time is unknown."""
        return self.samples > 0

    def observe(self, stamp_ms: int, mono_seen: float) -> None:
        """A broker stamp, seen at local monotonic time `mono_seen` (seconds)."""
        with self._lock:
            self._base = max(self._base, stamp_ms - self.rate_ms * mono_seen)
            self.samples += 1

    def bound(self) -> tuple[float, float] | None:
        """(base, rate_ms): the broker's time at local monotonic `mono` is at least
        `base + rate_ms * mono` (None before the first sample). For another process of
        this machine that times starts by it (the executor, connectors/worker/engine.py):
        `mono_at` there is `(broker_ms - base) / rate_ms`, plus a microsecond."""
        base = self._base
        return None if base == -math.inf else (base, self.rate_ms)

    def now_ms(self, mono: float) -> int | None:
        """The broker's time at local monotonic time `mono`, from below (None before
        the first sample)."""
        base = self._base
        if base == -math.inf:
            return None
        return math.floor(base + self.rate_ms * mono)

    def mono_at(self, broker_ms: int) -> float | None:
        """The local monotonic instant from which `now_ms` is at least `broker_ms` with
        the samples seen so far (later samples can only make it earlier); None before
        the first sample. A microsecond later than the exact instant, against rounding."""
        base = self._base
        if base == -math.inf:
            return None
        return (broker_ms - base) / self.rate_ms + 1e-6
