"""Reservations in time: what a worker has promised, and when. Pure.

A run claimed ahead of its time (pre-dispatch, look-ahead) reserves its resources for the
interval in which it will run, from its start time (`not_before`), not from the claim:
a job every 2 s claimed 10 s ahead would otherwise hold five reservations at once and a
worker would refuse work long before it is busy.

The model has two parts:

- **running** runs hold their resources from their actual start until they end, whenever
  that is (their end is unknown, so every future moment counts them);
- **planned** runs (claimed, not started) must fit beside the running ones at any one
  moment, and hold `need x seconds` in the one-second slots
  their expected interval `[start, start + expected)` covers. A slot of one second on a
  worker of C CPUs offers C CPU-seconds (likewise memory and gpu), less what the running
  runs hold. So a hundred runs of 5 ms asking 0.1 CPU each, due in the same second, take
  0.05 CPU-seconds of a slot, not 10 CPUs: they fit, and the executor's start-time check
  (the instantaneous one: running needs plus the new one within the capacity) lets them
  start one after the other, milliseconds apart.

The expected duration comes from the caller: the worker learns each job's duration from
its runs (`DurationEstimates`); the dispatcher, which does not know durations, books its
own unconfirmed placements for `DEFAULT_EXPECTED_MS`. Expected durations are capped at
`max_span_ms`: nothing is planned further ahead than the ledger accepts early proposals (60 s), so a
longer booking would change no decision.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from schemas.spec import Resources
from streams.core.placement import CPU_EPSILON, Capacity

SLOT_MS = 1000
# A job not seen yet is booked for this long. Optimistic on purpose: runs are claimed up to
# 45 s ahead (look-ahead), long before any run of a new job has finished, and a
# pessimistic guess (a whole second) refused a third of the first minute's runs of 100 jobs
# of 0.1 CPU on 7 CPUs; each refusal costs the run its claim deadline (30 s). A guess that
# is too short costs at most a wait at the start: the executor never starts a run beside
# running ones that leave no room for it.
DEFAULT_EXPECTED_MS = 100
MAX_SPAN_MS = 120_000

Vector = tuple[float, float, float]  # cpu, memory_mb, gpu


def as_vector(need: Resources) -> Vector:
    """(cpu, memory_mb, gpu) of `need`, as floats."""
    return (float(need.cpu), float(need.memory_mb), float(need.gpu))


@dataclass
class Timeline:
    """One worker's reservations: running ones and planned ones in one-second slots."""

    capacity: Capacity
    slot_ms: int = SLOT_MS
    max_span_ms: int = MAX_SPAN_MS
    running: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    slots: dict[int, list[float]] = field(default_factory=dict)
    planned: dict[Hashable, tuple[Vector, int, int]] = field(default_factory=dict)
    active: dict[Hashable, Vector] = field(default_factory=dict)

    # -- changes ---------------------------------------------------------------------------
    def plan(self, key: Hashable, need: Resources, start_ms: int, expected_ms: int) -> None:
        """Book `need` over [start_ms, start_ms + expected_ms) (a repeat replaces)."""
        self.end(key)
        span = max(1, min(expected_ms, self.max_span_ms))
        vector = as_vector(need)
        self.planned[key] = (vector, start_ms, span)
        self._book(vector, start_ms, span, +1)

    def begin(self, key: Hashable, need: Resources) -> None:
        """The run started: it holds `need` from now until `end`."""
        self.end(key)
        vector = as_vector(need)
        self.active[key] = vector
        self.running = [r + v for r, v in zip(self.running, vector, strict=True)]

    def end(self, key: Hashable) -> None:
        """The run ended or was given up: release whatever it held."""
        booked = self.planned.pop(key, None)
        if booked is not None:
            self._book(booked[0], booked[1], booked[2], -1)
        vector = self.active.pop(key, None)
        if vector is not None:
            self.running = [max(0.0, r - v) for r, v in zip(self.running, vector, strict=True)]

    def _book(self, vector: Vector, start_ms: int, span: int, sign: int) -> None:
        for slot, share in self.slot_shares(start_ms, span):
            if sign < 0 and slot not in self.slots:
                continue  # forgotten already (forget_before)
            load = self.slots.setdefault(slot, [0.0, 0.0, 0.0])
            for i in range(3):
                load[i] += sign * vector[i] * share
            if sign < 0 and all(abs(x) < 1e-9 for x in load):
                del self.slots[slot]

    def slot_shares(self, start_ms: int, span: int) -> list[tuple[int, float]]:
        """(slot, fraction of a slot's length covered) for [start_ms, start_ms + span):
        the slots a booking touches and how much of each (booking and `fits` use it, and
        the property tests that check every slot a plan covers stays within capacity)."""
        out = []
        t, end = start_ms, start_ms + span
        while t < end:
            slot = t // self.slot_ms
            slot_end = (slot + 1) * self.slot_ms
            out.append((slot, (min(end, slot_end) - t) / self.slot_ms))
            t = slot_end
        return out

    # -- questions -------------------------------------------------------------------------
    def fits(self, need: Resources, start_ms: int, expected_ms: int) -> bool:
        """Would `need` over [start_ms, start_ms + expected_ms) stay within the capacity,
        counting the running runs as still running and the planned ones by their share?"""
        vector = as_vector(need)
        total = (float(self.capacity.cpu), float(self.capacity.memory_mb), float(self.capacity.gpu))
        # It must fit beside the running runs at any one moment (they may run on), and
        # its share must fit every slot it covers.
        if any(
            v > c - r + CPU_EPSILON for v, c, r in zip(vector, total, self.running, strict=True)
        ):
            return False
        span = max(1, min(expected_ms, self.max_span_ms))
        for slot, share in self.slot_shares(start_ms, span):
            load = self.slots.get(slot, (0.0, 0.0, 0.0))
            for i in range(3):
                room = total[i] - self.running[i]
                if load[i] + vector[i] * share > room + CPU_EPSILON:
                    return False
        return True

    def booked(self, at_ms: int) -> Capacity:
        """The planned load of the slot holding `at_ms`, as an average over the slot."""
        load = self.slots.get(at_ms // self.slot_ms, (0.0, 0.0, 0.0))
        return Capacity(load[0], round(load[1]), round(load[2]))

    def free(self, now_ms: int, horizon_ms: int) -> Capacity:
        """What is left in the busiest slot of [now_ms, now_ms + horizon_ms], after the
        running runs: what a heartbeat advertises to the dispatchers."""
        first, last = now_ms // self.slot_ms, (now_ms + horizon_ms) // self.slot_ms
        peak = [0.0, 0.0, 0.0]
        for slot, load in self.slots.items():
            if first <= slot <= last:
                peak = [max(p, x) for p, x in zip(peak, load, strict=True)]
        cap = self.capacity
        return Capacity(
            max(0.0, cap.cpu - self.running[0] - peak[0]),
            max(0, int(cap.memory_mb - self.running[1] - peak[1])),
            max(0, int(cap.gpu - self.running[2] - peak[2])),
        )

    def forget_before(self, now_ms: int) -> None:
        """Drop slots that have passed (planned runs still there are released later)."""
        first = now_ms // self.slot_ms - self.max_span_ms // self.slot_ms - 1
        for slot in [s for s in self.slots if s < first]:
            del self.slots[slot]


class DurationEstimates:
    """How long each job's runs last on this worker, learned from finished runs: the
    planned interval of a run is its job's last duration (rounded up to 10 ms), or
    `default_ms` for a job not seen yet. Bounded: the oldest jobs are forgotten."""

    def __init__(self, default_ms: int = DEFAULT_EXPECTED_MS, limit: int = 100_000) -> None:
        self.default_ms = default_ms
        self.limit = limit
        self.known: dict[str, int] = {}

    def expected_ms(self, job_id: str) -> int:
        return self.known.get(job_id, self.default_ms)

    def observe(self, job_id: str, duration_ms: int) -> None:
        self.known.pop(job_id, None)
        self.known[job_id] = max(10, duration_ms)
        if len(self.known) > self.limit:
            self.known.pop(next(iter(self.known)))
